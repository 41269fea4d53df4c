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


def _random_independent(
    rng: np.random.Generator, problem: str = "p", n: int | None = None
) -> IndependentSamples:
    n = n or int(rng.integers(1, 9))
    clusters = [None if rng.random() < 0.2 else int(rng.integers(0, 4)) for _ in range(n)]
    right = int(rng.integers(0, 4))  # the gold's class
    return IndependentSamples(
        problem,
        tuple(int(x) for x in rng.integers(1, 40, n)),
        tuple(c == right for c in clusters),
        tuple(clusters),
    )


def _brute_force(samples: IndependentSamples, metric: str, k: int) -> float:
    """The mean of ``metric`` over every k-subset of the samples, counted by hand."""
    values = []
    for subset in itertools.combinations(range(samples.n), k):
        leaves = Leaves(
            "p", 0, tuple(samples.correct[i] for i in subset), tuple(samples.clusters[i] for i in subset)
        )
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
    # each draw takes the k samples of lowest rank in a uniform random order: (draws, n) chosen masks
    ranks = rng.random((draws, samples.n)).argsort(axis=1).argsort(axis=1)
    chosen = ranks < ks[:, None]
    spent = chosen @ np.array(samples.lengths, dtype=float)
    # what each subset finds, from Leaves itself, looked up by the subset's bits
    subset = chosen @ (1 << np.arange(samples.n))
    members = [[j for j in range(samples.n) if bits >> j & 1] for bits in range(1 << samples.n)]
    found = {}
    for m in EQUAL_COST_METRICS:
        table = np.array(
            [
                Leaves(
                    "p", 0, tuple(samples.correct[j] for j in js), tuple(samples.clusters[j] for j in js)
                ).value(m)
                for js in members
            ]
        )
        found[m] = table[subset]
    assert abs(spent.mean() - tokens) < 4 * spent.std() / math.sqrt(draws) + 1e-9
    for m in EQUAL_COST_METRICS:
        hand = (1 - fraction) * _brute_force(samples, m, whole) + (
            fraction * _brute_force(samples, m, whole + 1) if fraction else 0.0
        )
        assert math.isclose(samples.at_cost(m, tokens), hand, abs_tol=1e-12)
        assert abs(found[m].mean() - hand) < 4 * found[m].std() / math.sqrt(draws) + 1e-9


