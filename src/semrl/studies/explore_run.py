"""Running the exploration comparison (``semrl explore``): each rollout method samples every
problem at a fixed policy, each leaf is verified and its answer clustered, and one record per
(method, seed, problem) goes to ``records.jsonl``; the summary compares every method with
independent sampling at equal cost, problem by problem (``semrl.studies.explore``).

Many problems share an engine call (``batch_problems``); the tokens the engine sampled under a
problem's prompt are exactly its cost (``Engine.sampled_by_prompt``), and every request of the seeded
methods draws from (seed, problem, node), so a problem's records do not depend on its batch.
Independent sampling draws
``independent_samples`` responses per problem once, with the first seed: it is the reference every
method's rollouts are priced against. A re-run into the same directory skips the records already
there, so an interrupted comparison continues.
"""

from __future__ import annotations

import json
import math
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from semrl.config.sections import Config
from semrl.core.jsonl import read_jsonl, stored
from semrl.data import Problem, PromptFormat
from semrl.errors import ConfigError
from semrl.methods.catalog import get_method
from semrl.methods.interface import RolloutContext, RolloutFn
from semrl.methods.registry import load, method_config
from semrl.methods.semantic_entropy import cluster_answers
from semrl.reward import VerifierPool, score_responses
from semrl.rollout.engines import Engine, GenerationRequest, node_seed, sampling_params
from semrl.studies.designs import (
    JUDGED_HEADER,
    LOOKS_LOG,
    Judged,
    complete_seeds,
    judge_looks,
    judged_rows,
    log_looks,
)
from semrl.studies.explore import (
    EQUAL_COST_METRICS,
    IndependentSamples,
    Leaves,
    paired_differences,
    per_token,
)
from semrl.studies.rules_file import RulesFile
from semrl.studies.stats import median_interval, paired_t, sign_p_value
from semrl.update.row_logprobs import with_sampling_entropy

RECORDS = "records.jsonl"
CALLS = "calls.jsonl"  # one line per engine call: its problems, rollout seconds and engine cost
INDEPENDENT = "independent"


@dataclass(frozen=True)
class Explored:
    """One method's rollout of one problem, as ``records.jsonl`` holds it."""

    method: str
    seed: int
    problem: str
    sampled_tokens: int
    lengths: list[int]
    correct: list[bool]
    clusters: list[int | None]
    responses: list[str]

    def leaves(self) -> Leaves:
        """What ``semrl.studies.explore`` compares of this rollout."""
        return Leaves(self.problem, self.sampled_tokens, tuple(self.correct), tuple(self.clusters))

    def record(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "seed": self.seed,
            "problem": self.problem,
            "sampled_tokens": self.sampled_tokens,
            "lengths": self.lengths,
            "correct": self.correct,
            "clusters": self.clusters,
            "responses": self.responses,
        }


def _verified(
    method: str,
    seed: int,
    problem: Problem,
    responses: Sequence[list[int]],
    sampled: int,
    decode: Callable[[list[int]], str],
    pool: VerifierPool,
    fallback: bool,
) -> Explored:
    """The leaves' whole responses decoded, verified against the problem's answer and clustered by
    equivalence."""
    texts = [decode(ids) for ids in responses]
    rewards = score_responses(pool, texts, [problem.answer] * len(texts), final_number_fallback=fallback)
    answers = [r.answer for r in rewards]
    ids = cluster_answers(answers, lambda a, b: pool.verify_many([(a, b)])[0].correct)
    clusters = [c if a is not None else None for c, a in zip(ids, answers, strict=True)]
    return Explored(
        method,
        seed,
        problem.id,
        sampled,
        [len(ids) for ids in responses],
        [bool(r.correct) for r in rewards],
        clusters,
        texts,
    )


def problem_seed(seed: int, problem: str) -> int:
    """The seed of one problem's rollout under rollout seed ``seed``: a tree's requests derive theirs
    from it and their node (``engines.node_seed``), so a problem's tokens do not depend on which
    problems share its engine call."""
    key = [seed, zlib.crc32(problem.encode("utf-8"))]
    return int(np.random.SeedSequence(key).generate_state(1, np.uint64)[0] >> 1)


