"""Slow tests with the real SmolLM2-135M-Instruct (not in CI's default run: -m slow)."""

import pytest
import torch

from semrl.models.loading import load_model, load_tokenizer, resolve_model_path

pytestmark = pytest.mark.slow


def test_alias_converts_once_and_generates_a_boxed_sum():
    from semrl.data import build_prompt_ids
    from semrl.rollout.engines import GenerationRequest, SamplingParams
    from semrl.rollout.engines.hf import HFEngine

    path = resolve_model_path("smollm2-135m")
    assert resolve_model_path("smollm2-135m") == path  # cached
    tok, model = load_tokenizer(path), load_model(path)
    assert model.config.num_hidden_layers == 30 and model.config.vocab_size == 49152
    engine = HFEngine(model, [tok.eos_token_id], tok.pad_token_id)
    ids = build_prompt_ids(tok, "What is 2 + 3?", "Put your final answer within \\boxed{}.")
    (gen,) = engine.generate([GenerationRequest(ids)], SamplingParams(temperature=0.0, max_new_tokens=64))
    assert len(gen.token_ids) > 0 and torch.isfinite(gen.logprobs).all()
