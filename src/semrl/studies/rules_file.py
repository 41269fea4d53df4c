"""A study's rules file: its design (looks, alpha, boundary, budget), families and decision rules,
read and checked (docs/evaluation.md, "Designs"); ``semrl.studies.designs`` judges them.

A rules file with a design is a mapping::

    design:
      type: group_sequential        # or fixed, or anytime (max_seeds: 20, prior_scale: 1)
      looks: [4, 8, 12]             # seeds at each look (fixed: one look)
      alpha: 0.05                   # two-sided, per family
      boundary: spending_obrien_fleming   # pocock, obrien_fleming, spending_pocock
      max_hours: 15                 # optional budget: semrl sweep --until-decided stops there
    families:
      primary: holm                 # holm (default), bonferroni, bh_spent, bh or none
      secondary: bh
    rules:
      - id: H1
        family: primary
        metric: eval/pass@16
        pair: [rose, dr_grpo]
        expect: greater
        margin: 0.05
        decide_at: zero             # or margin: decided only when the interval clears +margin

The seeds are taken in seed order, so the look at n seeds reads the first n seeds that finished every
variant the rules name. At look k each rule's interval is the repeated confidence interval at the
look's nominal level (``semrl.studies.sequential.nominal_levels``) for its family's share of alpha:

- ``holm``: alpha / r for each of the r rules of the family still open, step-down within the look: a
  rule settled at this look passes its share to the others, which are judged again (the sequentially
  rejective group-sequential Holm of Maurer & Bretz 2013);
- ``bh``: the Benjamini-Hochberg step-up at the look's nominal level for alpha, on the rules' t-test
  p-values: the false discovery rate at each look, not family-wise error; over several looks the rate
  can pass alpha a little (0.0525 for 6 rules at looks of 4, 8 and 12 seeds under no effect);
- ``bh_spent``: the same step-up at the alpha the look spends (``spent_per_look``), which sums to
  alpha over the looks, so the false discovery rate over all looks stays within alpha;
- ``none``: alpha for each rule, uncorrected.

``anytime`` designs look at every seed count from 2 to ``max_seeds``: each rule's interval is the
confidence sequence of the t-test e-value (``semrl.studies.sequential.t_e_value``), valid however
often it is read, and a family is corrected by ``bonferroni`` (alpha / m for each of its m rules).

A rule with ``test: sign`` is judged by the median's order-statistic interval at the same levels,
and BH reads its exact sign-test p-value (``semrl.studies.decide``); anytime designs take t rules
only.

A rule settled (decided, decided against) at a look keeps its outcome at later looks. A rule whose
interval lies inside (-margin, +margin) is ruled out: for a primary rule that stops it (non-binding
futility; it spends no alpha). Outcomes are exclusive, in this order of precedence:

1. **decided**: the interval, turned toward the claim, lies above the rule's decision bound (0, or
   +margin with ``decide_at: margin``; -margin for ``not_below``);
2. **decided against**: it lies below 0 (-margin for ``not_below``);
3. **ruled out** (``greater`` and ``less`` only): it lies inside (-margin, +margin);
4. **undecided**.

A look at a seed count the design did not plan is refused; ``descriptive=True`` reports it with no
outcome. Every planned look is appended to the looks log (``looks.jsonl`` beside the runs): when, which
seeds, and each rule's estimate, interval, level, p-values and outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from semrl.errors import ConfigError
from semrl.studies.decide import Hypothesis, parse_hypothesis
from semrl.studies.sequential import (
    BOUNDARIES,
    CORRECTIONS,
    nominal_levels,
    spent_per_look,
)

DESIGN_TYPES = ("fixed", "group_sequential", "anytime")
ANYTIME_CORRECTIONS = ("bonferroni", "none")


@dataclass(frozen=True)
class Design:
    """When and at what level a study's rules are judged (module docstring)."""

    type: str
    looks: tuple[int, ...]
    alpha: float = 0.05
    boundary: str = "spending_obrien_fleming"
    families: dict[str, str] = field(default_factory=lambda: {"primary": "holm"})
    max_hours: float | None = None
    prior_scale: float = 1.0  # anytime: the variance of the standardised effect under the alternative

    def levels(self, alpha: float) -> list[float]:
        """Each look's nominal two-sided level for a rule given ``alpha``."""
        if self.type == "fixed":
            return [alpha]
        return nominal_levels(self.looks, alpha, self.boundary)

    def spent(self, alpha: float) -> list[float]:
        """The share of ``alpha`` each look spends (all of it at a fixed design's one look)."""
        if self.type == "fixed":
            return [alpha]
        return spent_per_look(self.looks, alpha, self.boundary)

    def look_index(self, seeds: int) -> int | None:
        return self.looks.index(seeds) if seeds in self.looks else None


def _design(entry: Any, where: str) -> Design:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: 'design' must be a mapping with type and looks")
    known = {"type", "looks", "alpha", "boundary", "max_hours", "seeds", "max_seeds", "prior_scale"}
    if unknown := sorted(set(entry) - known):
        raise ConfigError(f"{where}: unknown design keys {unknown}; the keys are {sorted(known)}")
    kind = entry.get("type")
    if kind not in DESIGN_TYPES:
        raise ConfigError(f"{where}: design 'type' must be one of {', '.join(DESIGN_TYPES)}, got {kind!r}")
    looks = _looks(entry, kind, where)
    alpha = _number(entry, "alpha", 0.05, where, "in (0, 0.5)", lambda x: 0 < x < 0.5)
    boundary = entry.get("boundary", "spending_obrien_fleming")
    if boundary not in BOUNDARIES:
        raise ConfigError(
            f"{where}: design 'boundary' must be one of {', '.join(BOUNDARIES)}, got {boundary!r}"
        )
    hours = _number(entry, "max_hours", None, where, "> 0", lambda x: x > 0)
    scale = _number(entry, "prior_scale", 1.0, where, "> 0", lambda x: x > 0)
    assert alpha is not None and scale is not None
    return Design(kind, tuple(looks), alpha, boundary, max_hours=hours, prior_scale=scale)


