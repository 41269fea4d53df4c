"""Every design and correction keeps the error rate it states (issue 62, item 1), in simulated
studies with known truth: under no effect anywhere and with some rules truly non-zero.

``reference_decisions`` is an independent, vectorised restatement of the procedures on t-test
p-values (a rule's repeated t-interval at level L excludes 0 exactly when its p-value is below L).
It is checked against ``judge_looks`` on random studies, then run on many studies to measure:

- Holm and Bonferroni: the family-wise error (any false decision);
- BH at the alpha each look spends (``bh_spent``): the false discovery rate over the looks;
- BH at each look's nominal level (``bh``): the false discovery rate at each look, and over the
  looks a little above alpha, as the docs state;
- none: each rule's own error.

A false decision is a rule whose true difference is 0 decided or decided against.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats as st

from semrl.studies.decide import Hypothesis
from semrl.studies.designs import SETTLED, judge_looks
from semrl.studies.rules_file import Design, RulesFile

ALPHA = 0.05
LOOKS = (4, 8, 12)


def _design(kind: str, correction: str) -> Design:
    if kind == "fixed":
        return Design("fixed", (LOOKS[-1],), ALPHA, families={"primary": correction})
    return Design("group_sequential", LOOKS, ALPHA, kind, {"primary": correction})


def _p_values(d: np.ndarray, n: int, test: str = "t") -> np.ndarray:
    """Two-sided p-values of the first n seeds, d (studies, rules, seeds): the one-sample t-test's,
    or the exact sign test's over the differences that are not 0 (nan when all are)."""
    x = d[..., :n]
    if test == "sign":
        above, below = (x > 0).sum(-1), (x < 0).sum(-1)
        p = np.minimum(1.0, 2 * st.binom.cdf(np.minimum(above, below), above + below, 0.5))
        return np.where(above + below > 0, p, np.nan)
    t = x.mean(-1) / (x.std(-1, ddof=1) / math.sqrt(n))
    return 2 * st.t.sf(np.abs(t), n - 1)


def _below(p: np.ndarray, level: np.ndarray | float, test: str) -> np.ndarray:
    """Whether each p-value rejects at ``level``: the exact sign test's interval excludes 0 at p <= level
    (its p-values hit the levels' grid), the t-interval at p < level."""
    return p <= level if test == "sign" else p < level


