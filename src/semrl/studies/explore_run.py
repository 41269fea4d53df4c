"""Running the exploration comparison (``semrl explore``): each rollout method samples every
problem at a fixed policy, each leaf is verified and its answer clustered, and one record per
(method, seed, problem) goes to ``records.jsonl``; the summary compares every method with
independent sampling at equal cost, problem by problem (``semrl.studies.explore``,
``semrl.studies.explore_summary``).

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
from semrl.rollout.engines import Engine, GenerationRequest, sampling_params
from semrl.rollout.seeds import node_seed
from semrl.studies.explore import (
    Leaves,
)
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
    golds, problems = [problem.answer] * len(texts), [problem.problem] * len(texts)
    rewards = score_responses(pool, texts, golds, final_number_fallback=fallback, problems=problems)
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
    from it and their node (``rollout.seeds.node_seed``), so a problem's tokens do not depend on which
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
    with (
        VerifierPool.from_config(cfg.reward) as pool,
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
