"""Exploration at equal cost (issue 62, item 4): the equal-cost reference against brute force over
every subset of the independent samples and a simulated randomised-rounding sampler, and the
per-problem differences by hand."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from semrl.studies.explore import (
    EQUAL_COST_METRICS,
    IndependentSamples,
    Leaves,
    paired_differences,
    per_token,
)


def _random_independent(rng: np.random.Generator, problem: str = "p", n: int | None = None) -> IndependentSamples:
    n = n or int(rng.integers(1, 9))
    clusters = [None if rng.random() < 0.2 else int(rng.integers(0, 4)) for _ in range(n)]
    right = int(rng.integers(0, 4))  # the gold's class
    return IndependentSamples(problem, tuple(int(x) for x in rng.integers(1, 40, n)),
                              tuple(c == right for c in clusters), tuple(clusters))


def _brute_force(samples: IndependentSamples, metric: str, k: int) -> float:
    """The mean of ``metric`` over every k-subset of the samples, counted by hand."""
    values = []
    for subset in itertools.combinations(range(samples.n), k):
        leaves = Leaves("p", 0, tuple(samples.correct[i] for i in subset), tuple(samples.clusters[i] for i in subset))
        values.append(leaves.value(metric))
    return float(np.mean(values))


@pytest.mark.parametrize("seed", range(40))
def test_independent_sampling_at_k_is_the_mean_over_every_subset(seed):
    rng = np.random.default_rng(seed)
    samples = _random_independent(rng)
    for metric in EQUAL_COST_METRICS:
        for k in range(samples.n + 1):
            assert math.isclose(samples.at_k(metric, k), _brute_force(samples, metric, k), abs_tol=1e-12)


def test_leaves_count_by_hand():
    leaves = Leaves("p", 100, (False, True, True, False, False), (3, 1, 1, None, 2))
    assert leaves.value("solved") == 1.0
    assert leaves.value("distinct_answers") == 3.0  # classes 3, 1, 2; the unanswered leaf is none
    assert leaves.value("distinct_correct") == 1.0
    assert Leaves("p", 10, (False,), (None,)).value("solved") == 0.0
    with pytest.raises(ValueError, match="unknown metric"):
        leaves.value("pass@2")
    with pytest.raises(ValueError, match="a correct leaf without an answer class"):
        Leaves("p", 10, (True,), (None,))


@pytest.mark.parametrize("seed", range(20))
def test_at_cost_interpolates_between_whole_sample_counts_and_a_randomised_sampler_spends_that_cost(seed):
    """By hand: the linear interpolation at k* = tokens / mean length. Simulated: independent sampling
    that draws floor(k*) or floor(k*) + 1 samples without replacement, mixed by the fraction, spends
    ``tokens`` on average and reaches ``at_cost`` on average."""
    rng = np.random.default_rng(100 + seed)
    samples = _random_independent(rng, n=int(rng.integers(2, 9)))
    tokens = float(rng.uniform(0, samples.n * samples.mean_length))
    k_star = tokens / samples.mean_length
    whole, fraction = math.floor(k_star), k_star - math.floor(k_star)
    draws = 40_000
    ks = whole + (rng.random(draws) < fraction)
    spent, found = np.zeros(draws), {m: np.zeros(draws) for m in EQUAL_COST_METRICS}
    lengths = np.array(samples.lengths)
    for i, k in enumerate(ks):
        chosen = rng.permutation(samples.n)[:k]
        spent[i] = lengths[chosen].sum()
        leaves = Leaves("p", 0, tuple(samples.correct[j] for j in chosen), tuple(samples.clusters[j] for j in chosen))
        for m in EQUAL_COST_METRICS:
            found[m][i] = leaves.value(m)
    assert abs(spent.mean() - tokens) < 4 * spent.std() / math.sqrt(draws) + 1e-9
    for m in EQUAL_COST_METRICS:
        hand = (1 - fraction) * _brute_force(samples, m, whole) + (
            fraction * _brute_force(samples, m, whole + 1) if fraction else 0.0)
        assert math.isclose(samples.at_cost(m, tokens), hand, abs_tol=1e-12)
        assert abs(found[m].mean() - hand) < 4 * found[m].std() / math.sqrt(draws) + 1e-9


def test_at_cost_refuses_a_cost_beyond_the_samples_drawn():
    samples = IndependentSamples("q7", (10, 10, 10, 10), (True, False, False, False), (0, 1, 1, None))
    assert samples.at_cost("solved", 40) == 1.0  # all four: certain to include the correct one
    with pytest.raises(ValueError, match=r"problem q7: equal cost needs 4.10 independent samples, but only 4"):
        samples.at_cost("solved", 41)


def test_paired_differences_average_each_problems_rollouts_at_their_own_cost():
    independent = {
        "a": IndependentSamples("a", (10,) * 4, (True, False, False, False), (0, 1, 2, 1)),
        "b": IndependentSamples("b", (20,) * 4, (False,) * 4, (0, 0, 1, None)),
    }
    trees = [
        Leaves("a", 15, (False, True), (1, 0)),  # k* 1.5: 1 - (0.5 * 3/4 + 0.5 * 1/2) = 0.375
        Leaves("a", 20, (False, False), (1, 1)),  # k* 2: 1 - 1/2 = 0.5
        Leaves("b", 40, (False, False, False), (0, 0, 0)),  # k* 2: never solved
    ]
    d = paired_differences(trees, independent, "solved")
    assert d == pytest.approx({"a": ((1 - 0.375) + (0 - 0.5)) / 2, "b": 0.0})
    # distinct answers of b at k* 2: classes of sizes 2 and 1 among 4: (1 - 1/6) + (1 - 1/2)
    assert paired_differences(trees[2:], independent, "distinct_answers") == pytest.approx({"b": 1 - (5 / 6 + 1 / 2)})
    with pytest.raises(ValueError, match="problem z has no independent samples"):
        paired_differences([Leaves("z", 5, (True,), (0,))], independent, "solved")
    assert per_token(trees, "solved") == pytest.approx(1000 * 1 / 75)


def test_semrl_explore_counts_what_a_hand_recount_of_its_leaves_gives(digit_model_dir, tmp_path):
    """``semrl explore`` on the tiny model taught to answer a random digit, for problems whose answer
    is 7: every response is one digit (FR3E's too, whose leaves continue a prefix of a response), each
    record's verdicts and answer classes equal a recount from its responses (correct: the digit is 7;
    classes: equal digits), independent sampling's cost is the sum of its responses'
    lengths, a tree's cost is at most its leaves' lengths summed, the summary's equal-cost
    differences are ``paired_differences`` of the records, and a re-run adds nothing."""
    import json

    import yaml

    from semrl.cli import main
    from semrl.errors import ConfigError
    from semrl.studies.designs import load_rules
    from semrl.studies.explore_run import read_records, rule_differences_by_problem, summarize

    from .conftest import DIGIT_SYSTEM_PROMPT, write_seven_task

    task = write_seven_task(tmp_path / "seven.jsonl")
    out = tmp_path / "explore"
    args = ["explore", "--methods", "treepo", "rose", "fr3e", "--seeds", "0", "1", "--data", str(task), "--limit", "5",
            "--independent-samples", "16", "--output", str(out), f"model.name={digit_model_dir}",
            f"data.system_prompt={DIGIT_SYSTEM_PROMPT}", "rollout.group_size=4", "rollout.max_new_tokens=8",
            "treepo.segment_length=2", "reward.num_workers=1"]
    assert main(args) == 0
    records = read_records(out)
    assert sorted({(r.method, r.seed) for r in records}) == [("fr3e", 0), ("fr3e", 1), ("independent", 0),
                                                             ("rose", 0), ("rose", 1), ("treepo", 0), ("treepo", 1)]
    assert all(sum(1 for r in records if (r.method, r.seed) == key) == 5 for key in {(r.method, r.seed) for r in records})
    one_digit = 0
    for r in records:
        texts = [text.strip() for text in r.responses]
        # the model mostly answers one digit (FR3E's leaves that continue an anchor read it from the
        # prefix); the recount reads those leaves
        digits = [(d, ok, c) for d, ok, c in zip(texts, r.correct, r.clusters, strict=True)
                  if len(d) == 1 and d.isdigit()]
        one_digit += len(digits)
        assert all(ok == (d == "7") and c is not None for d, ok, c in digits), (r.method, texts)
        # one class per distinct digit
        assert all((a == b) == (x == y) for (a, _, x), (b, _, y) in itertools.combinations(digits, 2))
        if r.method == "independent":
            assert len(r.lengths) == 16 and r.sampled_tokens == sum(r.lengths)
        else:
            assert len(r.lengths) == 4 and 0 < r.sampled_tokens <= sum(r.lengths)
    assert any(any(r.correct) for r in records) and not all(all(r.correct) for r in records)  # not vacuous
    assert one_digit >= 0.9 * sum(len(r.responses) for r in records)
    summary = json.loads((out / "summary.json").read_text())
    assert summary == json.loads(json.dumps(summarize(records)))
    reference = {r.problem: IndependentSamples(r.problem, tuple(r.lengths), tuple(r.correct), tuple(r.clusters))
                 for r in records if r.method == "independent"}
    for method in ("treepo", "rose"):
        leaves = [Leaves(r.problem, r.sampled_tokens, tuple(r.correct), tuple(r.clusters))
                  for r in records if r.method == method]
        d = paired_differences(leaves, reference, "solved")
        assert summary["methods"][method]["solved"]["mean"] == pytest.approx(float(np.mean(list(d.values()))))
    size = (out / "records.jsonl").stat().st_size
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({
        "design": {"type": "fixed", "looks": [5]}, "families": {"primary": "holm"},
        "rules": [
            {"id": "E1", "metric": "distinct_answers", "pair": ["rose", "independent"], "expect": "greater",
             "margin": 0.1, "test": "sign"},
            {"id": "E2", "metric": "solved", "pair": ["rose", "treepo"], "expect": "greater", "margin": 0.05},
        ],
    }))
    assert main([*args, "--decide", str(rules)]) == 0
    assert (out / "records.jsonl").stat().st_size == size  # resumed: nothing redone
    diffs, order = rule_differences_by_problem(records, load_rules(rules))

    def of(method: str, metric: str) -> dict[str, float]:
        rollouts = [Leaves(r.problem, r.sampled_tokens, tuple(r.correct), tuple(r.clusters))
                    for r in records if r.method == method]
        return paired_differences(rollouts, reference, metric)

    assert order == [f"s{i}" for i in range(5)]
    rose_answers = of("rose", "distinct_answers")
    assert diffs["E1"] == pytest.approx({i: rose_answers[p] for i, p in enumerate(order)})
    solved = {m: of(m, "solved") for m in ("rose", "treepo")}
    assert diffs["E2"] == pytest.approx({i: solved["rose"][p] - solved["treepo"][p] for i, p in enumerate(order)})
    (look,) = [json.loads(line) for line in (out / "looks.jsonl").read_text().splitlines()]
    assert look["seeds"] == list(range(5)) and [r["id"] for r in look["rules"]] == ["E1", "E2"]
    assert "Exploration rules, look 1 of 1 at 5 problems" in (out / "decisions.md").read_text()
    # two problems per engine call: every seeded method's records are the same, each problem's cost
    # counted under its prompt; LATR's lookahead rows are counted per prompt too (explore_batch
    # checks that the per-prompt counts add up to the engine's)
    small = tmp_path / "small-batches"
    assert main([*args[:-6], "--methods", "treepo", "rose", "fr3e", "latr", "--output", str(small),
                 "--batch-problems", "2", *args[-6:]]) == 0
    batched = {(r.method, r.seed, r.problem): r for r in read_records(small)}
    assert all(batched[(r.method, r.seed, r.problem)] == r for r in records)
    assert sum(1 for key in batched if key[0] == "latr") == 10
    bad = tmp_path / "bad.yaml"
    bad.write_text(rules.read_text().replace("metric: solved", "metric: eval/pass@1"))
    with pytest.raises(ConfigError, match="rule E2: an exploration rule compares one of solved"):
        rule_differences_by_problem(records, load_rules(bad))