def explore_batch(
    method: str,
    seed: int,
    problems: Sequence[Problem],
    prompt_ids: Sequence[list[int]],
    engine: Engine,
    cfg: Config,
    model: torch.nn.Module,
    decode: Callable[[list[int]], str],
    pool: VerifierPool,
    leaves: int,
) -> tuple[list[Explored], dict[str, Any]]:
    """(the records, the call's record for ``calls.jsonl``: its problems, rollout seconds and
    ``EngineCost``). One rollout of each problem, all in one engine call: ``leaves`` independent samples
    (``method == 'independent'``), or the method's registry rollout with its config section. A
    leaf's length is its whole response, a shared prefix included; a problem's cost is what the
    engine sampled under its prompt (``Engine.sampled_by_prompt``), so the prompts must differ.

    Every request of independent sampling, ROSE, TreePO and FR3E draws from (seed, problem, node),
    so their records do not depend on the batch; LATR's finishing requests draw from one stream."""
    if len({tuple(ids) for ids in prompt_ids}) != len(prompt_ids):
        raise ValueError(
            "explore_batch: two problems of one call have the same prompt; their costs "
            "could not be told apart"
        )
    seeds = [problem_seed(seed, problem.id) for problem in problems]
    generator = torch.Generator().manual_seed(seed)
    before = engine.generated_tokens
    spent = engine.cost.snapshot()
    started = time.perf_counter()
    engine.sampled_by_prompt = Counter()
    try:
        prefixes: list[list[int]] | None = None
        if method == INDEPENDENT:
            params = sampling_params(cfg.rollout, top_logprobs=False)
            requests = [
                GenerationRequest(ids, seed=node_seed(s, i))
                for ids, s in zip(prompt_ids, seeds, strict=True)
                for i in range(leaves)
            ]
            gens = engine.generate(requests, params, generator)
        else:
            spec = get_method(method)
            params = sampling_params(cfg.rollout, top_logprobs=spec.reads_top_logprobs)
            entropy = partial(
                with_sampling_entropy,
                model,
                temperature=params.temperature,
                compute_dtype=engine.compute_dtype,
            )
            section = method_config(cfg, spec.section)
            ctx = RolloutContext(
                engine, params, generator, section, entropy, decode=decode, prompt_seeds=seeds
            )
            assert spec.rollout_fn is not None
            rollout: RolloutFn = load(spec.rollout_fn, ("ctx", "prompt_ids"), f"method {method}'s rollout_fn")
            out = rollout(ctx, list(prompt_ids))
            gens, prefixes = out.generations, out.sequence_prompt_ids
        cost = engine.sampled_by_prompt
    finally:
        engine.sampled_by_prompt = None
    call = {
        "method": method,
        "seed": seed,
        "problems": [p.id for p in problems],
        "rollout_s": time.perf_counter() - started,
        **vars(engine.cost.since(spent)),
    }
    if sum(cost.values()) != engine.generated_tokens - before:
        raise RuntimeError(
            f"{method}: {sum(cost.values())} sampled tokens counted per prompt, "
            f"{engine.generated_tokens - before} by the engine"
        )
    if len(gens) != leaves * len(problems):
        raise RuntimeError(f"{method}: {len(gens)} leaves for {len(problems)} problems of {leaves}")
    records = []
    for p, (problem, ids) in enumerate(zip(problems, prompt_ids, strict=True)):
        rows = range(p * leaves, (p + 1) * leaves)
        # a leaf that continues a prefix of the response (FR3E's anchors) is that prefix and its
        # continuation: the answer is read from the whole response
        responses = [
            (prefixes[i][len(ids) :] if prefixes is not None else []) + gens[i].token_ids.tolist()
            for i in rows
        ]
        records.append(
            _verified(
                method,
                seed,
                problem,
                responses,
                cost[tuple(ids)],
                decode,
                pool,
                cfg.reward.final_number_fallback,
            )
        )
    return records, call


def batches(problems: Sequence[Problem], prompt_ids: Sequence[list[int]], size: int) -> list[list[int]]:
    """The problems' indices in calls of at most ``size``, in order, a prompt at most once per call
    (its cost is counted per prompt)."""
    out: list[list[int]] = []
    current: list[int] = []
    seen: set[tuple[int, ...]] = set()
    for i, ids in enumerate(prompt_ids):
        if len(current) == size or tuple(ids) in seen:
            out.append(current)
            current, seen = [], set()
        current.append(i)
        seen.add(tuple(ids))
    return [*out, current] if current else out


def read_records(out_dir: Path) -> list[Explored]:
    """The records of ``out_dir``, plain or gzip-compressed (a committed study's); a torn last line
    (a run killed mid-write) is skipped."""
    return [Explored(**row) for row in read_jsonl(out_dir / RECORDS)]


def _appendable(path: Path) -> None:
    """Ready ``path`` for appending: refuse a compressed log without its plain copy (appending would
    start a new log beside it) and drop a torn last line, so that the next line starts clean."""
    if not path.exists() and stored(path) != path:
        raise ConfigError(f"{stored(path)} is compressed; decompress it to continue: gunzip {stored(path)}")
    if path.exists():
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            path.write_bytes(data[: data.rfind(b"\n") + 1])


