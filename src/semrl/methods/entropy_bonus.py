"""The entropy bonus ("w/ En" in SENT's comparisons; verl's ``actor.entropy_coeff``, TRL's
``entropy_coef``): ``loss = pg_loss - coeff * agg(H)``, with H the full-vocabulary entropy of the
temperature-scaled distribution, with its gradient, aggregated like the policy-gradient term
(``algorithm.loss_agg_mode``; docs/algorithms.md "Entropy bonus"). The loss term is added in
``semrl.methods.policy_loss.micro_batch_loss``; this module holds the coefficient, fixed or adaptive.

Adaptive (TRL's ``use_adaptive_entropy``, after Skywork-OR1): after every optimizer step the step's
mean token entropy e moves the coefficient by ``delta``, up when e <= target and down otherwise,
clipped to [low, high]; the next step applies the bonus only when e <= target. Before the first
step the bonus applies with the starting coefficient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from semrl.config.sections import AlgorithmConfig


@dataclass
class EntropyBonus:
    """The entropy-bonus coefficient of a run, and its state when adaptive (checkpointed).

    Attributes:
        coeff: the coefficient (the starting one when adaptive).
        target: the adaptive mode's target entropy in nats; None: a fixed coefficient.
        delta: the adaptive mode's step of the coefficient.
        low: the coefficient's lower bound.
        high: its upper bound.
        active: whether the last measured entropy was at or below the target (adaptive only).
    """

    coeff: float = 0.0
    target: float | None = None
    delta: float = 0.005
    low: float = 0.0
    high: float = 1.0
    active: bool = True

    @classmethod
    def from_config(cls, algorithm: AlgorithmConfig) -> EntropyBonus:
        """From the ``algorithm`` section's ``entropy_*`` keys."""
        return cls(
            algorithm.entropy_coeff,
            algorithm.entropy_target,
            algorithm.entropy_coeff_delta,
            algorithm.entropy_coeff_min,
            algorithm.entropy_coeff_max,
        )

    @property
    def adaptive(self) -> bool:
        return self.target is not None

    @property
    def enabled(self) -> bool:
        """Whether the run ever applies a bonus (a fixed 0 never does)."""
        return self.adaptive or self.coeff != 0

    def current(self) -> float:
        """The coefficient the next optimizer step applies."""
        return self.coeff if self.active else 0.0

    def observe(self, entropy: float) -> None:
        """After an optimizer step: its mean token entropy moves an adaptive coefficient."""
        if self.target is None:
            return
        below = entropy <= self.target
        self.coeff = min(max(self.coeff + (self.delta if below else -self.delta), self.low), self.high)
        self.active = below

    def state_dict(self) -> dict[str, Any]:
        return {"coeff": self.coeff, "active": self.active}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.coeff, self.active = float(state["coeff"]), bool(state["active"])
