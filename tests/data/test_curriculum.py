"""SENT curriculum: scoring files (resumable), stage splits, and staged training on a tiny model."""

import json

import pytest
import torch

from semrl.cli import main
from semrl.config.load import load_config
from semrl.data import DataError, Problem, PromptFormat, load_problems
from semrl.data.curriculum import curriculum_stages, load_curriculum
from semrl.evaluation.difficulty import score_problems
from semrl.models.loading import load_model, load_tokenizer
from semrl.reward import Judge, VerifierPool
from semrl.rollout.engines import SamplingParams
from semrl.rollout.engines.hf import HFEngine
from semrl.runtime.trainer import Trainer
from tests.helpers import DIGIT_SYSTEM_PROMPT


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_stages_sort_easy_first_and_split_evenly(tmp_path):
    scored = [(Problem(f"p{i}", f"q{i}", "1"), h) for i, h in enumerate([0.9, 0.0, 0.5, 0.0, 2.0])]
    stages = curriculum_stages(scored, 2)
    assert [[p.id for p in s] for s in stages] == [["p1", "p3"], ["p2", "p0", "p4"]]
    assert [len(s) for s in curriculum_stages(scored, 3)] == [2, 1, 2]
    with pytest.raises(DataError, match="at least 6"):
        curriculum_stages(scored, 6)


def test_load_curriculum_names_bad_rows(tmp_path):
    good = _write(
        tmp_path / "c.jsonl", [{"id": "a", "problem": "1+1", "answer": "2", "semantic_entropy": 0.3}]
    )
    assert [(p.id, h) for p, h in load_curriculum(good)] == [("a", 0.3)]
    with pytest.raises(DataError, match="semrl curriculum score --output"):
        load_curriculum(tmp_path / "missing.jsonl")
    bad = _write(tmp_path / "b.jsonl", [{"id": "a", "problem": "1+1", "answer": "2"}])
    with pytest.raises(
        DataError, match=r"b.jsonl: problem 'a': field 'semantic_entropy'.*semrl curriculum score"
    ):
        load_curriculum(bad)


def test_score_problems_is_resumable(digit_model_dir, tmp_path):
    tok = load_tokenizer(str(digit_model_dir))
    engine = HFEngine(load_model(str(digit_model_dir)), [tok.eos_token_id], tok.pad_token_id, 16)
    problems = [Problem(f"d{i}", f"Pick a number ({i}).", "7") for i in range(5)]
    out = tmp_path / "scores.jsonl"
    params = SamplingParams(max_new_tokens=4)
    with VerifierPool(1, 5.0) as pool:
        n = score_problems(
            engine,
            tok,
            Judge(pool),
            problems[:3],
            out,
            params,
            4,
            PromptFormat(DIGIT_SYSTEM_PROMPT),
            generator=torch.Generator().manual_seed(0),
        )
        assert n == 3
        n = score_problems(
            engine,
            tok,
            Judge(pool),
            problems,
            out,
            params,
            4,
            PromptFormat(DIGIT_SYSTEM_PROMPT),
            generator=torch.Generator().manual_seed(0),
        )
        assert n == 2  # the first three are skipped
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["d0", "d1", "d2", "d3", "d4"]
    for r in rows:
        assert 0.0 <= r["semantic_entropy"] <= torch.log(torch.tensor(4.0)).item() + 1e-6
        assert 1 <= r["num_clusters"] <= 4 and 0 <= r["accuracy"] <= 1
        assert (r["num_clusters"] == 1) == (r["semantic_entropy"] == 0)
    assert len(load_problems(out)[0]) == 5  # the scores file is itself a dataset
    out.write_text(out.read_text() + "not json\n")
    with VerifierPool(1, 5.0) as pool, pytest.raises(DataError, match="scores.jsonl:6"):
        score_problems(engine, tok, Judge(pool), problems, out, params, 4)


