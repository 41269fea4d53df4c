"""Verifiable rewards: answer extraction and math-verify in killable processes.

Nothing here imports torch at module level: the reward workers import this package, and a worker
that replaces a timed-out one starts in about 0.6 s instead of 3 s with torch."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from semrl.errors import TrainingError
from semrl.reward.extract import extract_answer, extract_boxed, extract_last_number
from semrl.reward.functions import BUILTIN, CORRECTNESS_CHECKS, Scorer, check_signature, load_function, scorer
from semrl.reward.verify import CallResult, Verdict, VerifierPool

if TYPE_CHECKING:
    import torch

    from semrl.config.sections import RewardConfig
    from semrl.data import Problem

logger = logging.getLogger(__name__)

__all__ = [
    "Judge",
    "RewardFunctions",
    "RewardResult",
    "Scores",
    "Verdict",
    "VerifierPool",
    "extract_answer",
    "extract_boxed",
    "extract_last_number",
    "reward_functions",
    "score",
    "score_responses",
]


@dataclass(frozen=True)
class RewardResult:
    """One response's reward, its extracted answer, whether it was judged correct and whether the
    verifier timed out."""

    reward: float
    answer: str | None
    correct: bool
    timed_out: bool


def score_responses(
    pool: VerifierPool,
    responses: list[str],
    golds: list[str],
    *,
    final_number_fallback: bool,
    truncated: list[bool] | None = None,
    truncated_reward: float | None = None,
    problems: list[str] | None = None,
) -> list[RewardResult]:
    """Binary correctness reward (1 / 0) per response, gold answer compared first; ``problems[i]``
    (the problem response i answers) lets the pool refuse a restatement of it."""
    answers = [extract_answer(text, final_number_fallback) for text in responses]
    verdicts = pool.verify_many(list(zip(golds, answers, strict=True)), problems)
    results = []
    for i, (answer, verdict) in enumerate(zip(answers, verdicts, strict=True)):
        reward = 1.0 if verdict.correct else 0.0
        if truncated is not None and truncated[i] and truncated_reward is not None:
            reward = truncated_reward
        results.append(RewardResult(reward, answer, verdict.correct, verdict.timed_out))
    return results


@dataclass
class RewardFunctions:
    """The functions of ``reward.functions`` with their weights (``semrl.reward.functions``)."""

    names: tuple[str, ...] = ("math",)
    weights: tuple[float, ...] = (1.0,)
    correctness: str | None = None  # reward.correctness
    max_error_rate: float = 1.0  # reward.max_error_rate: above it a user function's errors stop the run
    # Reward callables that the verifier workers cannot import by name run in this process instead.
    in_process: dict[str, Callable[..., Any]] = field(default_factory=dict)
    _logged: set[str] = field(default_factory=set)

    @property
    def judge(self) -> str | None:
        """The function whose score of 1 marks a response correct: ``reward.correctness``, else the
        first built-in check listed; None: a total reward > 0 is correct."""
        if self.correctness is not None:
            return self.correctness
        return next((n for n in self.names if n in CORRECTNESS_CHECKS), None)

    @property
    def pool_functions(self) -> tuple[str, ...]:
        """Names the reward pool's workers import."""
        return tuple(n for n in self.names if n != "math" and n not in self.in_process)

    @property
    def metric_keys(self) -> tuple[str, ...]:
        """One distinct metric key per function (``rewards/<key>/...``): its function name; where two
        share one (``a.py:score``, ``b.py:score``), qualified by their file or module (``a.score``),
        then numbered if still equal (``score#2``: the same name listed twice)."""
        short = [name.rsplit(":", 1)[-1] for name in self.names]
        keys = []
        for name, key in zip(self.names, short, strict=True):
            if short.count(key) > 1 and ":" in name:
                where = name.rsplit(":", 1)[0]
                key = f"{Path(where).stem if where.endswith('.py') else where.rsplit('.', 1)[-1]}.{key}"
            keys.append(key)
        return tuple(k if keys.count(k) == 1 else f"{k}#{keys[: i + 1].count(k)}" for i, k in enumerate(keys))

    def score(
        self,
        pool: VerifierPool,
        prompts: list[str],
        responses: list[str],
        completion_ids: list[list[int]],
        columns: list[dict[str, Any]],
        *,
        final_number_fallback: bool,
        truncated: list[bool] | None = None,
        truncated_reward: float | None = None,
    ) -> tuple[list[RewardResult], dict[str, float]]:
        """Weighted reward of every response, and per function the sum of its scores, its errors
        (raised, died or timed out) and time-outs, as ``rewards/<function>/{sum,errors,timeouts}``.
        ``columns[i]`` holds the dataset's columns of response i's problem, ``answer`` among them."""
        answers = [extract_answer(text, final_number_fallback) for text in responses]
        total = [0.0] * len(responses)
        correct: list[bool] | None = None
        timed_out = [False] * len(responses)
        metrics: dict[str, float] = {}
        for name, weight, key in zip(self.names, self.weights, self.metric_keys, strict=True):
            if name == "math":
                pairs = [(c["answer"], a) for c, a in zip(columns, answers, strict=True)]
                verdicts = pool.verify_many(pairs, prompts)
                scores: list[float | None] = [float(v.correct) for v in verdicts]
                errors: list[str | None] = [None] * len(verdicts)
                outs = [v.timed_out for v in verdicts]
            else:
                calls = list(zip(prompts, responses, completion_ids, columns, strict=True))
                if name in self.in_process:
                    score_here = scorer(self.in_process[name])
                    results = [_call_here(score_here, call) for call in calls]
                else:
                    results = pool.call_many(self.pool_functions.index(name), calls)
                scores = [r.score for r in results]
                errors = [r.error for r in results]
                outs = [r.timed_out for r in results]
            self._check_errors(name, errors)
            metrics[f"rewards/{key}/sum"] = sum(s or 0.0 for s in scores)
            metrics[f"rewards/{key}/errors"] = float(sum(e is not None for e in errors))
            metrics[f"rewards/{key}/timeouts"] = float(sum(outs))
            for i, s in enumerate(scores):
                total[i] += weight * (s or 0.0)
                timed_out[i] = timed_out[i] or outs[i]
            if name == self.judge and correct is None:
                correct = [s is not None and s >= 1.0 for s in scores]
        if correct is None:
            correct = [r > 0 for r in total]
        rewarded: list[RewardResult] = []
        for i, answer in enumerate(answers):
            reward = total[i]
            if truncated is not None and truncated[i] and truncated_reward is not None:
                reward = truncated_reward
            rewarded.append(RewardResult(reward, answer, correct[i], timed_out[i]))
        return rewarded, metrics

    def _check_errors(self, name: str, errors: list[str | None]) -> None:
        """Stop on a user function that failed (raised, or gave no valid score) on more than
        ``max_error_rate`` of a call's completions; else log its first traceback once."""
        first_error = next((e for e in errors if e and e != "timeout"), None)
        failed = sum(e is not None and e != "timeout" for e in errors)
        if name not in BUILTIN and errors and failed / len(errors) > self.max_error_rate:
            raise TrainingError(
                f"reward function '{name}' failed on {failed} of the {len(errors)} completions it "
                f"scored (raised, or returned no valid score), above reward.max_error_rate="
                f"{self.max_error_rate:g}. Fix the function, or set reward.max_error_rate=1 to score "
                f"its errors 0 and go on. Its first traceback:\n{first_error}"
            )
        if first_error and name not in self._logged:
            self._logged.add(name)
            logger.warning("reward function '%s' raised (scored 0); first traceback:\n%s", name, first_error)


