"""Where a step's old log-probs and sampling entropies come from (docs/algorithms.md, "Old
log-probs").

The rule in one place: ``plan_old_logprobs`` says which rows the no-gradient old-policy pass runs on
and which rows the update's first forward gives instead; ``FirstForward`` then takes those rows as the
update's forwards reach them. The first mini-batch's forward runs before any optimizer step, so at
the sampling weights: its log-probs are the old ones, bit for bit (tests/runtime/test_training.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class OldLogprobPlan:
    """Who measures what before the update.

    Attributes:
        pass_rows: (n,) rows the no-gradient old-policy pass runs on; None: no pass.
        old_logp_from_pass: the pass's log-probs are the old ones (off-policy); False: the pass runs
            only for the sampling entropies, and the ratio is exactly 1.
        pass_entropy: the pass measures the sampling entropies (the engine gave none).
        first_forward_rows: (N,) bool, the rows whose old log-probs (off-policy) and sampling
            entropies (engine without them) the update's first forward gives; None: none.
    """

    pass_rows: torch.Tensor | None
    old_logp_from_pass: bool
    pass_entropy: bool
    first_forward_rows: torch.Tensor | None


def plan_old_logprobs(
    num_rows: int,
    first_mini_batch: torch.Tensor | None,
    *,
    on_policy: bool,
    has_sampling_entropy: bool,
    entropy_before_update: bool,
) -> OldLogprobPlan:
    """The plan for a batch of ``num_rows`` rows.

    Args:
        num_rows: N, the batch's rows on this process.
        first_mini_batch: (m,) rows of the update's first mini-batch, or None to leave nothing to
            the update's forwards (a separate pass for every row; tests and benchmarks compare both).
        on_policy: one epoch in one mini-batch, so the old log-probs are the current ones.
        has_sampling_entropy: the engine gave the tokens' entropies (hf); vllm gives none.
        entropy_before_update: a token selection reads the sampling entropies before the update's
            first forward (``prepare_fn``), so none may be left to it.
    """
    every_row = torch.arange(num_rows)
    measure_entropy = not has_sampling_entropy and (not on_policy or entropy_before_update)
    if on_policy and not measure_entropy:  # no pass; the forwards measure any missing entropies
        every = None if has_sampling_entropy else torch.ones(num_rows, dtype=torch.bool)
        return OldLogprobPlan(None, False, False, every)
    if on_policy or first_mini_batch is None or (measure_entropy and entropy_before_update):
        return OldLogprobPlan(every_row, not on_policy, measure_entropy, None)
    left = torch.zeros(num_rows, dtype=torch.bool)
    left[first_mini_batch] = True
    return OldLogprobPlan(every_row[~left], True, measure_entropy, left)


class FirstForward:
    """What the update's forwards give before any optimizer step (``OldLogprobPlan``): the old
    log-probs of the rows the pass left, and the sampling entropies an engine without them left.
    It keeps its own copies, so the pass's tensors stay as they were returned.

    Attributes:
        rows: (N,) bool, the rows still to take; None: none.
        old_logp: (N, T) old log-probs, the pass's and then the rows taken; None: on-policy.
        entropy: (N, T) sampling entropies being filled, when the batch has none; else None.
    """

    def __init__(
        self,
        rows: torch.Tensor | None,
        old_logp: torch.Tensor | None,
        pass_entropy: torch.Tensor | None,
        response_mask: torch.Tensor | None,
    ) -> None:
        """``rows`` from the plan; ``old_logp`` and ``pass_entropy`` (N, T) from the pass;
        ``response_mask`` (N, T) when the batch has no sampling entropies, else None."""
        self.rows = None if rows is None else rows.clone()
        self.old_logp = None if old_logp is None else old_logp.clone()
        self.entropy: torch.Tensor | None = None
        if response_mask is not None:
            given = pass_entropy
            self.entropy = torch.zeros(response_mask.shape) if given is None else given * response_mask

    def old_log_probs(
        self, idx: torch.Tensor, logp: torch.Tensor, entropy: torch.Tensor | None
    ) -> torch.Tensor:
        """(n, r) old log-probs of rows ``idx`` whose forward gave ``logp`` (n, r) and ``entropy``.
        Rows still to take get their own log-probs as the old ones (kept for later epochs) and their
        entropies into ``self.entropy``; they are then taken. Without an old-policy pass (on-policy)
        the old log-probs are ``logp`` itself."""
        r, dev = logp.shape[1], logp.device
        old = logp.detach() if self.old_logp is None else self.old_logp[idx, :r].to(dev)
        here = torch.zeros(len(idx), dtype=torch.bool) if self.rows is None else self.rows[idx]
        if self.rows is None or not here.any():
            return old
        mine = here.to(dev)
        if self.old_logp is not None:
            old = torch.where(mine[:, None], logp.detach(), old)
            self.old_logp[idx[here], :r] = logp.detach()[mine].float().cpu()
        if self.entropy is not None and entropy is not None:
            self.entropy[idx[here], :r] = entropy.detach()[mine].float().cpu()
        self.rows[idx[here]] = False
        return old