def run_exploration(
    cfg: Config,
    methods: Sequence[str],
    seeds: Sequence[int],
    problems: Sequence[Problem],
    independent_samples: int,
    out_dir: Path,
    engine: Engine,
    model: torch.nn.Module,
    tokenizer: Any,
    progress: Callable[[str], None] | None = None,
    batch_problems: int = 32,
) -> list[Explored]:
    """Every (method, seed, problem) not yet in ``out_dir/records.jsonl``, ``batch_problems`` problems
    per engine call, each call's records appended as it finishes; independent sampling once per
    problem with the first seed. Returns every record."""
    if batch_problems < 1:
        raise ConfigError(f"--batch-problems must be >= 1, got {batch_problems}")
    out_dir.mkdir(parents=True, exist_ok=True)
    for log_path in (out_dir / RECORDS, out_dir / CALLS):
        _appendable(log_path)
    done = {(r.method, r.seed, r.problem) for r in read_records(out_dir)}
    prompt = PromptFormat.of(cfg.data)
    decode = partial(tokenizer.decode, skip_special_tokens=True)
    jobs = [(INDEPENDENT, seeds[0], independent_samples)] + [
        (m, s, cfg.rollout.group_size) for s in seeds for m in methods if m != INDEPENDENT
    ]
    reward = cfg.reward
    with (
        VerifierPool(reward.num_workers, reward.timeout_s, numeral_answers=reward.numeral_answers) as pool,
        (out_dir / RECORDS).open("a", encoding="utf-8") as log,
        (out_dir / CALLS).open("a", encoding="utf-8") as calls,
    ):
        for method, seed, leaves in jobs:
            todo = [p for p in problems if (method, seed, p.id) not in done]
            ids = [prompt.ids(tokenizer, p.problem) for p in todo]
            for batch in batches(todo, ids, batch_problems):
                t0 = time.perf_counter()
                records, call = explore_batch(
                    method,
                    seed,
                    [todo[i] for i in batch],
                    [ids[i] for i in batch],
                    engine,
                    cfg,
                    model,
                    decode,
                    pool,
                    leaves,
                )
                for record in records:
                    log.write(json.dumps(record.record()) + "\n")
                log.flush()
                calls.write(json.dumps(call) + "\n")
                calls.flush()
                if progress is not None:
                    tokens = sum(r.sampled_tokens for r in records)
                    correct = sum(sum(r.correct) for r in records)
                    progress(
                        f"{method} seed {seed} {records[0].problem}..{records[-1].problem} "
                        f"({len(records)} problems): {tokens} tokens, {correct}/{leaves * len(records)} "
                        f"correct, {time.perf_counter() - t0:.1f} s"
                    )
    return read_records(out_dir)


def read_calls(out_dir: Path) -> list[dict[str, Any]]:
    """The engine calls' log of ``out_dir`` (``CALLS``), plain or compressed."""
    return read_jsonl(out_dir / CALLS)


def problem_seconds(
    records: Sequence[Explored], calls: Sequence[dict[str, Any]]
) -> dict[tuple[str, int, str], float]:
    """(method, seed, problem) -> the rollout seconds of its engine call, shared among the call's
    problems in proportion to the tokens each sampled (a call's problems run together, so their
    own times are not observed; this is the share they would take at one throughput)."""
    tokens = {(r.method, r.seed, r.problem): r.sampled_tokens for r in records}
    out: dict[tuple[str, int, str], float] = {}
    for call in calls:
        keys = [(call["method"], call["seed"], p) for p in call["problems"]]
        total = sum(tokens.get(k, 0) for k in keys)
        for key in keys:
            if key in tokens:
                out[key] = call["rollout_s"] * (tokens[key] / total if total else 1 / len(keys))
    return out