def _call_here(score: Scorer, call: tuple[str, str, list[int], dict[str, Any]]) -> CallResult:
    """A call in the training process (a function the workers cannot import): no hard time limit."""
    try:
        return CallResult(score(*call))
    except Exception:
        return CallResult(None, traceback.format_exc()[-4000:])


def reward_functions(
    names: list[str],
    weights: list[float] | None = None,
    in_process: dict[str, Callable[..., Any]] | None = None,
    correctness: str | None = None,
    max_error_rate: float = 1.0,
) -> RewardFunctions:
    """Check and bundle ``reward.functions``: every function is imported and its signature checked
    here, so a bad one fails before training starts. ``in_process`` maps names to callables that
    run in this process (defined where the workers cannot import them, e.g. a notebook);
    ``max_error_rate`` (``reward.max_error_rate``): the share of a scoring call's completions on
    which one of the user's functions may fail before scoring raises ``TrainingError``."""
    in_process = dict(in_process or {})
    for name in names:
        if name != "math":
            check_signature(name, in_process[name] if name in in_process else load_function(name))
    weights_ = tuple(weights or [1.0] * len(names))
    return RewardFunctions(tuple(names), weights_, correctness, max_error_rate, in_process)


@dataclass(frozen=True)
class Scores:
    """What the reward stage returns for N responses grouped by prompt (group g = rows g*G .. g*G+G-1).

    Attributes:
        rewards: (N,) the rewards the advantages read: weighted functions, then shaping (DAPO's
            overlong penalty).
        results: (N,) per response its weighted reward before shaping, extracted answer and
            correctness (``reward.correctness``).
        function_sums: ``rewards/<function>/{sum,errors,timeouts}`` over the N responses.
        verify_timeouts: verifier time-outs while scoring them.
    """

    rewards: torch.Tensor
    results: tuple[RewardResult, ...]
    function_sums: dict[str, float] = field(default_factory=dict)
    verify_timeouts: int = 0

    def grouped(self, group_size: int, metric: Literal["reward", "accuracy"] = "reward") -> torch.Tensor:
        """(num_groups, G) rewards, or correctness as 0/1 (without shaping) for ``accuracy``."""
        import torch

        if metric == "reward":
            return self.rewards.view(-1, group_size)
        return torch.tensor([float(r.correct) for r in self.results]).view(-1, group_size)

    def informative_groups(
        self, group_size: int, metric: Literal["reward", "accuracy"] = "reward"
    ) -> torch.Tensor:
        """(num_groups,) True where the group's rewards (or correctness) are not all equal: the
        groups with a learning signal under group-relative advantages (DAPO's dynamic sampling)."""
        grouped = self.grouped(group_size, metric)
        return grouped.max(1).values > grouped.min(1).values


