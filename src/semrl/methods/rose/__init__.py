"""ROSE (arXiv 2601.05053, https://arxiv.org/abs/2601.05053): semantic-entropy tree rollouts,
epsilon-exploration, segment advantages from the prefix tree with length-aware calibration,
Dr.GRPO loss.

How it fits together, one step:

1. Rollout (``method.rose_rollout`` -> ``rollout.tree_rollout``): per prompt a root chain, then
   G - 1 iterations; each is a fresh chain with probability ``epsilon``, otherwise a branch that
   re-samples the token at the highest-scoring position of the chains so far. The score is
   ``branching.branch_scores``: generation entropy H over the top-k log-probs x semantic divergence
   SD of the top-20 candidates' input embeddings (docs/algorithms.md "ROSE: branching metric").
2. The G chains form a prefix tree (``semrl.rollout.tree.ChainTree``), kept per group in ``GroupInfo``;
   tree packing computes each shared prefix once from it (``semrl.update.packing``).
3. Advantages (``method.rose_advantages`` -> ``advantages.segment_advantages``): a chain's segments
   between tree nodes get the change of node value (mean reward under the node), which telescopes
   to the Dr.GRPO advantage; then eq. 8 discounts verbose correct chains (``alpha``; correct =
   verified by the reward function, not "non-zero reward" as in the ROSE code)
   (docs/algorithms.md "ROSE: nodes and segment advantages", "ROSE: length-aware calibration").
4. Loss: Dr.GRPO's (``seq-mean-token-sum-norm``, no std), the PPO clip of ``algorithm``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from semrl.config.options import AT_LEAST_1, FRACTION, NON_NEGATIVE, check_ranges, option
from semrl.errors import ConfigError
from semrl.methods.registry import MethodSpec, register_method

if TYPE_CHECKING:
    from semrl.config.sections import Config


@dataclass(frozen=True)
class RoseConfig:
    """The ``rose`` config section, read when ``algorithm.method=rose``."""

    epsilon: float = option(
        0.5, "ROSE: probability of a fresh chain instead of a branch (1 = Dr.GRPO).", valid=FRACTION
    )
    alpha: float = option(
        1.0, "ROSE length-aware calibration exponent (eq. 8); 0 turns it off.", valid=NON_NEGATIVE
    )
    branch_metric: Literal["semantic_entropy", "entropy", "divergence", "random"] = option(
        "semantic_entropy", "Branch-point score: SD x H (ROSE), H (FR3E-style), SD, or random."
    )
    entropy_mode: Literal["topk_logprobs", "full_vocab"] = option(
        "topk_logprobs", "H over the top-k log-probs (ROSE code) or the full vocabulary (paper)."
    )
    entropy_with_sampled: bool = option(
        False,
        "With entropy_mode=topk_logprobs: add the sampled token's -p log p when it is outside the top k "
        "(20 or 21 terms), as the ROSE code does with vLLM's log-prob dictionary (docs/engines.md).",
    )
    sd_mode: Literal["rose", "normalized"] = option(
        "rose", "Semantic divergence: ROSE code formula, or the normalised non-negative variant."
    )
    sd_top_k: int = option(
        20, "Candidates used for semantic divergence (<= rollout.logprobs_top_k).", valid=AT_LEAST_1
    )
    code_compat: bool = option(
        False, "Key tree nodes by (prompt, position) like ROSE's code instead of the exact tree."
    )
    reuse_kv_cache: bool = option(
        True,
        "Continue branches from the parent chain's KV cache (kept until the step's trees are "
        "done); false re-encodes prompt + prefix, saving memory on long responses.",
    )

    def __post_init__(self) -> None:
        check_ranges(self, "rose")


def check_rose(cfg: Config) -> None:
    if cfg.section("rose").sd_top_k > cfg.rollout.logprobs_top_k:
        raise ConfigError("config key 'rose.sd_top_k' must be <= rollout.logprobs_top_k")


def rose_needs_entropy(options: RoseConfig) -> str | None:
    return "rose.entropy_mode=full_vocab" if options.entropy_mode == "full_vocab" else None


register_method(
    MethodSpec(
        name="rose",
        advantage_fn="semrl.methods.rose.method:rose_advantages",
        norm_adv_by_std=False,
        loss_agg_mode="seq-mean-token-sum-norm",
        description="ROSE: semantic-entropy tree rollouts, segment advantages, Dr.GRPO loss "
        "(arXiv 2601.05053).",
        rollout_fn="semrl.methods.rose.method:rose_rollout",
        options=RoseConfig,
        check=check_rose,
        needs_entropy=rose_needs_entropy,
        reads_top_logprobs=True,
    )
)
