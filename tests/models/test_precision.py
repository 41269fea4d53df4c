"""Mixed precision (fp32 master weights under bf16/fp16 compute), chunked logits and micro-batches by
tokens: each changes memory or speed, never the update beyond compute noise."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from semrl.cli import main
from semrl.data import Problem
from semrl.models.precision import Precision
from semrl.rollout.batch import RolloutBatch
from semrl.rollout.engines import Generation
from semrl.rollout.sequences import make_sequence_batch
from semrl.runtime.checkpoint import load_trainer_state
from semrl.runtime.trainer import Trainer
from semrl.update.forward import response_logprobs
from semrl.update.micro_batches import micro_batches
from tests.helpers import final_weights, read_metrics, tiny_run_config


def _one_update(model_dir, param_dtype: torch.dtype, precision: Precision) -> dict[str, torch.Tensor]:
    """Weight deltas (fp32) of one AdamW step at lr 1e-6 on a fixed batch and advantages."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=param_dtype)
    before = {k: v.detach().float().clone() for k, v in model.named_parameters()}
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (5, 8, 3, 6)]
    responses = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (9, 4, 12, 7)]
    batch = make_sequence_batch(prompts, responses, pad_token_id=0)
    adv = torch.randn(batch.response_mask.shape, generator=gen)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    with precision.autocast(model):
        logp, _ = response_logprobs(model, batch, with_entropy=False, chunk_size=7)
    (-(logp * adv * batch.response_mask).sum() / batch.response_mask.sum()).backward()
    optimizer.step()
    return {k: v.detach().float() - before[k] for k, v in model.named_parameters()}


def test_master_weights_keep_updates_that_bf16_parameters_lose(tiny_model_dir):
    bf16, fp32 = torch.bfloat16, torch.float32
    reference = _one_update(tiny_model_dir, fp32, Precision(fp32, fp32))
    mixed = _one_update(tiny_model_dir, fp32, Precision(bf16, fp32))
    pure = _one_update(tiny_model_dir, bf16, Precision(bf16, bf16))
    ref = torch.cat([d.flatten() for d in reference.values()])
    mix = torch.cat([d.flatten() for d in mixed.values()])
    low = torch.cat([d.flatten() for d in pure.values()])
    moved = ref != 0
    assert moved.float().mean() > 0.9  # AdamW's first step moves nearly every weight by ~lr
    # bf16 compute over fp32 weights: the fp32 update, up to the gradient signs that bf16 noise flips
    assert (torch.sign(mix[moved]) == torch.sign(ref[moved])).float().mean() > 0.9
    assert (mix - ref).abs().sum() / ref.abs().sum() < 0.2
    # bf16 weights: a 1e-6 step rounds back to the same number for almost every weight
    assert (low != 0).float().mean() < 0.1
    assert low.abs().sum() / ref.abs().sum() < 0.2


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_run_keeps_fp32_weights_and_resumes_exactly(
    digit_model_dir, seven_task, tmp_path, dtype
):
    args = [f"model.dtype={dtype}", "trainer.lr=1e-4"]
    full = tmp_path / "full"
    Trainer(tiny_run_config(digit_model_dir, seven_task, full, "trainer.steps=3", *args)).train()
    part = tmp_path / "part"
    Trainer(tiny_run_config(digit_model_dir, seven_task, part, "trainer.steps=2", *args)).train()
    assert main(["train", "--resume", str(part), "trainer.steps=3", "logging.progress=false"]) == 0

    a = final_weights(full, 3)
    b = final_weights(part, 3)
    start = load_file(digit_model_dir / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in a.values())  # the master weights, not a bf16 copy
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert max((a[k] - start[k]).abs().max().item() for k in a) > 1e-5
    assert [m["loss"] for m in read_metrics(full)] == [m["loss"] for m in read_metrics(part)]
    state = load_trainer_state(full / "checkpoints" / "step-000003")
    if dtype == "float16":  # the dynamic loss scale is part of the exact resume
        assert state["grad_scaler"]["scale"] > 1.0
    else:
        assert not state["grad_scaler"]
    assert all(v["exp_avg"].dtype == torch.float32 for v in state["optimizer"]["state"].values())


def test_pure_bf16_parameters_are_a_separate_setting(digit_model_dir, seven_task, tmp_path):
    out = tmp_path / "pure"
    cfg = tiny_run_config(
        digit_model_dir,
        seven_task,
        out,
        "trainer.steps=1",
        "model.dtype=bfloat16",
        "model.master_weights=false",
    )
    Trainer(cfg).train()
    weights = load_file(out / "checkpoints" / "step-000001" / "model.safetensors")
    assert all(t.dtype == torch.bfloat16 for t in weights.values())


def _weights_after(model_dir, task, out, *extra):
    Trainer(
        tiny_run_config(
            model_dir,
            task,
            out,
            "trainer.steps=2",
            "trainer.ppo_epochs=2",
            "trainer.mini_batch_size=16",
            *extra,
        )
    ).train()
    return load_file(out / "checkpoints" / "step-000002" / "model.safetensors"), read_metrics(out)