@dataclass(frozen=True)
class Judge:
    """Who decides whether a response is correct, outside training's reward: math-verify of the
    extracted answer in ``pool``'s workers, or the run's reward functions (``functions``: their
    ``reward.correctness`` judge), with ``final_number_fallback`` (a last number counts as the answer
    when there is no ``\\boxed{}``)."""

    pool: VerifierPool
    final_number_fallback: bool = True
    functions: RewardFunctions | None = None


class Response(Protocol):
    """What scoring reads of a sampled response (``semrl.rollout.engines.Generation`` is one): the
    reward stage sits below the rollout and knows no engine."""

    @property
    def token_ids(self) -> torch.Tensor:
        """(L,) new tokens, the final EOS included."""

    @property
    def truncated(self) -> bool:
        """Whether it stopped at its token budget, not at EOS."""


def score(
    problems: list[Problem],
    texts: list[str],
    generations: Sequence[Response],
    functions: RewardFunctions,
    pool: VerifierPool,
    rc: RewardConfig,
    max_new_tokens: int,
) -> Scores:
    """Score every response with the ``reward`` section's functions and shaping (DAPO's overlong
    penalty): ``texts[i]`` and ``generations[i]`` answer ``problems[i]``."""
    import torch

    from semrl.data import problem_columns
    from semrl.reward.shaping import overlong_penalty

    timeouts_before = pool.num_timeouts
    results, function_sums = functions.score(
        pool,
        [p.problem for p in problems],
        texts,
        [g.token_ids.tolist() for g in generations],
        [problem_columns(p) for p in problems],
        final_number_fallback=rc.final_number_fallback,
        truncated=[g.truncated for g in generations],
        truncated_reward=rc.truncated_reward,
    )
    rewards = torch.tensor([r.reward for r in results])
    if rc.overlong_buffer_len > 0:
        lengths = torch.tensor([len(g.token_ids) for g in generations])
        rewards += overlong_penalty(
            lengths, max_new_tokens, rc.overlong_buffer_len, rc.overlong_penalty_factor
        )
    return Scores(rewards, tuple(results), function_sums, pool.num_timeouts - timeouts_before)