def _looks(entry: dict[str, Any], kind: str, where: str) -> list[int]:
    """The seed counts at which a design looks: ``looks`` (``seeds`` for a fixed design), or every
    count from 2 to ``max_seeds`` for an anytime design."""
    if kind == "anytime":
        top = entry.get("max_seeds")
        if isinstance(top, bool) or not isinstance(top, int) or top < 2:
            raise ConfigError(f"{where}: an anytime design needs 'max_seeds', an integer >= 2, got {top!r}")
        return list(range(2, top + 1))
    looks = entry.get("looks", [entry["seeds"]] if "seeds" in entry else None)
    if not (
        isinstance(looks, list)
        and looks
        and all(isinstance(n, int) and not isinstance(n, bool) for n in looks)
    ):
        raise ConfigError(f"{where}: design 'looks' must be a list of seed counts, e.g. [4, 8, 12]")
    if looks != sorted(set(looks)) or looks[0] < 2:
        raise ConfigError(f"{where}: design 'looks' must increase and start at >= 2 seeds, got {looks}")
    if kind == "fixed" and len(looks) != 1:
        raise ConfigError(f"{where}: a fixed design has one look; use type: group_sequential for {looks}")
    return looks


def _number(
    entry: dict[str, Any], key: str, default: float | None, where: str, rule: str, ok: Callable[[float], bool]
) -> float | None:
    """``entry[key]`` as a float checked by ``ok`` (``rule`` in words), or ``default`` when absent."""
    value = entry.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not ok(value):
        raise ConfigError(f"{where}: design '{key}' must be a number {rule}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class RulesFile:
    """A rules file: its design (None: a plain list of rules, judged descriptively) and rules with
    their families and ``decide_at``."""

    design: Design | None
    rules: tuple[Hypothesis, ...]
    families: dict[str, str]  # rule id -> family
    decide_at_margin: frozenset[str] = frozenset()  # rule ids with decide_at: margin


def load_rules(path: str | Path) -> RulesFile:
    """Read a rules file: a list of rules (no design: descriptive) or a mapping with ``design``,
    ``families`` and ``rules`` (module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"decision rules file '{path}' does not exist")
    body = _read_yaml(path)
    if isinstance(body, list):
        entries: Any = body
        design, families = None, {"primary": "none"}
    elif isinstance(body, dict):
        if unknown := sorted(set(body) - {"design", "families", "rules"}):
            raise ConfigError(
                f"{path}: unknown top-level keys {unknown}; the keys are design, families, rules"
            )
        if "design" not in body:
            raise ConfigError(f"{path}: a rules mapping needs 'design' (or give a plain list of rules)")
        design = _design(body["design"], f"{path}, design")
        default = {"primary": "bonferroni" if design.type == "anytime" else "holm"}
        families = _families(body.get("families", default), path, design.type)
        design = replace(design, families=families)
        entries = body.get("rules")
    else:
        raise ConfigError(f"{path}: expected a list of rules or a mapping with design, families and rules")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{path}: expected a non-empty list of rules")
    rules, of_family, at_margin = [], {}, set()
    for i, entry in enumerate(entries):
        rule, family, decide_at = _rule(entry, families, f"{path}, rule {i + 1}", design)
        rules.append(rule)
        of_family[rule.id] = family
        if decide_at == "margin":
            at_margin.add(rule.id)
    ids = [r.id for r in rules]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{path}: rule ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
    return RulesFile(design, tuple(rules), of_family, frozenset(at_margin))


def _read_yaml(path: Path) -> Any:
    import yaml

    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path} is not a YAML rules file: {err}") from None


def _families(families: Any, path: Path, kind: str) -> dict[str, str]:
    if not isinstance(families, dict) or not all(v in CORRECTIONS for v in families.values()):
        raise ConfigError(
            f"{path}: 'families' maps a family name to its correction ({', '.join(CORRECTIONS)}), "
            f"got {families!r}"
        )
    if kind == "anytime" and (bad := sorted(set(families.values()) - set(ANYTIME_CORRECTIONS))):
        raise ConfigError(
            f"{path}: an anytime design takes the corrections {', '.join(ANYTIME_CORRECTIONS)}, got "
            f"{bad}: Holm's and BH's step-wise levels are not valid for e-values read at every seed"
        )
    if "primary" not in families:
        raise ConfigError(f"{path}: 'families' needs a 'primary' family: the rules that stop the study")
    return dict(families)


def _rule(
    entry: Any, families: dict[str, str], where: str, design: Design | None
) -> tuple[Hypothesis, str, str]:
    """(rule, family, decide_at) of one entry; an anytime design takes t-test rules only."""
    family, decide_at = "primary", "zero"
    if isinstance(entry, dict):
        entry = dict(entry)
        family = entry.pop("family", "primary")
        decide_at = entry.pop("decide_at", "zero")
        if family not in families:
            raise ConfigError(f"{where}: family {family!r} is not in 'families' ({', '.join(families)})")
        if decide_at not in ("zero", "margin"):
            raise ConfigError(f"{where}: 'decide_at' must be zero or margin, got {decide_at!r}")
    rule = parse_hypothesis(entry, where)
    if design is not None and design.type == "anytime" and rule.test != "t":
        raise ConfigError(
            f"{where}: an anytime design reads the t-test's e-value at every seed; 'test: {rule.test}' has "
            "no confidence sequence here. Use a fixed or group_sequential design"
        )
    return rule, family, decide_at