@pytest.mark.parametrize("packing", ["none", "tree"])
def test_token_budget_and_logit_chunks_give_the_same_training(digit_model_dir, seven_task, tmp_path, packing):
    """Micro-batches by a token budget, a 3-token logits chunk and gradient checkpointing change how
    the work is split and what is kept, not the update: the same losses, gradient norms and weights
    as 16-row micro-batches."""
    common = [f"trainer.packing={packing}", "algorithm.method=grpo"]
    base, base_metrics = _weights_after(digit_model_dir, seven_task, tmp_path / "rows", *common)
    other, other_metrics = _weights_after(
        digit_model_dir,
        seven_task,
        tmp_path / "tokens",
        *common,
        "trainer.micro_batch_tokens=90",
        "trainer.logits_chunk_size=3",
        "model.gradient_checkpointing=true",
    )
    for m1, m2 in zip(base_metrics, other_metrics, strict=True):
        assert m1["reward"] == m2["reward"]
        # CPU: equal to 1e-6; CUDA kernels picked by shape differ by ~3e-4 relative
        assert m1["loss"] == pytest.approx(m2["loss"], rel=1e-3, abs=1e-6)
        assert m1["actor/grad_norm"] == pytest.approx(m2["actor/grad_norm"], rel=1e-3)
    # Adam divides by |grad|: float rounding of near-zero gradients moves a weight by up to ~lr x 1e-2
    assert all(torch.allclose(base[k], other[k], atol=1e-4) for k in base)


def _fake_batch(gen: torch.Generator, groups: int, group_size: int) -> RolloutBatch:
    prompts, generations = [], []
    for _ in range(groups):
        prompt = torch.randint(
            5, 50, (int(torch.randint(1, 30, (1,), generator=gen)),), generator=gen
        ).tolist()
        for _ in range(group_size):
            n = int(torch.randint(0, 40, (1,), generator=gen))
            prompts.append(prompt)
            tokens = torch.randint(5, 50, (n,), generator=gen)
            generations.append(
                Generation(tokens, torch.zeros(n), torch.zeros(n, 1), tokens[:, None], None, True)
            )
    problems = [Problem(f"p{g}", "q", "1") for g in range(groups) for _ in range(group_size)]
    return RolloutBatch(problems, prompts, generations, ["x"] * len(generations), group_size, pad_token_id=0)


@pytest.mark.parametrize("seed", range(8))
def test_micro_batches_by_tokens_cover_every_row_within_the_budget(seed):
    gen = torch.Generator().manual_seed(seed)
    group_size = int(torch.randint(1, 5, (1,), generator=gen))
    batch = _fake_batch(gen, int(torch.randint(1, 6, (1,), generator=gen)), group_size)
    total = len(batch.generations)
    rows = (
        torch.randperm(total // group_size, generator=gen)[:, None] * group_size + torch.arange(group_size)
    ).flatten()
    budget = int(torch.randint(1, 200, (1,), generator=gen))
    for packed in (False, True):
        plan = micro_batches(batch, rows, 4, budget, packed)
        positions = torch.cat(plan).tolist()
        assert sorted(positions) == list(range(total))  # every row once
        for mb in plan:
            chosen = rows[mb]
            if packed:  # whole groups
                groups = {int(r) // group_size for r in chosen}
                assert len(chosen) == group_size * len(groups)
                units = [[int(r) for r in chosen if int(r) // group_size == g] for g in groups]
            else:
                units = [[int(r)] for r in chosen]
            widths = [
                len(batch.prompt_ids[u[0]]) + sum(len(batch.generations[r].token_ids) for r in u)
                for u in units
            ]
            assert len(units) == 1 or len(units) * max(widths) <= budget
        # every process runs as many micro-batches as the one that needs the most
        most = len(plan) + 2
        if most <= len(rows) // (group_size if packed else 1):
            agreed = micro_batches(batch, rows, 4, budget, packed, count=most)
            assert len(agreed) == most and sorted(torch.cat(agreed).tolist()) == list(range(total))
    plan = micro_batches(batch, rows, 3, None, False)  # no budget: fixed rows, in order
    assert torch.cat(plan).tolist() == list(range(total)) and all(len(mb) <= 3 for mb in plan)


def test_bad_precision_and_budget_options_are_named(digit_model_dir, seven_task, tmp_path):
    from semrl.config.sections import ConfigError

    with pytest.raises(ConfigError, match="trainer.logits_chunk_size"):
        tiny_run_config(digit_model_dir, seven_task, tmp_path / "x", "trainer.logits_chunk_size=0")
    with pytest.raises(ConfigError, match="trainer.micro_batch_tokens"):
        tiny_run_config(digit_model_dir, seven_task, tmp_path / "x", "trainer.micro_batch_tokens=0")
    with pytest.raises(ConfigError, match="model.dtype"):
        tiny_run_config(digit_model_dir, seven_task, tmp_path / "x", "model.dtype=float8")