def equal_time_differences(
    records: Sequence[Explored], calls: Sequence[dict[str, Any]], method: str, metric: str
) -> tuple[dict[str, float], int]:
    """(problem -> the method's ``metric`` minus independent sampling's at the same rollout seconds,
    averaged over the method's seeds; rollouts left out because equal time needs more independent
    samples than were drawn). Independent sampling's seconds become tokens at its own throughput
    (its sampled tokens over its rollout seconds, pooled over its calls); descriptive, since the
    seconds depend on the machine and on what else ran on it."""
    reference = _reference(records)
    seconds = problem_seconds(records, calls)
    independent = [c for c in calls if c["method"] == INDEPENDENT]
    spent = sum(c["rollout_s"] for c in independent)
    if not spent:
        return {}, 0
    rate = sum(c["sampled_tokens"] for c in independent) / spent
    per_problem: dict[str, list[float]] = {}
    left_out = 0
    for r in records:
        key = (r.method, r.seed, r.problem)
        if r.method != method or key not in seconds or r.problem not in reference:
            continue
        samples = reference[r.problem]
        tokens = seconds[key] * rate
        if tokens / samples.mean_length > samples.n:
            left_out += 1
            continue
        difference = r.leaves().value(metric) - samples.at_cost(metric, tokens)
        per_problem.setdefault(r.problem, []).append(difference)
    return {p: sum(d) / len(d) for p, d in per_problem.items()}, left_out


