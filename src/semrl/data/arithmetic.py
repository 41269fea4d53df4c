"""A procedural arithmetic task with verifiable integer answers, seeded and levelled.

SmolLM2-135M scores about 0 on GSM8K and MATH, so this is the default demo task: it gives the
small model some reward to learn from, from 1-digit sums (level 1) to multi-step problems (5).
"""

from __future__ import annotations

import random

from semrl.data.loader import Problem


def _make(level: int, rng: random.Random) -> tuple[str, int]:
    if level == 1:
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        return f"What is {a} + {b}?", a + b
    if level == 2:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        return f"What is {a} + {b}?", a + b
    if level == 3:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if rng.random() < 0.5:
            return f"What is {a} - {b}?", a - b
        return f"What is {a} + {b}?", a + b
    if level == 4:
        a, b = rng.randint(2, 9), rng.randint(2, 30)
        return f"What is {a} * {b}?", a * b
    if level == 5:
        a, b, c = rng.randint(2, 20), rng.randint(2, 20), rng.randint(2, 9)
        if rng.random() < 0.5:
            return f"What is ({a} + {b}) * {c}?", (a + b) * c
        return f"What is {a} * {c} - {b}?", a * c - b
    raise ValueError(f"arithmetic level must be 1..5, got {level}")


def _texts(level: int) -> set[str]:
    """Every problem text ``_make(level, ...)`` can return."""
    two_digits = range(10, 100)
    if level == 1:
        return {f"What is {a} + {b}?" for a in range(10) for b in range(10)}
    if level == 2:
        return {f"What is {a} + {b}?" for a in two_digits for b in two_digits}
    if level == 3:
        return {f"What is {a} {op} {b}?" for a in two_digits for b in two_digits for op in "+-"}
    if level == 4:
        return {f"What is {a} * {b}?" for a in range(2, 10) for b in range(2, 31)}
    if level == 5:
        triples = [(a, b, c) for a in range(2, 21) for b in range(2, 21) for c in range(2, 10)]
        return {f"What is ({a} + {b}) * {c}?" for a, b, c in triples} | {
            f"What is {a} * {c} - {b}?" for a, b, c in triples
        }
    raise ValueError(f"arithmetic level must be 1..5, got {level}")


def make_arithmetic_problems(
    n: int, levels: list[int], seed: int, exclude: set[str] | None = None
) -> list[Problem]:
    """``n`` distinct problems drawn uniformly over ``levels``; ``exclude`` holds problem texts
    that must not appear (to keep a held-out split disjoint from training). Fewer than ``n`` when
    the levels hold fewer distinct problems outside ``exclude``."""
    rng = random.Random(seed)
    exclude = exclude or set()
    seen: set[str] = set()
    problems: list[Problem] = []
    attempts = 0
    possible: set[str] | None = None  # counted once draws start repeating
    while len(problems) < n:
        attempts += 1
        if attempts > 100 * n + 1000:
            break  # the level range has fewer distinct problems than asked for
        if attempts == 2 * n + 100:
            possible = set().union(*(_texts(level) for level in set(levels))) - exclude
        if possible is not None and len(problems) == len(possible):
            break  # every problem the levels hold is drawn: the draws would only repeat until the cap
        level = rng.choice(levels)
        text, answer = _make(level, rng)
        if text in seen or text in exclude:
            continue
        seen.add(text)
        problems.append(
            Problem(id=f"arith-{seed}-{len(problems)}", problem=text, answer=str(answer), level=level)
        )
    return problems
