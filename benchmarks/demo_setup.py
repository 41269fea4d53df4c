"""What the benchmarks that sample with a config's engine share: the engine of a given kind built
from the config's rollout settings, warmed up on one prompt when one is given. Import it from a
script in this folder (``python benchmarks/x.py`` puts the folder on ``sys.path``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from semrl.config.sections import Config
from semrl.rollout.engines import Engine, GenerationRequest, build_engine, sampling_params


def config_engine(
    kind: str,
    model: Any,
    tokenizer: Any,
    cfg: Config,
    batch_size: int | None = None,
    warm_up_prompt: list[int] | None = None,
) -> Engine:
    """The ``kind`` engine ("hf" or "vllm") sampling from ``model`` with ``cfg.rollout``'s settings:
    ``batch_size`` sequences at once (default ``rollout.generation_batch_size``), contexts of up to
    ``data.max_prompt_length + rollout.max_new_tokens``. ``warm_up_prompt``: 4 tokens are sampled
    from it first, so that the first timed call does not pay the engine's first-call costs."""
    r = cfg.rollout
    engine = build_engine(
        kind,
        model,
        tokenizer,
        r.generation_batch_size if batch_size is None else batch_size,
        cfg.data.max_prompt_length + r.max_new_tokens,
        r.logprobs_top_k,
        vllm_options=r,
    )
    if warm_up_prompt is not None:
        engine.generate(
            [GenerationRequest(warm_up_prompt)],
            replace(sampling_params(r, top_logprobs=False), max_new_tokens=4),
        )
    return engine
