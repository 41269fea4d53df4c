"""Unbiased pass@k against a direct combinatorial computation, maj@k ties, summaries."""

from math import comb

import pytest

from semrl.data import PromptFormat
from semrl.evaluation import maj_at_k, markdown_table, pass_at_k, report_ks, summarize_by, summarize_records
from semrl.reward import Judge


@pytest.mark.parametrize("n", [1, 2, 5, 8, 16])
def test_pass_at_k_matches_combinatorics(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            direct = 1.0 - comb(n - c, k) / comb(n, k)  # comb(a, k) = 0 when a < k
            assert pass_at_k(n, c, k) == pytest.approx(direct, abs=1e-12)


def test_pass_at_k_edge_cases():
    assert pass_at_k(8, 0, 8) == 0.0
    assert pass_at_k(8, 1, 8) == 1.0  # n - c < k
    assert pass_at_k(8, 2, 1) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def _record(correct, answers, clusters=None, level=None, lengths=None):
    n = len(correct)
    clusters = clusters if clusters is not None else list(range(n))
    lengths = lengths if lengths is not None else [10] * n
    return {
        "id": f"p{len(answers)}{level}",
        "gold": "1",
        "level": level,
        "subject": None,
        "samples": [
            {
                "response": "",
                "answer": a,
                "correct": c,
                "length": ln,
                "truncated": False,
                "timed_out": False,
                "cluster": k,
            }
            for c, a, k, ln in zip(correct, answers, clusters, lengths, strict=True)
        ],
    }


def test_maj_at_k_majority_and_ties():
    # answers: 1 (correct), 2, 2, 1 -> first 3: '2' wins; first 4: tie 2-2 split -> 0.5
    clusters, correct, answered = [0, 1, 1, 0], [True, False, False, True], [True] * 4
    assert maj_at_k(clusters, correct, answered, 1) == 1.0
    assert maj_at_k(clusters, correct, answered, 2) == 0.5  # 1-1 tie between a right and a wrong class
    assert maj_at_k(clusters, correct, answered, 3) == 0.0
    assert maj_at_k(clusters, correct, answered, 4) == 0.5
    # three-way tie with one correct class -> 1/3
    assert maj_at_k([0, 1, 2], [True, False, False], [True] * 3, 3) == pytest.approx(1 / 3)
    # samples without an answer do not vote, even when they are the most frequent "class"
    assert maj_at_k([0, 1, 2, 3], [False, False, False, True], [False, False, False, True], 4) == 1.0
    assert maj_at_k([0, 1], [False, False], [False, False], 2) == 0.0
    with pytest.raises(ValueError):
        maj_at_k([0], [True], [True], 2)


def test_summarize_records():
    records = [
        _record(
            [True, False, False, False], ["1", "2", "2", None], [0, 1, 1, 2], level=1, lengths=[4, 8, 8, 12]
        ),
        _record([True, True, True, True], ["1", "1.0", "1", "1"], [0, 0, 0, 0], level=2),
    ]
    out = summarize_records(records)
    assert out["problems"] == 2
    assert out["mean@4"] == pytest.approx((0.25 + 1.0) / 2)
    assert out["pass@1"] == pytest.approx(out["mean@4"])
    assert out["pass@2"] == pytest.approx((0.5 + 1.0) / 2)
    assert out["pass@3"] == pytest.approx((0.75 + 1.0) / 2)
    assert out["pass@4"] == 1.0
    assert out["maj@4"] == pytest.approx((0.0 + 1.0) / 2)  # '2' beats '1' 2-1 in the first problem
    assert out["maj@1"] == 1.0
    assert out["distinct_answers"] == pytest.approx((2 + 1) / 2)  # None is not an answer
    assert out["response_length"] == pytest.approx((4 + 8 + 8 + 12 + 40) / 8)
    assert out["response_length/correct"] == pytest.approx((4 + 40) / 5)
    by_level = summarize_by(records, "level")
    assert list(by_level) == ["1", "2"] and by_level["2"]["mean@4"] == 1.0
    assert summarize_by(records, "subject") == {}
    with pytest.raises(ValueError, match="same"):
        summarize_records([records[0], _record([True], ["1"])])


def test_report_ks_and_markdown():
    assert report_ks(8) == [1, 2, 4, 8] and report_ks(6) == [1, 2, 4, 6] and report_ks(1) == [1]
    records = [_record([True, False], ["1", "2"], level=1), _record([False, False], ["3", None], level=3)]
    summary = {
        "settings": {"num_samples": 2},
        "metrics": summarize_records(records),
        "by_level": summarize_by(records, "level"),
        "by_subject": {},
    }
    table = markdown_table({"toy": summary})
    assert "| dataset | problems | mean@2 | pass@1 | pass@2 | maj@2 |" in table
    assert "| toy | 2 | 0.250 | 0.250 | 0.500 |" in table
    assert "**toy by level**" in table and "| 3 | 1 | 0.000 |" in table


def _cached_evaluation(model_dir, cache, problems, **overrides):
    """evaluate_held_out at step 0 with ``logging.eval_cache``; returns (metrics, tokens sampled)."""
    import torch

    from semrl.config.load import load_config
    from semrl.core.distributed import ProcessGroup
    from semrl.evaluation import evaluate_held_out
    from semrl.models.loading import load_model, load_tokenizer
    from semrl.reward import VerifierPool
    from semrl.rollout.engines.hf import HFEngine

    torch.manual_seed(0)
    values = {
        "model.name": str(model_dir),
        "logging.eval_cache": str(cache),
        "logging.eval_samples": 2,
        "rollout.max_new_tokens": 4,
        "logging.progress": False,
        **overrides,
    }
    cfg = load_config(None, [f"{k}={v}" for k, v in values.items()])
    tok = load_tokenizer(str(model_dir))
    engine = HFEngine(load_model(str(model_dir)), [tok.eos_token_id], tok.pad_token_id, 16)
    with VerifierPool(1, 5.0) as pool:
        metrics = evaluate_held_out(engine, tok, pool, problems, cfg, ProcessGroup(), split="eval", step=0)
    return metrics, engine.generated_tokens


def test_base_evaluation_cache_is_keyed_on_the_problems(tiny_model_dir, tmp_path):
    """Same count, same level, other draws: the cache must miss; the same problems must hit."""
    from dataclasses import replace

    from semrl.data.arithmetic import make_arithmetic_problems

    cache = tmp_path / "cache"
    first = make_arithmetic_problems(4, [1], seed=0)
    # other draws under the same ids: only the texts and answers differ
    other = [
        replace(p, id=q.id) for p, q in zip(make_arithmetic_problems(4, [1], seed=1), first, strict=True)
    ]
    assert [p.problem for p in first] != [p.problem for p in other]
    metrics, sampled = _cached_evaluation(tiny_model_dir, cache, first)
    assert sampled > 0 and len(list(cache.glob("eval-*.jsonl"))) == 1
    again, sampled = _cached_evaluation(tiny_model_dir, cache, first)
    assert sampled == 0 and again == metrics  # a hit samples nothing
    _, sampled = _cached_evaluation(tiny_model_dir, cache, other)
    assert sampled > 0 and len(list(cache.glob("eval-*.jsonl"))) == 2
    # a sampling setting the key holds: a miss too
    _, sampled = _cached_evaluation(tiny_model_dir, cache, first, **{"rollout.top_k": 5})
    assert sampled > 0 and len(list(cache.glob("eval-*.jsonl"))) == 3


def test_evaluation_judges_with_the_configured_correctness_function(digit_model_dir, seven_task, tmp_path):
    """reward.correctness names a user function: every held-out sample's ``correct`` is that
    function's verdict (checked by hand on the records), not math-verify's."""
    import json

    import torch

    from semrl.config.load import load_config
    from semrl.core.distributed import ProcessGroup
    from semrl.data import load_problems
    from semrl.evaluation import evaluate_held_out, records_path
    from semrl.models.loading import load_model, load_tokenizer
    from semrl.reward import VerifierPool, reward_functions
    from semrl.rollout.engines.hf import HFEngine
    from tests.helpers import DIGIT_SYSTEM_PROMPT

    judge = tmp_path / "judge.py"
    judge.write_text(
        "def even_length(prompts, completions, completion_ids, **kwargs):\n"
        "    return [1.0 if len(ids) % 2 == 0 else 0.0 for ids in completion_ids]\n"
    )
    name = f"{judge}:even_length"
    cfg = load_config(
        None,
        [
            f"model.name={digit_model_dir}",
            f"data.system_prompt={DIGIT_SYSTEM_PROMPT}",
            "logging.eval_samples=8",
            "rollout.max_new_tokens=6",
            "logging.progress=false",
            f"reward.functions=[math, '{name}']",
            f"reward.correctness='{name}'",
        ],
    )
    problems = load_problems(seven_task)[0][:6]
    tok = load_tokenizer(str(digit_model_dir))
    engine = HFEngine(load_model(str(digit_model_dir)), [tok.eos_token_id], tok.pad_token_id, 16)
    functions = reward_functions(cfg.reward.functions, correctness=cfg.reward.correctness)
    torch.manual_seed(0)
    with VerifierPool(1, 5.0, functions.pool_functions) as pool:
        metrics = evaluate_held_out(
            engine, tok, pool, problems, cfg, ProcessGroup(), run_dir=tmp_path, functions=functions
        )
        records = [json.loads(line) for line in records_path(tmp_path, "eval", 0).read_text().splitlines()]
        samples = [s for r in records for s in r["samples"]]
        assert [s["correct"] for s in samples] == [s["length"] % 2 == 0 for s in samples]
        by_math = [
            pool.verify_many([(r["gold"], s["answer"])])[0].correct for r in records for s in r["samples"]
        ]
    assert by_math != [s["correct"] for s in samples]  # the two judges disagree here: the test can tell
    assert metrics["eval/mean@8"] == sum(s["correct"] for s in samples) / len(samples)
    with pytest.raises(Exception, match="reward.correctness.*not in reward.functions"):
        load_config(None, ["reward.correctness=math", f"reward.functions=['{name}']"])


@pytest.mark.parametrize("kind", ["hf", "vllm"])
def test_continuous_batched_evaluation_samples_what_the_chunked_path_samples(digit32_model_dir, kind):
    """Every request in flight at once (vllm refills its 64 slots; hf runs chunks) gives the samples of
    chunks of 8 drawn from the same generator, on responses of widely different lengths; progress
    counts each sample once, as it stops (issue 64, item 4), and every problem is judged as its own
    batch was."""
    import torch

    from semrl.data import Problem, build_prompt_ids
    from semrl.evaluation import sample_and_verify
    from semrl.models.loading import load_model, load_tokenizer
    from semrl.reward import VerifierPool, score_responses
    from semrl.rollout.engines import GenerationRequest, SamplingParams, build_engine
    from tests.helpers import DIGIT_SYSTEM_PROMPT, eager_vllm, vllm_or_skip

    if kind == "vllm":
        vllm_or_skip()
    tok, model = load_tokenizer(str(digit32_model_dir)), load_model(str(digit32_model_dir))
    # vllm: the worker's one engine (64 slots, tests/helpers.tiny_vllm_engine's); hf: chunks of 8
    engine = build_engine(
        kind, model, tok, 64 if kind == "vllm" else 8, 512, logprobs_top_k=20, vllm_options=eager_vllm()
    )
    # 72 requests: more than vllm's 64 slots, so that finished ones are refilled
    problems = [Problem(f"p{i}", f"Pick a number ({i}).", str(i % 10)) for i in range(9)]
    params = SamplingParams(temperature=2.0, top_p=1.0, max_new_tokens=24, logprobs_top_k=0)
    counts: list[tuple[int, int]] = []  # (samples finished, the engine's forward steps so far)
    with VerifierPool(1, 5.0) as pool:
        sampled = sample_and_verify(
            engine,
            tok,
            problems,
            params,
            8,
            PromptFormat(DIGIT_SYSTEM_PROMPT),
            Judge(pool),
            torch.Generator().manual_seed(3),
            lambda n: counts.append((n, engine.cost.engine_steps)),
        )
        requests = [
            GenerationRequest(build_prompt_ids(tok, p.problem, DIGIT_SYSTEM_PROMPT))
            for p in problems
            for _ in range(8)
        ]
        chunked, generator = [], torch.Generator().manual_seed(3)
        for start in range(0, len(requests), 8):
            chunked += engine.generate(requests[start : start + 8], params, generator)
        texts = [tok.decode(g.token_ids, skip_special_tokens=True) for g in chunked]
        verdicts = score_responses(
            pool, texts, [p.answer for p in problems for _ in range(8)], final_number_fallback=True
        )
    lengths = sorted(len(g.token_ids) for g in chunked)
    assert lengths[0] <= 3 and lengths[-1] == 24  # EOS after a digit, and truncated rambling
    assert [s.problem.id for s in sampled] == [p.id for p in problems]
    continuous = [g for s in sampled for g in s.generations]
    assert [g.token_ids.tolist() for g in continuous] == [g.token_ids.tolist() for g in chunked]
    assert [r.correct for s in sampled for r in s.rewards] == [v.correct for v in verdicts]
    assert [t for s in sampled for t in s.texts] == texts
    # every sample counted once, as it finished: within a chunk too, not when the chunk returns
    assert sum(n for n, _ in counts) == len(requests)
    assert len({steps for _, steps in counts}) > len(requests) // 8


def test_base_evaluation_cache_misses_when_any_setting_that_decides_the_samples_changes(
    tiny_model_dir, digit_model_dir, tmp_path
):
    """Model, seed, problems, number of samples, evaluation temperature (and the training temperature
    it defaults to), top-p and maximum new tokens: each changed alone samples a fresh evaluation;
    the unchanged settings hit the cache and sample nothing."""
    from semrl.data.arithmetic import make_arithmetic_problems

    cache = tmp_path / "cache"
    problems = make_arithmetic_problems(3, [1], seed=0)
    _, sampled = _cached_evaluation(tiny_model_dir, cache, problems)
    assert sampled > 0
    changes = [
        ("model", digit_model_dir, problems, {}),
        ("seed", tiny_model_dir, problems, {"trainer.seed": 1}),
        ("problems", tiny_model_dir, make_arithmetic_problems(4, [1], seed=0), {}),
        ("samples", tiny_model_dir, problems, {"logging.eval_samples": 3}),
        ("eval temperature", tiny_model_dir, problems, {"logging.eval_temperature": 0.5}),
        ("training temperature", tiny_model_dir, problems, {"rollout.temperature": 0.7}),
        ("top-p", tiny_model_dir, problems, {"rollout.top_p": 0.9}),
        ("max new tokens", tiny_model_dir, problems, {"rollout.max_new_tokens": 5}),
    ]
    for i, (name, model, probs, overrides) in enumerate(changes, start=2):
        _, sampled = _cached_evaluation(model, cache, probs, **overrides)
        assert sampled > 0 and len(list(cache.glob("eval-*.jsonl"))) == i, name
    _, sampled = _cached_evaluation(tiny_model_dir, cache, problems)
    assert sampled == 0