def _bh(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg rejections of each row of p (studies, m) at each row's level q."""
    m = p.shape[1]
    below = np.sort(p, axis=1) <= q[:, None] * np.arange(1, m + 1) / m
    k = np.where(below.any(1), m - np.argmax(below[:, ::-1], axis=1), 0)
    return p <= np.where(k > 0, k * q / m, -1.0)[:, None]


def reference_decisions(
    design: Design, correction: str, d: np.ndarray, test: str = "t", p_values: list[np.ndarray] | None = None
) -> np.ndarray:
    """(looks, studies, rules): whether each rule is settled (decided either way) by each look, from
    each look's ``_p_values`` of ``d`` (or ``p_values``, computed from ``d`` already)."""
    studies, m, _ = d.shape
    settled = np.zeros((studies, m), dtype=bool)
    out = []
    for k, n in enumerate(design.looks):
        p = _p_values(d, n, test) if p_values is None else p_values[k]
        open_ = ~settled
        if correction in ("bh", "bh_spent"):
            q = design.levels(ALPHA)[k] if correction == "bh" else design.spent(ALPHA)[k]
            r = open_.sum(1)
            # BH over the open rules only: a settled rule's p-value is set out of reach
            masked = np.where(open_, p, 2.0)
            rejected = np.zeros_like(settled)
            for count in range(1, m + 1):  # BH's m is the number of open rules of each study
                rows = r == count
                if rows.any():
                    order = np.argsort(masked[rows], axis=1)[:, :count]
                    sub = np.take_along_axis(masked[rows], order, axis=1)
                    hit = _bh(sub, np.full(rows.sum(), q))
                    block = np.zeros((rows.sum(), m), dtype=bool)
                    np.put_along_axis(block, order, hit, axis=1)
                    rejected[rows] = block
            settled |= rejected & open_
        elif correction == "holm":
            while True:  # step-down: alpha / r for the r open rules, again after any settles
                r = (~settled).sum(1)
                level = np.array([design.levels(ALPHA / max(c, 1))[k] for c in range(m + 1)])[r]
                newly = ~settled & _below(p, level[:, None], test)
                if not newly.any():
                    break
                settled |= newly
        else:
            share = ALPHA / m if correction == "bonferroni" else ALPHA
            settled |= open_ & _below(p, design.levels(share)[k], test)
        out.append(settled.copy())
    return np.array(out)


def _rules(m: int, test: str = "t") -> RulesFile:
    rules = tuple(Hypothesis(f"H{i}", "", "m", "a", "b", "greater", 100.0, test=test) for i in range(m))
    return RulesFile(None, rules, {r.id: "primary" for r in rules})


# Each boundary with the correction whose levels it shapes; Holm, Bonferroni and uncorrected under
# the default boundary (each share of alpha is a calibration of several seconds)
CASES = [
    ("fixed", "holm"),
    ("fixed", "bh"),
    ("spending_obrien_fleming", "holm"),
    ("spending_obrien_fleming", "bonferroni"),
    ("spending_obrien_fleming", "bh"),
    ("spending_obrien_fleming", "bh_spent"),
    ("spending_obrien_fleming", "none"),
    ("pocock", "bh_spent"),
    ("obrien_fleming", "bh_spent"),
    ("spending_pocock", "bh_spent"),
]


@pytest.mark.parametrize(("kind", "correction"), CASES)
def test_the_reference_decides_what_judge_looks_decides(kind, correction):
    """On 100 random studies of 4 rules, some with effects, the reference settles exactly the rules
    ``judge_looks`` settles, look by look."""
    design = _design(kind, correction)
    rng = np.random.default_rng(len(kind) * 7 + len(correction))
    effects = rng.choice([0.0, 0.0, 0.8, 1.5], size=(100, 4, 1))
    d = rng.standard_normal((100, 4, LOOKS[-1])) + effects
    mine = reference_decisions(design, correction, d)
    rules = replace(_rules(4), design=design)
    for s in range(100):
        looks = judge_looks(
            {f"H{i}": dict(enumerate(d[s, i])) for i in range(4)}, rules, list(range(LOOKS[-1]))
        )
        theirs = [[j.outcome in SETTLED for j in look] for look in looks]
        assert theirs == mine[:, s].tolist(), f"study {s}"


def _studies(effects: np.ndarray, studies: int, seed: int) -> np.ndarray:
    """(studies, rules, seeds): simulated per-seed differences, each rule's mean its effect."""
    return (
        np.random.default_rng(seed).standard_normal((studies, len(effects), LOOKS[-1]))
        + effects[None, :, None]
    )


def _rates(
    design: Design,
    correction: str,
    effects: np.ndarray,
    d: np.ndarray,
    p_values: list[np.ndarray] | None = None,
) -> dict[str, float]:
    """The error rates of ``correction`` over the simulated studies ``d`` (``_studies`` of ``effects``)."""
    settled = reference_decisions(design, correction, d, p_values=p_values)
    null = effects == 0
    false, made = (settled & null).sum(-1), settled.sum(-1)  # (looks, studies)
    per_look_fdr = [float(np.mean(false[k] / np.maximum(made[k], 1))) for k in range(len(design.looks))]
    return {
        "fwer": float(np.mean(false[-1] > 0)),
        "fdr": float(np.mean(false[-1] / np.maximum(made[-1], 1))),
        "fdr_each_look": max(per_look_fdr),
        "per_rule": float(settled[-1][:, null].mean()) if null.any() else 0.0,
    }


STUDIES = 20_000
TOLERANCE = 3 * math.sqrt(ALPHA * (1 - ALPHA) / STUDIES)  # 3 Monte Carlo s.e. at alpha
STATED = {"holm": "fwer", "bonferroni": "fwer", "bh_spent": "fdr", "bh": "fdr_each_look", "none": "per_rule"}
SHAPES = {  # truth: each rule's mean difference in units of the per-seed s.d.
    "no effect": np.zeros(4),
    "2 of 4 non-zero": np.array([1.0, 1.0, 0.0, 0.0]),
    "3 of 4 non-zero": np.array([0.7, -1.0, 1.3, 0.0]),
}


@pytest.mark.parametrize(("kind", "correction"), CASES)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_each_correction_holds_the_rate_it_states(kind, correction, shape):
    effects = SHAPES[shape]
    rates = _rates(
        _design(kind, correction), correction, effects, _studies(effects, STUDIES, len(shape) + len(kind))
    )
    stated = STATED[correction]
    assert rates[stated] <= ALPHA + TOLERANCE, f"{correction} ({stated}) at {rates[stated]:.4f}, {shape}"


def test_the_rates_the_docs_give_for_bh_over_looks():
    """BH at each look's nominal level, 6 rules, looks at 4, 8 and 12 seeds: over the looks the false
    discovery rate passes alpha under no effect (docs: 0.0525), while bh_spent stays within it."""
    design = _design("spending_obrien_fleming", "bh")
    # the same studies for both, and each look's p-values computed once for both
    studies = _studies(np.zeros(6), 200_000, 11)
    p_values = [_p_values(studies, n) for n in design.looks]
    nominal = _rates(design, "bh", np.zeros(6), studies, p_values)
    spent = _rates(design, "bh_spent", np.zeros(6), studies, p_values)
    se = math.sqrt(ALPHA * (1 - ALPHA) / 200_000)
    assert nominal["fdr"] > ALPHA + 2 * se and abs(nominal["fdr"] - 0.0525) < 3 * se
    assert spent["fdr"] < ALPHA


@pytest.mark.parametrize("correction", sorted(c for c, rate in STATED.items() if rate != "fwer"))
def test_every_correction_that_does_not_state_the_family_wise_error_fails_that_claim(correction):
    """The rate check can fail: each correction offered that states a weaker rate than the family-wise
    error (BH at each look, BH at the alpha spent, none), claimed as family-wise with real effects
    beside null rules, exceeds it (issue 83: bh_spent makes 0.059 false decisions against 0.05)."""
    design = _design("spending_obrien_fleming", correction)
    effects = np.array([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    partial = _rates(design, correction, effects, _studies(effects, STUDIES, 12))
    assert partial["fwer"] > ALPHA + TOLERANCE, partial


# ------------------------------------------------------------------------------------------------
# A collapsed seed (issue 62, item 2): a run that stopped learning puts one seed's difference far out


def _collapsed_seed_shape(studies: int, rules: int, seed: int, centre: str) -> np.ndarray:
    """(studies, rules, seeds) per-seed differences: t(3) noise of scale 1, except that a seed
    collapses with probability 1/12 (one in Study 3's 12) and then lies at -7 (Study 3: about -0.5,
    where the differences' s.d. was 0.12, a t(3) scale of 0.07). ``centre``: the estimand made exactly 0, the mean (the t
    test's) or the median (the sign test's)."""
    rng = np.random.default_rng(seed)
    q, far = 1 / 12, -7.0
    collapsed = rng.random((studies, rules, LOOKS[-1])) < q
    noise = rng.standard_t(3, (studies, rules, LOOKS[-1]))
    # mean: q far + (1 - q) c = 0; median: q + (1 - q) T3(-c) = 1/2
    c = -q * far / (1 - q) if centre == "mean" else -float(st.t.ppf((0.5 - q) / (1 - q), 3))
    return np.where(collapsed, far, noise + c)


@pytest.mark.parametrize(
    ("kind", "correction"),
    [("fixed", "holm"), ("spending_obrien_fleming", "holm"), ("spending_obrien_fleming", "bh_spent")],
)
def test_the_reference_decides_what_judge_looks_decides_for_the_sign_test(kind, correction):
    design = _design(kind, correction)
    rng = np.random.default_rng(len(kind) + 3 * len(correction))
    effects = rng.choice([0.0, 0.0, 0.8, 1.5], size=(100, 4, 1))
    d = np.round(rng.standard_normal((100, 4, LOOKS[-1])) + effects, 1)  # rounded: some exact zeros
    d[::4, 3] = 0.0  # a rule whose differences are all 0 has no p-value; it must not void the others
    mine = reference_decisions(design, correction, d, test="sign")
    rules = replace(_rules(4, test="sign"), design=design)
    for s in range(100):
        looks = judge_looks(
            {f"H{i}": dict(enumerate(d[s, i])) for i in range(4)}, rules, list(range(LOOKS[-1]))
        )
        theirs = [[j.outcome in SETTLED for j in look] for look in looks]
        assert theirs == mine[:, s].tolist(), f"study {s}"


@pytest.mark.parametrize("kind", ["fixed", "spending_obrien_fleming"])
@pytest.mark.parametrize("rules", [1, 2])
def test_the_sign_test_holds_its_rate_with_a_collapsed_seed_and_the_t_test_does_not(kind, rules):
    """Study 3's primary family (2 rules, Holm) and a single rule: the median's sign test keeps the
    family-wise error within alpha when seeds collapse; the mean's t-test, under the same shape
    with mean 0, passes it (about 0.10-0.12 for one rule)."""
    design = _design(kind, "holm")
    sign = reference_decisions(design, "holm", _collapsed_seed_shape(STUDIES, rules, 5, "median"), "sign")
    t = reference_decisions(design, "holm", _collapsed_seed_shape(STUDIES, rules, 5, "mean"), "t")
    sign_rate, t_rate = float(sign[-1].any(-1).mean()), float(t[-1].any(-1).mean())
    assert sign_rate <= ALPHA + TOLERANCE, f"sign test at {sign_rate:.4f}"
    assert t_rate > ALPHA + 5 * TOLERANCE, f"t-test at {t_rate:.4f}"


def test_the_sign_test_holds_its_rate_under_partial_nulls_of_any_shape():
    """Two rules with a real shift beside two null ones, the nulls skewed by collapsed seeds: Holm's
    family-wise error over the null rules stays within alpha."""
    design = _design("spending_obrien_fleming", "holm")
    d = _collapsed_seed_shape(STUDIES, 4, 9, "median")
    d[:, :2] += 1.5
    settled = reference_decisions(design, "holm", d, "sign")
    rate = float(settled[-1][:, 2:].any(-1).mean())
    assert rate <= ALPHA + TOLERANCE, f"sign test at {rate:.4f}"
