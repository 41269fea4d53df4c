"""The method and policy-loss registries: what a method declares, without its tensor code.

A method is one folder of ``semrl.methods`` (docs/methods/adding.md). Its ``__init__`` imports no
torch: it holds the method's options (a frozen dataclass that becomes the config section named after
the method, ``rose.epsilon``), its checks across sections, and a ``MethodSpec`` registered with
``register_method``. The spec names its tensor functions as ``"module:function"`` strings, imported
when training starts (``load``), so that a config is read and checked before torch loads; a plug-in
in a single file may pass the functions themselves instead. The functions' signatures:

* ``advantage_fn(inputs, config) -> (advantages, metrics)``: (N, T) per-token advantages from the
  step's rewards (``semrl.methods.interface.AdvantageInputs``), and the method's metrics for the step;
  ``config`` is a ``MethodConfig``: the method's own options and the ``algorithm`` and ``rollout``
  sections, nothing else;
* ``rollout_fn(ctx, prompt_ids) -> MethodRollout``: its own sampling (trees, anchors), optional; it
  sees only a ``semrl.methods.interface.RolloutContext``;
* ``new_state() -> state``: the method's own state, kept by the trainer, optional.

A per-token policy loss (``algorithm.policy_loss``, cf. verl's ``policy_loss.loss_mode``) is
registered the same way with a ``PolicyLoss``. The trainer looks both up by name and never needs
editing (cf. verl's ``register_adv_est``); ``semrl.methods.catalog`` imports the built-in methods.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from semrl.errors import ConfigError, did_you_mean

if TYPE_CHECKING:
    from semrl.config.sections import AlgorithmConfig, Config, RolloutConfig

OptionsT = TypeVar("OptionsT")
EntryT = TypeVar("EntryT")

# a function, or where to import it from: "package.module:function"
FunctionRef = str | Callable[..., Any]


def load(ref: FunctionRef, takes: tuple[str, ...] | None = None, role: str = "") -> Callable[..., Any]:
    """The function ``ref`` names (``"package.module:function"``), imported; a callable is itself.
    ``takes``: the positional arguments the caller passes (``role``, e.g. "method rose's rollout_fn",
    names the seam), checked now, so that a plug-in's function with the wrong signature fails when
    training starts, naming what it must take. The caller annotates the result with the seam's type
    (``semrl.methods.interface.AdvantageFn``, ``RolloutFn``; ``semrl.methods.policy_loss.LossFn``)."""
    if callable(ref):
        function: Callable[..., Any] = ref
    else:
        module, _, name = ref.partition(":")
        if not name:
            raise ValueError(f"a function reference is 'package.module:function', got {ref!r}")
        function = getattr(importlib.import_module(module), name)
    if takes is not None:
        try:
            inspect.signature(function).bind(*takes)
        except TypeError as e:
            name = getattr(function, "__qualname__", repr(function))
            raise ConfigError(
                f"{role or 'a registered function'} is called as f({', '.join(takes)}), but "
                f"{name}{inspect.signature(function)} cannot take that ({e}); give it those "
                "positional parameters (docs/methods/adding.md)"
            ) from None
    return function


class Registry(Generic[EntryT]):
    """Entries of one kind by name: methods, policy losses. Registering a name twice is an error; an
    unknown name fails with the closest registered one."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, EntryT] = {}

    def register(self, name: str, entry: EntryT) -> EntryT:
        if name in self._entries:
            raise ValueError(f"{self.kind} '{name}' is already registered")
        self._entries[name] = entry
        return entry

    def get(self, name: str | None) -> EntryT:
        """The entry of ``name`` (None, a config key not filled in yet, is unknown)."""
        try:
            return self._entries[name]  # type: ignore[index]  # None is looked up, and is unknown
        except KeyError:
            extra = did_you_mean(str(name), self._entries)
            raise KeyError(
                f"unknown {self.kind} '{name}'.{extra} Available: {', '.join(sorted(self._entries))}"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __getitem__(self, name: str | None) -> EntryT:
        return self.get(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def items(self) -> list[tuple[str, EntryT]]:
        return list(self._entries.items())

    def values(self) -> list[EntryT]:
        return list(self._entries.values())

    def pop(self, name: str, default: EntryT | None = None) -> EntryT | None:
        """Remove ``name`` and return its entry (``default`` when it is not registered)."""
        return self._entries.pop(name, default)


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


@dataclass(frozen=True)
class MethodSpec:
    """A registered method.

    Attributes:
        name: ``algorithm.method`` value, and the name of the method's config section.
        advantage_fn: its advantage estimator, or where to import it from (``"module:function"``).
        description: one line for ``semrl config --methods`` and the docs, with the paper.
        norm_adv_by_std: default of ``algorithm.norm_adv_by_std`` when the config leaves it null.
        loss_agg_mode: default of ``algorithm.loss_agg_mode`` when left null.
        policy_loss: default of ``algorithm.policy_loss`` when left null.
        clip_ratio_low: default of ``algorithm.clip_ratio_low`` when left null.
        clip_ratio_high: default of ``algorithm.clip_ratio_high`` when left null.
        rollout_fn: its own sampling (or where to import it from); None: G independent samples per
            prompt (``semrl.methods.interface.independent_rollout``, the trainer's one other rollout).
        options: frozen dataclass of its option fields (its config section), or None.
        check: checks of its options against other sections, run when the config is loaded with
            this method selected; raises ``ConfigError``.
        new_state: makes the method's state (or where to import it from), kept by the trainer and
            handed to ``rollout_fn``.
        needs_entropy: (options) -> the option setting under which ``rollout_fn`` runs a forward
            pass for full-vocabulary entropies (e.g. ``"rose.entropy_mode=full_vocab"``), or None.
        reads_top_logprobs: whether its rollout reads the ``rollout.logprobs_top_k`` largest
            log-probs of every position (ROSE's branching scores); otherwise the engine is asked
            for the sampled token's log-prob only.
        host: for a method that trains with another's advantages and loss (LATR): (its raw config
            section) -> the registered method whose defaults fill the ``algorithm`` keys left null.
        engine_powers: (options) -> the engine powers its rollout cannot run without under these
            options (fields of ``semrl.rollout.engines.EnginePowers``), each with the setting that
            asks for it; an engine that lacks one is refused when training starts, naming both.
    """

    name: str
    advantage_fn: FunctionRef
    description: str
    norm_adv_by_std: bool
    loss_agg_mode: str
    policy_loss: str = "ppo"
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    rollout_fn: FunctionRef | None = None
    options: type | None = None
    check: Callable[[Config], None] | None = None
    new_state: FunctionRef | None = None
    needs_entropy: Callable[[Any], str | None] | None = None
    reads_top_logprobs: bool = False
    host: Callable[[Any], str] | None = None
    engine_powers: Callable[[Any], dict[str, str]] | None = None

    @property
    def section(self) -> str | None:
        """The name of its config section, or None when it has no options."""
        return self.name if self.options is not None else None


@dataclass(frozen=True)
class PolicyLoss:
    """A registered per-token policy loss.

    The loss maps a micro-batch's ``semrl.methods.policy_loss.PolicyLossInputs`` to a per-token loss
    (n, T) that the update aggregates with ``algorithm.loss_agg_mode`` and adds the KL-to-reference
    term to. A loss that selects tokens over the whole mini-batch (not the micro-batch) has a
    ``prepare_fn``: the update calls it once per mini-batch with rollout-time tensors and passes its
    per-token outputs, sliced to the micro-batch, as ``inputs.selection``.

    Attributes:
        name: ``algorithm.policy_loss`` value.
        loss_fn: (micro-batch, config) -> ((n, T) per-token loss, metrics), or where to import it from.
        prepare_fn: (mini-batch, config) -> per-token selections (or where to import it from), or None.
        section: the config section whose options it reads (``MethodConfig.options``), or None.
        needs_reference: (its options) -> whether it reads the reference model's log-probs.
        off_policy_term: (its options) -> the setting of a term that is identically 0 when the
            update is purely on-policy (old log-probs = current ones), e.g. a |logp - old logp|
            penalty, or None; loading a config warns when such a term cannot act.
    """

    name: str
    loss_fn: FunctionRef
    prepare_fn: FunctionRef | None = None
    section: str | None = None
    needs_reference: Callable[[Any], bool] = lambda options: False
    off_policy_term: Callable[[Any], str | None] = lambda options: None


METHODS: Registry[MethodSpec] = Registry("method")
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")


def register_method(spec: MethodSpec) -> MethodSpec:
    return METHODS.register(spec.name, spec)


def register_policy_loss(loss: PolicyLoss) -> PolicyLoss:
    return POLICY_LOSSES.register(loss.name, loss)


def get_method(name: str | None) -> MethodSpec:
    return METHODS.get(name)


def get_policy_loss(name: str | None) -> PolicyLoss:
    return POLICY_LOSSES.get(name)