def test_at_cost_refuses_a_cost_beyond_the_samples_drawn():
    samples = IndependentSamples("q7", (10, 10, 10, 10), (True, False, False, False), (0, 1, 1, None))
    assert samples.at_cost("solved", 40) == 1.0  # all four: certain to include the correct one
    with pytest.raises(
        ValueError, match=r"problem q7: equal cost needs 4.10 independent samples, but only 4"
    ):
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
    assert paired_differences(trees[2:], independent, "distinct_answers") == pytest.approx(
        {"b": 1 - (5 / 6 + 1 / 2)}
    )
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
    from semrl.studies.explore_run import read_calls, read_records
    from semrl.studies.explore_summary import rule_differences_by_problem, summarize
    from semrl.studies.rules_file import load_rules
    from tests.helpers import DIGIT_SYSTEM_PROMPT, write_seven_task

    task = write_seven_task(tmp_path / "seven.jsonl")
    out = tmp_path / "explore"
    args = [
        "explore",
        "--methods",
        "treepo",
        "rose",
        "fr3e",
        "--seeds",
        "0",
        "1",
        "--data",
        str(task),
        "--limit",
        "5",
        "--independent-samples",
        "16",
        "--output",
        str(out),
        f"model.name={digit_model_dir}",
        f"data.system_prompt={DIGIT_SYSTEM_PROMPT}",
        "rollout.group_size=4",
        "rollout.max_new_tokens=8",
        "treepo.segment_length=2",
        "reward.num_workers=1",
    ]
    assert main(args) == 0
    records = read_records(out)
    assert sorted({(r.method, r.seed) for r in records}) == [
        ("fr3e", 0),
        ("fr3e", 1),
        ("independent", 0),
        ("rose", 0),
        ("rose", 1),
        ("treepo", 0),
        ("treepo", 1),
    ]
    assert all(
        sum(1 for r in records if (r.method, r.seed) == key) == 5
        for key in {(r.method, r.seed) for r in records}
    )
    one_digit = 0
    for r in records:
        texts = [text.strip() for text in r.responses]
        # the model mostly answers one digit (FR3E's leaves that continue an anchor read it from the
        # prefix); the recount reads those leaves
        digits = [
            (d, ok, c)
            for d, ok, c in zip(texts, r.correct, r.clusters, strict=True)
            if len(d) == 1 and d.isdigit()
        ]
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
    calls = read_calls(out)
    # one call per (method, seed) at the default batch: its problems, seconds and the tokens sampled
    assert [(c["method"], c["seed"], len(c["problems"])) for c in calls] == [
        ("independent", 0, 5),
        *[(m, s, 5) for s in (0, 1) for m in ("treepo", "rose", "fr3e")],
    ]
    for call in calls:
        mine = [r for r in records if (r.method, r.seed) == (call["method"], call["seed"])]
        assert call["sampled_tokens"] == sum(r.sampled_tokens for r in mine) and call["rollout_s"] > 0
    assert summary == json.loads(json.dumps(summarize(records, calls)))
    assert summary["methods"]["rose"]["solved"]["equal_time"]["problems"] > 0
    reference = {
        r.problem: IndependentSamples(r.problem, tuple(r.lengths), tuple(r.correct), tuple(r.clusters))
        for r in records
        if r.method == "independent"
    }
    for method in ("treepo", "rose"):
        leaves = [
            Leaves(r.problem, r.sampled_tokens, tuple(r.correct), tuple(r.clusters))
            for r in records
            if r.method == method
        ]
        d = paired_differences(leaves, reference, "solved")
        assert summary["methods"][method]["solved"]["mean"] == pytest.approx(float(np.mean(list(d.values()))))
    size = (out / "records.jsonl").stat().st_size
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        yaml.safe_dump(
            {
                "design": {"type": "fixed", "looks": [5]},
                "families": {"primary": "holm"},
                "rules": [
                    {
                        "id": "E1",
                        "metric": "distinct_answers",
                        "pair": ["rose", "independent"],
                        "expect": "greater",
                        "margin": 0.1,
                        "test": "sign",
                    },
                    {
                        "id": "E2",
                        "metric": "solved",
                        "pair": ["rose", "treepo"],
                        "expect": "greater",
                        "margin": 0.05,
                    },
                ],
            }
        )
    )
    assert main([*args, "--decide", str(rules)]) == 0
    assert (out / "records.jsonl").stat().st_size == size  # resumed: nothing redone
    diffs, order = rule_differences_by_problem(records, load_rules(rules))

    def of(method: str, metric: str) -> dict[str, float]:
        rollouts = [
            Leaves(r.problem, r.sampled_tokens, tuple(r.correct), tuple(r.clusters))
            for r in records
            if r.method == method
        ]
        return paired_differences(rollouts, reference, metric)

    assert order == [f"s{i}" for i in range(5)]
    rose_answers = of("rose", "distinct_answers")
    assert diffs["E1"] == pytest.approx({i: rose_answers[p] for i, p in enumerate(order)})
    solved = {m: of(m, "solved") for m in ("rose", "treepo")}
    assert diffs["E2"] == pytest.approx(
        {i: solved["rose"][p] - solved["treepo"][p] for i, p in enumerate(order)}
    )
    (look,) = [json.loads(line) for line in (out / "looks.jsonl").read_text().splitlines()]
    assert look["seeds"] == list(range(5)) and [r["id"] for r in look["rules"]] == ["E1", "E2"]
    decisions = (out / "decisions.md").read_text()
    assert "Exploration rules, look 1 of 1 at 5 problems" in decisions
    header = next(line for line in decisions.splitlines() if line.startswith("| rule |"))
    assert "| problems |" in header and "(problems) |" in header and "seeds" not in header  # the unit
    # two problems per engine call: every seeded method's records are the same, each problem's cost
    # counted under its prompt; LATR's lookahead rows are counted per prompt too (explore_batch
    # checks that the per-prompt counts add up to the engine's)
    small = tmp_path / "small-batches"
    assert (
        main(
            [
                *args[:-6],
                "--methods",
                "treepo",
                "rose",
                "fr3e",
                "latr",
                "--output",
                str(small),
                "--batch-problems",
                "2",
                *args[-6:],
            ]
        )
        == 0
    )
    batched = {(r.method, r.seed, r.problem): r for r in read_records(small)}
    assert all(batched[(r.method, r.seed, r.problem)] == r for r in records)
    assert sum(1 for key in batched if key[0] == "latr") == 10
    bad = tmp_path / "bad.yaml"
    bad.write_text(rules.read_text().replace("metric: solved", "metric: eval/pass@1"))
    with pytest.raises(ConfigError, match="rule E2: an exploration rule compares one of solved"):
        rule_differences_by_problem(records, load_rules(bad))