def summarize(records: Sequence[Explored], calls: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Per method and metric at equal cost: the mean over problems of method - independent, its
    95% t-interval, the median's sign-test interval and p-value, how many problems are above, at and
    below 0, and the method's metric per 1,000 sampled tokens beside independent sampling's. With
    the engine calls' log: each method's rollout seconds, and the mean difference at equal seconds
    (``equal_time_differences``)."""
    reference = _reference(records)
    by_method: dict[str, list[Leaves]] = {}
    for r in records:
        by_method.setdefault(r.method, []).append(r.leaves())
    out: dict[str, Any] = {"problems": len(reference), "methods": {}}
    for method, rollouts in by_method.items():
        row: dict[str, Any] = {
            "rollouts": len(rollouts),
            "sampled_tokens": sum(x.sampled_tokens for x in rollouts),
            "per_1k_tokens": {m: per_token(rollouts, m) for m in EQUAL_COST_METRICS},
        }
        if method != INDEPENDENT:
            for metric in EQUAL_COST_METRICS:
                d = list(paired_differences(rollouts, reference, metric).values())
                mean, low, high = paired_t(d)
                median, median_low, median_high = median_interval(d, 0.05)
                x = np.asarray(d)
                row[metric] = {
                    "mean": mean,
                    "t_interval": [low, high],
                    "median": median,
                    "sign_interval": [median_low, median_high],
                    "p_sign": sign_p_value(d),
                    "above_at_below": [int((x > 0).sum()), int((x == 0).sum()), int((x < 0).sum())],
                }
                if calls:
                    timed, left_out = equal_time_differences(records, calls, method, metric)
                    t_mean, t_low, t_high = paired_t(list(timed.values()))
                    row[metric]["equal_time"] = {
                        "mean": t_mean,
                        "t_interval": [t_low, t_high],
                        "problems": len(timed),
                        "rollouts_left_out": left_out,
                    }
        mine = [c for c in calls if c["method"] == method]
        if mine:
            seconds = sum(c["rollout_s"] for c in mine)
            row["rollout_s"] = seconds
            row["tokens_per_s"] = sum(c["sampled_tokens"] for c in mine) / seconds if seconds else math.nan
        out["methods"][method] = row
    return out


def summary_table(summary: dict[str, Any]) -> str:
    """The summary as Markdown: one row per method and metric."""
    lines = [
        f"{summary['problems']} problems; each method - independent sampling at equal sampled tokens, "
        "per problem (the unit), then over problems.\n",
        "| method | metric | mean difference | 95% t-interval | median | 95% sign-test interval | p (sign) "
        "| problems above / at / below 0 | per 1k tokens (method / independent) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    reference = summary["methods"].get(INDEPENDENT, {}).get("per_1k_tokens", {})

    def num(x: float) -> str:
        return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.3f}"

    for method, row in summary["methods"].items():
        if method == INDEPENDENT:
            continue
        for metric in EQUAL_COST_METRICS:
            c = row[metric]
            lines.append(
                f"| {method} | {metric} | {num(c['mean'])} "
                f"| [{num(c['t_interval'][0])}, {num(c['t_interval'][1])}] "
                f"| {num(c['median'])} | [{num(c['sign_interval'][0])}, {num(c['sign_interval'][1])}] "
                f"| {c['p_sign']:.3g} | {' / '.join(map(str, c['above_at_below']))} "
                f"| {row['per_1k_tokens'][metric]:.3f} / {reference.get(metric, math.nan):.3f} |"
            )
    timed = [(m, row) for m, row in summary["methods"].items() if "rollout_s" in row]
    if timed:
        lines += [
            "\nAt equal rollout seconds (descriptive: seconds depend on the machine and what shared it; a "
            "call's seconds are shared among its problems by their sampled tokens).\n",
            "| method | rollout s | sampled tokens / s | metric | mean difference at equal seconds "
            "| 95% t-interval | problems | rollouts left out |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for method, row in timed:
            for metric in EQUAL_COST_METRICS if method != INDEPENDENT else ():
                t = row[metric]["equal_time"]
                lines.append(
                    f"| {method} | {row['rollout_s']:.1f} | {row['tokens_per_s']:.1f} | {metric} "
                    f"| {num(t['mean'])} | [{num(t['t_interval'][0])}, {num(t['t_interval'][1])}] "
                    f"| {t['problems']} | {t['rollouts_left_out']} |"
                )
            if method == INDEPENDENT:
                lines.append(f"| {method} | {row['rollout_s']:.1f} | {row['tokens_per_s']:.1f} | | | | | |")
    return "\n".join(lines) + "\n"


def write_summary(out_dir: Path, records: Sequence[Explored]) -> dict[str, Any]:
    summary = summarize(records, read_calls(out_dir))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    (out_dir / "results.md").write_text(summary_table(summary), encoding="utf-8")
    return summary


def _reference(records: Sequence[Explored]) -> dict[str, IndependentSamples]:
    return {
        r.problem: IndependentSamples(r.problem, tuple(r.lengths), tuple(r.correct), tuple(r.clusters))
        for r in records
        if r.method == INDEPENDENT
    }


def rule_differences_by_problem(
    records: Sequence[Explored], rules_file: RulesFile
) -> tuple[dict[str, dict[int, float]], list[str]]:
    """(rule id -> problem index -> difference, the problems in data order): a rule's pair
    ``[variant, baseline]`` compares their equal-cost differences from independent sampling
    (``independent`` itself: 0), so that problems stand where seeds stand in a study's design."""
    reference = _reference(records)
    order = list(dict.fromkeys(r.problem for r in records if r.method == INDEPENDENT))
    methods = {r.method for r in records}
    out: dict[str, dict[int, float]] = {}
    for rule in rules_file.rules:
        if rule.metric not in EQUAL_COST_METRICS:
            raise ConfigError(
                f"rule {rule.id}: an exploration rule compares one of {', '.join(EQUAL_COST_METRICS)} "
                f"at equal cost, got {rule.metric!r}"
            )
        if rule.over != "last" or rule.window != 1:
            raise ConfigError(
                f"rule {rule.id}: an exploration rule has one value per problem; leave out over and window"
            )
        missing = [m for m in (rule.variant, rule.baseline) if m not in methods]
        if missing:
            raise ConfigError(
                f"rule {rule.id}: no records of {', '.join(missing)}; the records hold "
                f"{', '.join(sorted(methods))}"
            )
        differences = []
        for method in (rule.variant, rule.baseline):
            if method == INDEPENDENT:
                differences.append(dict.fromkeys(order, 0.0))
                continue
            rollouts = [r.leaves() for r in records if r.method == method]
            differences.append(paired_differences(rollouts, reference, rule.metric))
        variant, baseline = differences
        out[rule.id] = {
            i: variant[p] - baseline[p] for i, p in enumerate(order) if p in variant and p in baseline
        }
    return out, order


def judge_exploration(
    records: Sequence[Explored], rules_file: RulesFile, out_dir: Path
) -> tuple[str, list[list[str]], list[Judged]]:
    """The rules judged at the latest planned look the problems reach (a look at n problems reads
    the first n in data order), every look appended once to ``out_dir/looks.jsonl``; (heading,
    table rows, judged rules)."""
    design = rules_file.design
    if design is None:
        raise ConfigError(
            "an exploration rules file needs a design (fixed or group_sequential, looks in problems)"
        )
    if design.type == "anytime":
        raise ConfigError("an exploration rules file takes a fixed or group_sequential design, not anytime")
    diffs, _ = rule_differences_by_problem(records, rules_file)
    units = complete_seeds(diffs)
    looks = judge_looks(diffs, rules_file, units)
    if not looks:
        raise ConfigError(
            f"{len(units)} problems have records of every method the rules name; the design's first look "
            f"is at {design.looks[0]} problems"
        )
    log_looks(out_dir / LOOKS_LOG, looks, design, units)
    k = len(looks)
    families = ", ".join(f"{f}: {c}" for f, c in design.families.items())
    heading = (
        f"Exploration rules, look {k} of {len(design.looks)} at {design.looks[k - 1]} problems "
        f"(problems as the unit; {design.type} design, alpha {design.alpha:g} two-sided per family, "
        f"{families})"
    )
    return heading, [JUDGED_HEADER, *judged_rows(looks[-1])], looks[-1]
