"""The method registry and the plug-in interface a method implements.

A method is one module (docs/methods/adding.md) that defines its pure functions and calls
``register_method`` with a ``MethodSpec``:

* ``advantage_fn(inputs, config) -> (advantages, metrics)``: (N, T) per-token advantages from the
  step's rewards, and the method's metrics for the step; ``config`` is a ``MethodConfig``:
  the method's own typed options and the ``algorithm`` and ``rollout`` sections, nothing else;
* optionally ``rollout_fn(ctx, prompt_ids) -> MethodRollout``: its own sampling (trees, anchors);
  it sees only a ``RolloutContext`` (engine, sampler, generator, its config, its own state);
* optionally ``options``: a frozen dataclass of option fields, which becomes the config section
  named after the method (``rose.epsilon``), and ``check(cfg)`` for checks across sections;
* optionally ``needs_entropy(options)``: the setting under which its rollout runs a forward pass
  for full-vocabulary entropies (which FSDP with the vllm engine cannot), or None;
* its loss defaults (aggregation, std normalisation, the per-token policy loss by name).

The trainer looks methods up by name and never needs editing (cf. verl's ``register_adv_est``).
The built-in methods are imported by ``semrl.algos.catalog``; this module imports none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch

from semrl.batch import GroupInfo
from semrl.config import AlgorithmConfig, Config, RolloutConfig
from semrl.engines import Engine, Generation, SamplingParams

OptionsT = TypeVar("OptionsT")


@dataclass(frozen=True)
class MethodConfig(Generic[OptionsT]):
    """The part of the config a method's (or a policy loss's) functions read.

    Attributes:
        options: its own section (``RoseConfig`` for ROSE; for a policy loss, the section named by
            ``PolicyLoss.section``), or None when it has none.
        algorithm: the ``algorithm`` section (advantage normalisation, clipping, aggregation, KL).
        rollout: the ``rollout`` section (group size, response budget, temperature, top-k log-probs).
    """

    options: OptionsT
    algorithm: AlgorithmConfig
    rollout: RolloutConfig


def method_config(cfg: Config, section: str | None) -> MethodConfig[Any]:
    """The ``MethodConfig`` of ``cfg`` for the options section ``section`` (None: no options)."""
    return MethodConfig(cfg.section(section) if section else None, cfg.algorithm, cfg.rollout)


# (contexts, generations) -> None: fills ``Generation.entropy`` where it is None with the
# full-vocabulary entropy at the weights that sampled them; contexts[i] holds the tokens before
# generations[i] (``semrl.batch_forward.fill_sampling_entropy``, bound by the trainer)
SamplingEntropyFn = Callable[[list[list[int]], list[Generation]], None]


@dataclass(frozen=True)
class RolloutContext:
    """What a method's rollout may use.

    Attributes:
        engine: the sampling engine (``semrl.engines.Engine``), at the current weights.
        params: the training sampler (temperature, top-p/k, response budget, top-k log-probs).
        generator: the process's random stream; every random choice of the rollout draws from it.
        config: the method's options and the ``algorithm`` and ``rollout`` sections.
        state: the method's own state, made once per run by ``MethodSpec.new_state`` (or None); it is
            not checkpointed, so a method whose results depend on it does not resume exactly.
        sampling_entropy: fills the full-vocabulary sampling entropy of generations an engine
            left without it (vllm), with the trainer's forward at the sampling weights; a no-op
            for generations that have it.
        decode: token ids -> text with the run's tokenizer, special tokens skipped (TreePO's stop
            tests read a segment's text).
        step: the training step this rollout is for (rollouts whose settings follow a schedule).
    """

    engine: Engine
    params: SamplingParams
    generator: torch.Generator
    config: MethodConfig[Any]
    sampling_entropy: SamplingEntropyFn
    state: Any = None
    decode: Callable[[list[int]], str] | None = None
    step: int = 0

    @property
    def group_size(self) -> int:
        return self.config.rollout.group_size


@dataclass
class MethodRollout:
    """A method's rollout of P prompts.

    Attributes:
        generations: (P * G) responses, prompt-major, G = rollout.group_size per prompt.
        groups: (P) what the method records about each prompt group (tree, branch points, its own
            data); None: nothing.
        sequence_prompt_ids: (P * G) the prompt each response continues, when it is not the
            problem's prompt (FR3E: prompt + the anchor's prefix, which is then not trained on).
        metrics: the rollout's metrics for the step (averaged over rollout rounds).
    """

    generations: list[Generation]
    groups: list[GroupInfo] | None = None
    sequence_prompt_ids: list[list[int]] | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class AdvantageInputs:
    """What an advantage estimator may read. N sequences, T response positions.

    Attributes:
        rewards: (N,) scalar reward per sequence.
        group_ids: (N,) prompt group of each sequence (groups are contiguous, G rows each).
        response_mask: (N, T) 1 on response tokens.
        groups: (N / G) the rollout's record of each group (``MethodRollout.groups``).
        answers: (N,) extracted final answer of each response (None: none found).
        correct: (N,) whether each answer was verified correct (the reward before shaping).
        logprobs: (N, T) rollout log-probs of the sampled tokens (0 on padding).
    """

    rewards: torch.Tensor
    group_ids: torch.Tensor
    response_mask: torch.Tensor
    groups: list[GroupInfo] = field(default_factory=list)
    answers: list[str | None] = field(default_factory=list)
    correct: list[bool] = field(default_factory=list)
    logprobs: torch.Tensor | None = None


# (inputs, the method's config) -> ((N, T) advantages, metrics); the quotes keep torch unread at import
AdvantageFn = Callable[[AdvantageInputs, MethodConfig[Any]], tuple["torch.Tensor", dict[str, float]]]
# (context, prompt token ids) -> the method's rollout
RolloutFn = Callable[[RolloutContext, list[list[int]]], MethodRollout]


@dataclass(frozen=True)
class MethodSpec:
    """A registered method.

    Attributes:
        name: ``algorithm.method`` value, and the name of the method's config section.
        advantage_fn: its advantage estimator.
        description: one line for ``semrl config --methods`` and the docs, with the paper.
        norm_adv_by_std: default of ``algorithm.norm_adv_by_std`` when the config leaves it null.
        loss_agg_mode: default of ``algorithm.loss_agg_mode`` when left null.
        policy_loss: default of ``algorithm.policy_loss`` when left null.
        clip_ratio_low: default of ``algorithm.clip_ratio_low`` when left null.
        clip_ratio_high: default of ``algorithm.clip_ratio_high`` when left null.
        rollout_fn: its own sampling; None: G independent samples per prompt.
        options: frozen dataclass of its option fields (its config section), or None.
        check: checks of its options against other sections, run when the config is loaded with
            this method selected; raises ``ConfigError``.
        new_state: makes the method's state, kept by the trainer and handed to ``rollout_fn``.
        needs_entropy: (options) -> the option setting under which ``rollout_fn`` runs a forward
            pass for full-vocabulary entropies (e.g. ``"rose.entropy_mode=full_vocab"``), or None.
        reads_top_logprobs: whether its rollout reads the ``rollout.logprobs_top_k`` largest
            log-probs of every position (ROSE's branching scores); otherwise the engine is asked
            for the sampled token's log-prob only.
        host: for a method that trains with another's advantages and loss (LATR): (its raw config
            section) -> the registered method whose defaults fill the ``algorithm`` keys left null.
    """

    name: str
    advantage_fn: AdvantageFn
    description: str
    norm_adv_by_std: bool
    loss_agg_mode: str
    policy_loss: str = "ppo"
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    rollout_fn: RolloutFn | None = None
    options: type | None = None
    check: Callable[[Config], None] | None = None
    new_state: Callable[[], Any] | None = None
    needs_entropy: Callable[[Any], str | None] | None = None
    reads_top_logprobs: bool = False
    host: Callable[[Any], str] | None = None

    @property
    def section(self) -> str | None:
        """The name of its config section, or None when it has no options."""
        return self.name if self.options is not None else None


METHODS: dict[str, MethodSpec] = {}


def register_method(spec: MethodSpec) -> MethodSpec:
    if spec.name in METHODS:
        raise ValueError(f"method '{spec.name}' is already registered")
    METHODS[spec.name] = spec
    return spec


def get_method(name: str) -> MethodSpec:
    try:
        return METHODS[name]
    except KeyError:
        raise KeyError(f"unknown method '{name}'; available: {', '.join(sorted(METHODS))}") from None