@pytest.mark.parametrize("seed", range(10))
def test_equal_time_prices_each_problem_at_its_share_of_its_calls_seconds(seed):
    """At equal seconds, a problem's rollout is compared with independent sampling at the tokens that
    independent sampling samples in the problem's share of its call's seconds (shared by sampled
    tokens), at independent sampling's pooled throughput; recomputed by hand on random records and
    calls, with a rollout whose equal time needs more samples than were drawn left out."""
    from semrl.studies.explore_run import INDEPENDENT, Explored
    from semrl.studies.explore_summary import equal_time_differences, summarize

    rng = np.random.default_rng(seed)
    problems = [f"q{i}" for i in range(6)]

    def explored(method: str, s: int, problem: str, n: int) -> Explored:
        lengths = [int(x) for x in rng.integers(1, 30, n)]
        clusters = [None if rng.random() < 0.2 else int(rng.integers(0, 3)) for _ in range(n)]
        return Explored(
            method,
            s,
            problem,
            sum(lengths) if method == INDEPENDENT else int(rng.integers(5, 60)),
            lengths,
            [c == 0 for c in clusters],
            clusters,
            [""] * n,
        )

    records = [explored(INDEPENDENT, 0, p, 12) for p in problems]
    records += [explored("tree", s, p, 4) for s in (0, 1) for p in problems]
    calls = [
        {
            "method": INDEPENDENT,
            "seed": 0,
            "problems": problems[:4],
            "rollout_s": 3.0,
            "sampled_tokens": sum(r.sampled_tokens for r in records[:4]),
        },
        {
            "method": INDEPENDENT,
            "seed": 0,
            "problems": problems[4:],
            "rollout_s": 1.0 + rng.random(),
            "sampled_tokens": sum(r.sampled_tokens for r in records[4:6]),
        },
    ]
    for s in (0, 1):
        for part in (problems[:3], problems[3:]):
            spent = sum(
                r.sampled_tokens for r in records if (r.method, r.seed) == ("tree", s) and r.problem in part
            )
            calls.append(
                {
                    "method": "tree",
                    "seed": s,
                    "problems": part,
                    "rollout_s": float(rng.uniform(0.2, 3)),
                    "sampled_tokens": spent,
                }
            )
    rate = sum(c["sampled_tokens"] for c in calls[:2]) / sum(c["rollout_s"] for c in calls[:2])
    reference = {
        r.problem: IndependentSamples(r.problem, tuple(r.lengths), tuple(r.correct), tuple(r.clusters))
        for r in records[:6]
    }
    for metric in EQUAL_COST_METRICS:
        expected: dict[str, list[float]] = {}
        left_out = 0
        for call in calls[2:]:
            mine = [
                r
                for r in records
                if r.method == "tree" and r.seed == call["seed"] and r.problem in call["problems"]
            ]
            total = sum(r.sampled_tokens for r in mine)
            for r in mine:
                tokens = call["rollout_s"] * r.sampled_tokens / total * rate
                if tokens > reference[r.problem].mean_length * 12:
                    left_out += 1
                    continue
                value = r.leaves().value(metric) - reference[r.problem].at_cost(metric, tokens)
                expected.setdefault(r.problem, []).append(value)
        got, got_left_out = equal_time_differences(records, calls, "tree", metric)
        assert got_left_out == left_out
        assert got == pytest.approx({p: float(np.mean(v)) for p, v in expected.items()})
        assert summarize(records, calls)["methods"]["tree"][metric]["equal_time"]["problems"] == len(expected)


def test_records_read_compressed_and_a_torn_line_is_dropped_before_appending(tmp_path):
    """A committed study's records.jsonl.gz reads as the plain log; appending to it is refused with
    the command that decompresses it; a torn last line (a run killed mid-write) is cut before the
    next record is appended, so that record is read back."""
    import gzip
    import json

    from semrl.errors import ConfigError
    from semrl.studies.explore_run import RECORDS, Explored, _appendable, read_records

    rows = [Explored("rose", 0, f"q{i}", 10 + i, [3], [True], [0], ["7"]) for i in range(3)]
    text = "".join(json.dumps(r.record()) + "\n" for r in rows)
    (tmp_path / (RECORDS + ".gz")).write_bytes(gzip.compress(text.encode()))
    assert read_records(tmp_path) == rows
    with pytest.raises(ConfigError, match="gunzip"):
        _appendable(tmp_path / RECORDS)
    (tmp_path / (RECORDS + ".gz")).unlink()
    (tmp_path / RECORDS).write_text(text + text.splitlines()[0][:25])
    assert read_records(tmp_path) == rows  # the torn line is skipped
    _appendable(tmp_path / RECORDS)
    with (tmp_path / RECORDS).open("a") as log:
        log.write(json.dumps(rows[0].record()) + "\n")
    assert read_records(tmp_path) == [*rows, rows[0]]
