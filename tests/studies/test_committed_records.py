"""A finished study's records are committed gzip-compressed (docs/sweeps.md, "Committing a study"):
every reader takes a log plain or compressed, and every committed comparison reads the same from
the compressed records as it did from the plain ones it was written from."""

from __future__ import annotations

import gzip
import json
import random
import subprocess
from pathlib import Path

import pytest

from semrl.cli import main
from semrl.core.jsonl import log_exists, read_jsonl, stored
from semrl.studies.discovery import find_runs
from tests.helpers import make_figures_script

ROOT = Path(__file__).resolve().parents[2]


def _random_rows(rng: random.Random, n: int) -> list[dict]:
    return [
        {
            "step": i,
            "value": rng.uniform(-1e6, 1e6),
            "text": "".join(rng.choice('ab\u00e9 \\"{}') for _ in range(9)),
            "nested": {"ids": [rng.randrange(50_000) for _ in range(rng.randrange(4))]},
            "none": None,
        }
        for i in range(n)
    ]


@pytest.mark.parametrize("seed", range(20))
def test_a_compressed_log_reads_as_the_plain_one(seed, tmp_path):
    rng = random.Random(seed)
    rows = _random_rows(rng, rng.randrange(0, 30))
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if rows and rng.random() < 0.5:
        text += json.dumps(_random_rows(rng, 1)[0])[: rng.randrange(1, 20)]  # a torn last line
    plain, packed = tmp_path / "plain" / "metrics.jsonl", tmp_path / "packed" / "metrics.jsonl"
    plain.parent.mkdir()
    packed.parent.mkdir()
    plain.write_text(text, encoding="utf-8")
    packed.with_name("metrics.jsonl.gz").write_bytes(gzip.compress(text.encode("utf-8")))
    assert read_jsonl(packed) == read_jsonl(plain) == rows
    assert read_jsonl(packed.with_name("metrics.jsonl.gz")) == rows  # named either way
    assert log_exists(packed) and stored(packed).name == "metrics.jsonl.gz"


def test_a_plain_log_wins_over_a_compressed_one_and_none_reads_empty(tmp_path):
    """A run written again after its records were compressed (or a half-finished gzip) reads the
    plain log, which is the one a trainer appends to."""
    log = tmp_path / "metrics.jsonl"
    log.with_name("metrics.jsonl.gz").write_bytes(gzip.compress(b'{"step": 1}\n'))
    log.write_text('{"step": 2}\n')
    assert read_jsonl(log) == [{"step": 2}] and stored(log) == log
    assert read_jsonl(tmp_path / "none.jsonl") == [] and not log_exists(tmp_path / "none.jsonl")


@pytest.mark.parametrize("study", sorted(make_figures_script().COMPARES))
def test_every_committed_comparison_reads_the_same_from_the_compressed_records(study, tmp_path, monkeypatch):
    """`semrl compare` over the compressed records writes, byte for byte, the results.md and
    aggregate.json committed beside them, which were written from the plain records, and the figures
    docs/figures shows from this comparison (scripts/make_figures.py copies them there; the
    comparison's figures/ is not committed)."""
    make_figures = make_figures_script()
    options, output = make_figures.COMPARES[study]
    monkeypatch.chdir(ROOT)
    study_dir = ROOT / "results" / study
    runs = [run for group in find_runs([study_dir]).values() for run in group]
    assert runs and all(not (run.run_dir / "metrics.jsonl").exists() for run in runs)  # compressed ones only
    assert main(["compare", str(study_dir.relative_to(ROOT)), *options, "--output", str(tmp_path)]) == 0
    for name in ("results.md", "aggregate.json"):
        assert (tmp_path / name).read_bytes() == (study_dir / output / name).read_bytes(), name
    for name, source in make_figures.SHOWN.items():
        if source.split("/")[0] == study:
            figure = source.removeprefix(f"{study}/{output}/")
            assert figure != source, f"{name} is copied from another comparison than {output}"
            assert (tmp_path / figure).read_bytes() == (ROOT / "docs" / "figures" / name).read_bytes(), name


@pytest.mark.e2e  # starts a process
def test_the_checkout_is_light():
    """The tracked files stay under 40 MB, so that a clone is quick and a working tree fits the GPU
    machine's 64 MiB: run records are committed compressed; the HTML pages and figures `semrl
    compare` regenerates, and a sweep's evaluation cache (the runs' step-0 records again), are not
    committed."""
    try:
        tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    files = [ROOT / name for name in tracked.decode().split("\0") if name and (ROOT / name).is_file()]
    assert sum(f.stat().st_size for f in files) < 40e6
    records = [f.relative_to(ROOT) for f in files if f.parts[len(ROOT.parts)] == "results"]
    assert records, "no committed study records found"
    assert not [f for f in records if f.suffix == ".jsonl" and f.name != "looks.jsonl"], (
        "compress: gzip -9n FILE"
    )
    assert not [f for f in records if f.suffix == ".html"]
    assert not [f for f in records if f.suffix == ".png"], "figures: python scripts/make_figures.py"
    assert not [f for f in records if ".eval-cache" in f.parts], "the runs' step-0 evaluations hold these"


def test_a_committed_run_is_not_continued_over_its_compressed_logs(tmp_path, capsys):
    """A trainer appends to plain logs: continuing a committed (compressed) run would split its log
    in two, so --resume refuses before anything loads and says how to decompress."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(ROOT / "results" / "study_arith" / "dr_grpo" / "seed-0", run)
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert (
        "logs are compressed (metrics.jsonl.gz, samples.jsonl.gz" in err and f"gunzip {run}/*.jsonl.gz" in err
    )


# one worker: the looks' levels (nominal_levels, about 5 s of simulation) are computed once per process
@pytest.mark.xdist_group("study4a")
@pytest.mark.parametrize("policy", ["dr_grpo-seed-200", "base", "dr_grpo-seed-201"])
def test_study4a_judges_the_same_from_its_committed_records(policy, tmp_path):
    """Study 4a (docs/results.md) judged again from its committed, compressed exploration records
    with the pre-registered rules gives every look of its looks.jsonl to the last digit: each
    difference, interval, level, p-value and outcome (the times left out)."""
    from semrl.studies.explore_run import read_records
    from semrl.studies.explore_summary import judge_exploration
    from semrl.studies.rules_file import load_rules

    landed = ROOT / "results" / "study4a" / policy
    judge_exploration(
        read_records(landed), load_rules(ROOT / "configs" / "study" / "study4a_rules.yaml"), tmp_path
    )

    def looks(path: Path) -> list[dict]:
        return [{k: v for k, v in row.items() if k != "time"} for row in read_jsonl(path)]

    assert looks(tmp_path / "looks.jsonl") == looks(landed / "looks.jsonl") != []
