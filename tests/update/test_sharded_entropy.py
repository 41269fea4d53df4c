"""Under trainer.fsdp a rollout cannot run the entropy forward (the weights are sharded over the
processes): a chain that comes without its entropy record stops the run with the fix, instead of a
forward that waits for processes that never join it."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from semrl.core.distributed import shard_model
from semrl.errors import TrainingError
from semrl.rollout.engines.base import Generation
from semrl.update.row_logprobs import with_sampling_entropy


def _generation(ids: list[int], entropy: torch.Tensor | None) -> Generation:
    n = len(ids)
    return Generation(
        torch.tensor(ids),
        torch.zeros(n),
        torch.zeros(n, 1),
        torch.zeros(n, 1, dtype=torch.long),
        entropy,
        True,
    )


def test_a_missing_entropy_record_under_fsdp_is_refused_with_the_fix(tiny_model_dir, monkeypatch):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    recorded = _generation([5, 6, 7], torch.ones(3))
    missing = _generation([5, 6], None)
    # unsharded: the forward fills what is missing and keeps what was recorded
    filled = with_sampling_entropy(model, [[1, 2], [1, 2]], [recorded, missing], temperature=1.0)
    assert filled[0] is recorded and filled[1].entropy is not None and filled[1].entropy.shape == (2,)
    ours = not dist.is_initialized()  # another test of this worker may have left its group of one
    if ours:
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(29_600 + os.getpid() % 1000))
        dist.init_process_group("gloo", rank=0, world_size=1)
    assert dist.get_world_size() == 1
    try:
        shard_model(model)
        assert with_sampling_entropy(model, [[1, 2]], [recorded], temperature=1.0) == [recorded]
        with pytest.raises(TrainingError, match="1 sampled chains came without their entropy record") as err:
            with_sampling_entropy(model, [[1, 2], [1, 2]], [recorded, missing], temperature=1.0)
        assert "rollout.vllm_sampler_entropy=true" in str(err.value)
    finally:
        if ours:
            dist.destroy_process_group()