def test_two_stage_curriculum_trains_and_switches(digit_model_dir, tmp_path):
    rows = [
        {"id": f"s{i}", "problem": f"Pick a number ({i}).", "answer": "7", "semantic_entropy": float(i % 5)}
        for i in range(40)
    ]
    curriculum = _write(tmp_path / "curr.jsonl", rows)
    out = tmp_path / "run"
    cfg = load_config(
        None,
        [
            f"model.name={digit_model_dir}",
            "data.train=arithmetic",
            "data.eval=null",
            f"data.curriculum={curriculum}",
            f"data.system_prompt={DIGIT_SYSTEM_PROMPT}",
            "rollout.group_size=4",
            "rollout.prompts_per_step=4",
            "rollout.max_new_tokens=4",
            "trainer.steps=4",
            "trainer.micro_batch_size=16",
            "algorithm.method=sent",
            "algorithm.kl_coef=0.001",
            "reward.num_workers=1",
            f"logging.output_dir={out}",
            "logging.progress=false",
        ],
    )
    trainer = Trainer(cfg)
    assert [len(s) for s in trainer.curriculum.stages] == [20, 20]
    assert (
        max(
            float(r["semantic_entropy"])
            for r in rows
            if r["id"] in {p.id for p in trainer.curriculum.stages[0]}
        )
        <= 2
    )
    stage_one_optimizer = trainer.run.optim.optimizer
    trainer.train()
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["curriculum/stage"] for m in metrics] == [1, 1, 2, 2]
    assert trainer.run.optim.optimizer is not stage_one_optimizer  # stage 2 started with a fresh optimizer
    assert (out / "curriculum" / "stage-1").is_dir()  # the stage-2 reference (stage 1's final weights)
    # stage-2 problems only in the last two steps' samples
    stage2 = {p.id for p in trainer.curriculum.stages[1]}
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert all((s["problem_id"] in stage2) == (s["step"] > 2) for s in samples)


def test_curriculum_score_cli(digit_model_dir, tmp_path, capsys):
    out = tmp_path / "s.jsonl"
    code = main(
        [
            "curriculum",
            "score",
            "--model",
            str(digit_model_dir),
            "--limit",
            "3",
            "--n",
            "2",
            "--max-new-tokens",
            "4",
            "--output",
            str(out),
            "--quiet",
        ]
    )
    assert code == 0 and "3 problems scored" in capsys.readouterr().out
    assert len(out.read_text().splitlines()) == 3


def test_resume_inside_the_second_stage_is_exact(digit_model_dir, tmp_path):
    import shutil

    import torch

    from semrl.models.loading import load_model
    from semrl.runtime.checkpoint import latest_checkpoint

    rows = [
        {"id": f"s{i}", "problem": f"Pick a number ({i}).", "answer": "7", "semantic_entropy": float(i % 5)}
        for i in range(40)
    ]
    curriculum = _write(tmp_path / "curr.jsonl", rows)

    def cfg(out):
        return load_config(
            None,
            [
                f"model.name={digit_model_dir}",
                "data.train=arithmetic",
                "data.eval=null",
                f"data.curriculum={curriculum}",
                f"data.system_prompt={DIGIT_SYSTEM_PROMPT}",
                "rollout.group_size=4",
                "rollout.prompts_per_step=4",
                "rollout.max_new_tokens=4",
                "trainer.steps=4",
                "trainer.micro_batch_size=16",
                "trainer.lr=1e-2",
                "algorithm.method=sent",
                "algorithm.kl_coef=0.01",
                "reward.num_workers=1",
                "logging.save_every=1",
                f"logging.output_dir={out}",
                "logging.progress=false",
                "logging.report_to=[]",
            ],
        )

    whole = tmp_path / "whole"
    Trainer(cfg(whole)).train()
    crashed = tmp_path / "crashed"
    shutil.copytree(whole, crashed)
    shutil.rmtree(latest_checkpoint(crashed))  # as if killed during step 4, in stage 2
    assert latest_checkpoint(crashed).name.endswith("3")
    resumed = Trainer(cfg(crashed), resume=True)
    assert resumed.curriculum.stage == 1 and resumed.step == 3
    resumed.train()
    a = load_model(str(latest_checkpoint(whole)))
    b = load_model(str(latest_checkpoint(crashed)))
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), name
    metrics = [json.loads(line) for line in (crashed / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
