"""Data loading, bad rows, the arithmetic task, prompts and the sampler."""

import json
import random

import pytest

from semrl.config.load import load_config
from semrl.config.sections import ConfigError
from semrl.data import (
    BENCHMARKS,
    Columns,
    DataError,
    EpochSampler,
    load_problems,
    make_arithmetic_problems,
    resolve_dataset,
)


def _write(path, rows):
    path.write_bytes(b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows))
    return path


def test_packaged_benchmarks_load():
    for name in ["math500", "gsm8k_test", "aime24", "aime25", "amc23", "minerva_math", "olympiadbench"]:
        assert name in BENCHMARKS
        problems, skipped = load_problems(resolve_dataset(name))
        assert problems and skipped == 0
    math500, _ = load_problems(resolve_dataset("math500"))
    assert len(math500) == 500 and math500[0].level is not None and math500[0].subject


@pytest.mark.parametrize(
    "row, message",
    [
        ({"id": "a", "answer": "1"}, r"line 2: missing required field\(s\) \['problem'\]"),
        ({"id": "a", "problem": "  ", "answer": "1"}, "line 2: field 'problem' must be a non-empty"),
        ({"id": "a", "problem": "p", "answer": ""}, "line 2: field 'answer' is empty"),
        ({"id": "a", "problem": "p", "answer": "1", "level": "hard"}, "line 2: field 'level'"),
        (b"\xff\xfe not utf-8", "line 2: not valid UTF-8"),
        (b"{not json", "line 2: invalid JSON"),
        ({"id": "x", "problem": "p", "answer": "1"}, "line 2: duplicate id 'x'"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, row, message):
    path = _write(tmp_path / "d.jsonl", [{"id": "x", "problem": "What?", "answer": 3}, row])
    with pytest.raises(DataError, match=message) as err:
        load_problems(path)
    assert str(path) in str(err.value)
    problems, skipped = load_problems(path, skip_bad_rows=True)
    assert len(problems) == 1 and skipped == 1 and problems[0].answer == "3"


def test_missing_or_empty_file(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_problems(tmp_path / "none.jsonl")
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataError, match="no valid problems"):
        load_problems(empty)
    with pytest.raises(DataError, match="neither a packaged benchmark"):
        load_problems(resolve_dataset("mathh500"))  # not a hub id either: no network call


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(
        [{"id": "a", "problem": "1+1?", "answer": "2"}, {"id": "b", "problem": "x", "answer": None}]
    )
    pq.write_table(table, tmp_path / "d.parquet")
    with pytest.raises(DataError, match="row 2: missing"):
        load_problems(tmp_path / "d.parquet")


def test_arithmetic_is_seeded_levelled_and_correct():
    a = make_arithmetic_problems(50, [1, 2, 3, 4, 5], seed=3)
    b = make_arithmetic_problems(50, [1, 2, 3, 4, 5], seed=3)
    assert a == b and len({p.problem for p in a}) == 50
    for p in a:
        expr = p.problem.removeprefix("What is ").removesuffix("?")
        assert int(p.answer) == _calc(expr)
    held = make_arithmetic_problems(
        20, [1], seed=4, exclude={p.problem for p in make_arithmetic_problems(60, [1], 3)}
    )
    assert len(held) <= 40  # only 100 distinct 1-digit sums exist


def _drawn_until_the_cap(n: int, levels: list[int], seed: int, exclude: set[str]) -> list[str]:
    """The generator's loop without its shortcut: it draws until n problems or 100 n + 1000 draws."""
    from semrl.data.arithmetic import _make

    rng, texts, attempts = random.Random(seed), [], 0
    while len(texts) < n and attempts < 100 * n + 1000:
        attempts += 1
        text, _ = _make(rng.choice(levels), rng)
        if text not in texts and text not in exclude:
            texts.append(text)
    return texts


def test_arithmetic_stops_once_its_levels_are_drawn_out_with_the_problems_of_a_draw_to_the_cap():
    """Asked for more problems than the levels hold (the demo's 2000 of 100 1-digit sums), the
    generator stops once it has every one, with the problems the loop to its cap of draws gives;
    ``_texts`` holds every text ``_make`` draws, as many as the hand count."""
    from semrl.data.arithmetic import _make, _texts

    rng = random.Random(0)
    for level, count in {1: 100, 2: 90 * 90, 3: 2 * 90 * 90, 4: 8 * 29, 5: 2 * 19 * 19 * 8}.items():
        assert len(_texts(level)) == count
        assert {_make(level, rng)[0] for _ in range(20_000)} <= _texts(level)
    for seed in range(12):
        levels = rng.sample([1, 4, 1, 4, 2], rng.randint(1, 3))
        space = sorted(set().union(*(_texts(level) for level in levels)))
        exclude = set(rng.sample(space, rng.randint(0, len(space) // 2))) if len(space) < 1000 else set()
        n = rng.choice([5, 50, 120, 400])
        got = [p.problem for p in make_arithmetic_problems(n, levels, seed, exclude)]
        assert got == _drawn_until_the_cap(n, levels, seed, exclude), (n, levels, seed)


def test_arithmetic_draws_out_the_demos_level_in_a_few_thousand_draws(monkeypatch):
    """The demo asks 2000 of the 100 1-digit sums: about 2 n draws, not the cap of 100 n + 1000."""
    import semrl.data.arithmetic as arithmetic

    draws = []
    make = arithmetic._make
    monkeypatch.setattr(arithmetic, "_make", lambda level, rng: draws.append(level) or make(level, rng))
    assert len(make_arithmetic_problems(2000, [1], seed=0)) == 100
    assert len(draws) <= 2 * 2000 + 100


def _calc(expr: str) -> int:
    # tiny evaluator for "a op b" and "(a + b) * c" forms, no eval()
    expr = expr.replace("(", "").replace(")", "")
    toks = expr.split()
    if len(toks) == 5 and toks[3] == "*":  # (a + b) * c
        return (int(toks[0]) + int(toks[2])) * int(toks[4])
    val = int(toks[0])
    ops = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y}
    if len(toks) == 5:  # a * c - b
        return ops[toks[3]](ops[toks[1]](val, int(toks[2])), int(toks[4]))
    return ops[toks[1]](val, int(toks[2]))


def test_sampler_resumes_exactly():
    s = EpochSampler(7, seed=1)
    first = s.next_indices(5)
    state = s.state_dict()
    rest = s.next_indices(12)
    t = EpochSampler(7, seed=1)
    t.load_state_dict(state)
    assert t.next_indices(12) == rest
    assert sorted(first + rest[:2]) == list(range(7))  # an epoch is a permutation
    with pytest.raises(ValueError, match="same data"):
        EpochSampler(8, 1).load_state_dict(state)


def test_held_out_arithmetic_is_disjoint_from_training_even_for_tiny_levels():
    from semrl.config.load import load_config
    from semrl.data.problem_sets import load_problem_sets

    cfg = load_config(None, ["data.arithmetic_levels=[1]", "data.eval_size=32"])
    held_out, (train,) = load_problem_sets(cfg)
    assert len(held_out) == 32 and len(train) == 100 - 32  # only 100 distinct 1-digit sums
    assert not {p.problem for p in held_out} & {p.problem for p in train}


def test_transfer_split_draws_other_levels_without_training_or_held_out_texts():
    from semrl.data.problem_sets import load_problem_sets, load_transfer_problems

    cfg = load_config(
        None,
        [
            "data.arithmetic_levels=[1, 4]",
            "data.eval_size=24",
            "data.transfer=arithmetic",
            "data.transfer_levels=[1, 3]",
        ],
    )
    held_out, (train,) = load_problem_sets(cfg)
    transfer = load_transfer_problems(cfg, [held_out, train])
    assert len(transfer) == 24 and {p.level for p in transfer} <= {1, 3}
    assert not {p.problem for p in transfer} & ({p.problem for p in held_out} | {p.problem for p in train})
    assert load_transfer_problems(load_config(None, []), [held_out, train]) == []
    with pytest.raises(ConfigError, match="data.transfer_levels"):
        load_config(None, ["data.transfer=arithmetic", "data.transfer_levels=[]"])


@pytest.mark.parametrize("rows", [5, 9, 37, 160, 400])
def test_own_data_without_data_eval_is_evaluated_on_a_fixed_slice_of_itself(tmp_path, rows):
    """data.eval=auto (the default) on a user's file: min(eval_size, rows // 5) problems of that file,
    never trained on, the same slice for every trainer.seed; 'arithmetic' stays procedural."""
    from semrl.data.problem_sets import eval_source, load_problem_sets

    path = _write(
        tmp_path / "mine.jsonl",
        [{"question": f"What is {i} times 3?", "final": str(3 * i)} for i in range(rows)],
    )
    own = [f"data.train={path}", "data.problem_key=question", "data.answer_key=final", "data.eval_size=32"]
    slices = []
    for seed in (0, 1, 7):
        held_out, (train,) = load_problem_sets(load_config(None, [*own, f"trainer.seed={seed}"]))
        texts = {p.problem for p in held_out}
        assert len(held_out) == len(texts) == min(32, rows // 5)
        assert not texts & {p.problem for p in train} and len(train) == rows - len(held_out)
        assert texts <= {f"What is {i} times 3?" for i in range(rows)}
        slices.append([p.problem for p in held_out])
    assert slices[0] == slices[1] == slices[2]
    if rows >= 10:  # a draw, not the file's first rows
        assert slices[0] != [f"What is {i} times 3?" for i in range(len(slices[0]))]
    assert eval_source(load_config(None, own).to_dict()["data"]) == f"{path}, not trained on"
    # an explicit data.eval wins: its first eval_size problems, and training keeps every row of the file
    explicit = load_config(None, [*own, f"data.eval={path}", "data.eval_size=3"])
    held_out, (train,) = load_problem_sets(explicit)
    assert [p.problem for p in held_out] == [f"What is {i} times 3?" for i in range(3)] and len(
        train
    ) == rows - 3
    assert eval_source(explicit.to_dict()["data"]) == str(path)


def test_own_data_too_small_to_hold_out_names_the_fix(tmp_path):
    from semrl.data.problem_sets import load_problem_sets

    path = _write(tmp_path / "tiny.jsonl", [{"problem": f"{i} + 1?", "answer": str(i + 1)} for i in range(4)])
    with pytest.raises(DataError, match=r"has 4 problems, too few to hold out .* data.eval=null"):
        load_problem_sets(load_config(None, [f"data.train={path}"]))
    held_out, (train,) = load_problem_sets(load_config(None, [f"data.train={path}", "data.eval=null"]))
    assert held_out == [] and len(train) == 4


def test_arithmetic_auto_is_the_arithmetic_held_out_split():
    from semrl.data.problem_sets import eval_source, load_problem_sets

    for levels in ("[1]", "[2, 3]"):
        auto = load_problem_sets(load_config(None, [f"data.arithmetic_levels={levels}"]))
        named = load_problem_sets(
            load_config(None, [f"data.arithmetic_levels={levels}", "data.eval=arithmetic"])
        )
        assert auto == named
    assert eval_source(load_config(None, []).to_dict()["data"]) == "arithmetic"


def test_rows_without_an_id_are_numbered_by_their_position(tmp_path):
    """TRL and verl need no id: a jsonl or parquet row without one is row-N (N: its 1-based position
    among the rows, blank lines not counted); a given id is kept and must stay unique."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"q": f"{i} + 1?", "a": i + 1} for i in range(6)]
    rows[3]["key"] = "mine"
    path = _write(tmp_path / "no_ids.jsonl", rows[:2] + [b""] + rows[2:])
    columns = Columns(problem="q", answer="a", id="key")
    problems, _ = load_problems(path, columns=columns)
    assert [p.id for p in problems] == ["row-1", "row-2", "row-3", "mine", "row-5", "row-6"]
    assert [p.answer for p in problems] == [str(i + 1) for i in range(6)]
    pq.write_table(
        pa.table({"q": [r["q"] for r in rows], "a": [r["a"] for r in rows]}), tmp_path / "t.parquet"
    )
    assert [p.id for p in load_problems(tmp_path / "t.parquet", columns=columns)[0]] == [
        f"row-{i}" for i in range(1, 7)
    ]
    clash = _write(
        tmp_path / "clash.jsonl",
        [{"problem": "a", "answer": 1}, {"problem": "b", "answer": 2, "id": "row-1"}],
    )
    with pytest.raises(DataError, match="duplicate id 'row-1'"):
        load_problems(clash)
    null = _write(tmp_path / "null.jsonl", [{"problem": "a", "answer": 1, "id": None}])
    with pytest.raises(DataError, match="line 1: field 'id' is null"):
        load_problems(null)
