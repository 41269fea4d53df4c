"""LATR, Lookahead Tree-Based Rollouts (arXiv 2510.24302, ICLR 2026): per prompt, k = round(n * eta)
rows grown as a tree that forks at uncertain tokens and prunes branches whose lookahead stays too
close to their parent's, then finished by ordinary sampling; the other n - k rows are ordinary
samples. Advantages and loss are the host method's (``latr.host``: GRPO, Dr.GRPO or DAPO).

One step:

1. Lookahead phase (``tree.LatrForest``): every active tree row takes one token per loop step and
   reads the two most likely tokens of the raw distribution (temperature 1, no top-p / top-k): in
   one batched KV cache on the model (``method.lookahead_phase``), or on vllm as streamed greedy
   requests (``stream.StreamedRows``, ``latr.lookahead_on``).
   Each row takes the first (the main path is greedy, as the code's default ``sample_nk="none"``);
   the second opens a branch when ``p2 > tau_abs`` and ``p1 - p2 < tau_rel`` while the prompt has
   fewer than k rows. A branch whose last r tokens, for r in ``latr.lookahead``, stay within the
   pruning thresholds of its parent's is removed with its descendants. The phase ends when the trees
   are (nearly) full and past the last lookahead, or after ``latr.force_return_step`` tokens.
2. Prompts with fewer than k rows are padded with copies of their main row; every unfinished row,
   and n - k fresh ones, are sampled to the end with the rollout's sampler (on vllm in the same
   running batch as the lookahead).
3. The rows' shared prefixes form the group's prefix tree, which tree packing computes once.

Where semrl follows the paper and where the code: docs/methods/latr.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from semrl.config.options import AT_LEAST_1, FRACTION, NON_NEGATIVE, check_ranges, option
from semrl.errors import ConfigError
from semrl.methods.grpo import OUTCOME_ADVANTAGES
from semrl.methods.registry import MethodSpec, register_method

if TYPE_CHECKING:
    from semrl.config.sections import Config


HOSTS = ("grpo", "dr_grpo", "dapo")


@dataclass(frozen=True)
class LatrConfig:
    """The ``latr`` config section, read when ``algorithm.method=latr``."""

    host: Literal["grpo", "dr_grpo", "dapo"] = option(
        "grpo",
        "LATR: the method whose advantages, loss aggregation and clip defaults it trains with "
        "(the paper: GRPO and DAPO). DAPO's dynamic sampling is algorithm.dynamic_sampling.",
    )
    tau_abs: float = option(
        0.25,
        "LATR fork test: the second most likely token's probability must exceed this (code "
        "default and Countdown scripts 0.25; math scripts 0.15).",
        valid=FRACTION,
    )
    tau_rel: float = option(
        0.15,
        "LATR fork test: p1 - p2 must be below this (code default and Countdown 0.15; math 0.25).",
        valid=FRACTION,
    )
    edit_distance_threshold: float | None = option(
        0.4,
        "Prune a branch whose Levenshtein distance to its parent's window, over the window length, "
        "is below this (code default and Countdown 0.4; math: null). null: off.",
        valid=FRACTION,
    )
    suffix_match_threshold: float | None = option(
        None,
        "Prune a branch whose longest suffix shared with its parent's window, over its length, "
        "is above this (math scripts 0.2). null: off.",
        valid=FRACTION,
    )
    rouge_l_threshold: float | None = option(
        None,
        "Prune a branch whose ROUGE-L F with its parent's window is above this (math scripts 0.5). "
        "null: off.",
        valid=FRACTION,
    )
    lookahead: list[int] = option(
        [20, 30, 50],
        "Lookahead lengths r: a branch is compared with its parent r tokens after its fork, "
        "for each r (the code's rollout_filter_steps; 1,024- and 8,192-token responses). The CPU demo "
        "scales them to [4, 6, 10] for 64 tokens.",
        valid=AT_LEAST_1,
    )
    keep_math_symbols: bool = option(
        True,
        "Never prune a branch forked where the parent's token, stripped, is a substring of the "
        "code's symbol string (digits, arithmetic operators, brackets, comparison signs; so also any "
        "whitespace token), as the code does (semrl.methods.latr.tree.MATH_SYMBOLS).",
    )
    eta_steps: list[int] = option(
        [0],
        "Training steps at which the share eta of LATR rows changes (with eta_values; the code's "
        "mix_ratio_schedule, e.g. [0, 10, 20, 80, 200] for Countdown).",
        valid=NON_NEGATIVE,
    )
    eta_values: list[float] = option(
        [1.0],
        "eta from each of eta_steps on: round(n * eta) rows per prompt are LATR's, the rest "
        "ordinary samples (Countdown: [1, 0.75, 0.5, 0.25, 0]).",
        valid=FRACTION,
    )
    return_threshold: float = option(
        0.98,
        "The lookahead phase ends once the trees hold this share of their k rows (a tree whose "
        "rows all ended counts as full) and no row is younger than the longest lookahead.",
        valid=FRACTION,
    )
    return_threshold_decay: float = option(
        0.0,
        "Linear decay of return_threshold over the response (scripts 0.05; code default 0).",
        valid=FRACTION,
    )
    force_return_step: int = option(
        0,
        "End the lookahead phase after this many tokens at most (scripts: 512 of 1,024, 1,024 of "
        "8,192). 0: rollout.max_new_tokens.",
        valid=NON_NEGATIVE,
    )

    lookahead_on: Literal["stream", "model"] = option(
        "stream",
        "Where the lookahead runs on an engine that streams requests (EnginePowers.streaming: vllm). "
        "'stream': each row is a greedy request that returns its top-2 after every engine step; a fork "
        "is a new request, a pruned row's request is aborted, and the ordinary rows sample alongside "
        "(docs/methods/latr.md). 'model': the official split, the lookahead on the training model "
        "through one batched KV cache (the engine's row loop), then one engine call finishes every row. "
        "An engine that does not stream (hf) always runs the lookahead on its model.",
        formerly="vllm_lookahead",
    )

    def __post_init__(self) -> None:
        check_ranges(self, "latr")


def latr_host(values: Any) -> str:
    """The host method named by a raw ``latr`` section (its defaults fill the algorithm keys)."""
    host = values.get("host", "grpo") if isinstance(values, dict) else "grpo"
    return host if host in HOSTS else "grpo"


def check_latr(cfg: Config) -> None:
    o: LatrConfig = cfg.section("latr")
    r = cfg.rollout
    if r.group_size < 2:
        raise ConfigError(f"algorithm.method=latr needs rollout.group_size >= 2, got {r.group_size}")
    if r.logprobs_top_k < 2:
        raise ConfigError(
            f"algorithm.method=latr reads the two most likely tokens at every position: set "
            f"rollout.logprobs_top_k >= 2 (got {r.logprobs_top_k}; the vllm engine starts with it)"
        )
    if not o.lookahead:
        raise ConfigError("config key 'latr.lookahead' is empty; give at least one length, e.g. [4, 6, 10]")
    if max(o.lookahead) >= r.max_new_tokens:
        raise ConfigError(
            f"config key 'latr.lookahead' ({o.lookahead}) must stay below rollout.max_new_tokens "
            f"({r.max_new_tokens}): a branch is compared r tokens after its fork; scale it down, e.g. "
            f"[{max(1, r.max_new_tokens // 16)}, {max(1, r.max_new_tokens // 10)}, "
            f"{max(1, r.max_new_tokens // 6)}]"
        )
    if o.force_return_step > r.max_new_tokens:
        raise ConfigError(
            f"config key 'latr.force_return_step' ({o.force_return_step}) exceeds rollout.max_new_tokens "
            f"({r.max_new_tokens}); use at most that, or 0"
        )
    if len(o.eta_steps) != len(o.eta_values) or not o.eta_steps:
        raise ConfigError(
            f"config keys 'latr.eta_steps' ({o.eta_steps}) and 'latr.eta_values' ({o.eta_values}) need one "
            "value per step"
        )
    if o.eta_steps[0] != 0 or any(b <= a for a, b in zip(o.eta_steps, o.eta_steps[1:], strict=False)):
        raise ConfigError(f"config key 'latr.eta_steps' ({o.eta_steps}) must start at 0 and increase")
    thresholds = (o.edit_distance_threshold, o.suffix_match_threshold, o.rouge_l_threshold)
    if all(t is None for t in thresholds):
        raise ConfigError(
            "latr: every pruning metric is off (edit_distance_threshold, suffix_match_threshold, "
            "rouge_l_threshold are null); set at least one, e.g. latr.edit_distance_threshold=0.4"
        )


def latr_engine_powers(options: LatrConfig) -> dict[str, str]:
    """The official split runs the lookahead on the model beside the engine: the engine's row loop."""
    return {"row_loop": "latr.lookahead_on=model"} if options.lookahead_on == "model" else {}


register_method(
    MethodSpec(
        name="latr",
        advantage_fn=OUTCOME_ADVANTAGES,  # the host's: algorithm.norm_adv_by_std is filled from it
        norm_adv_by_std=True,
        loss_agg_mode="seq-mean-token-mean",
        description="LATR: lookahead tree rollouts that fork at uncertain tokens and prune branches "
        "that stay similar, host GRPO / Dr.GRPO / DAPO (arXiv 2510.24302).",
        rollout_fn="semrl.methods.latr.method:latr_rollout",
        options=LatrConfig,
        check=check_latr,
        host=latr_host,
        engine_powers=latr_engine_powers,
    )
)
