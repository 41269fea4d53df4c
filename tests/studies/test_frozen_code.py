"""A study's frozen code is its registration (issue 83, item 5): every commit Study 4a ran on differs
from its registered commit only in files its recorded deviations list (``results/study4a/code.yaml``,
checked by ``scripts/check_study_code.py``), and the check refuses an unlisted difference."""

from __future__ import annotations

import copy
import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "results" / "study4a" / "code.yaml"


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "check_study_code", ROOT / "scripts" / "check_study_code.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def record() -> dict:
    loaded = yaml.safe_load(RECORD.read_text(encoding="utf-8"))
    missing = [
        c
        for c in {
            loaded["registered"],
            *(p["code"] for p in loaded["parts"]),
            *(p["driver"] for p in loaded["parts"]),
        }
        if subprocess.run(
            ["git", "-C", str(ROOT), "cat-file", "-e", f"{c}^{{commit}}"], capture_output=True
        ).returncode
    ]
    if missing:
        pytest.skip(
            f"this clone lacks the study's commits {missing} (a shallow clone): git fetch --unshallow"
        )
    return loaded


@pytest.mark.e2e  # runs git
def test_study4a_ran_on_its_registration_and_its_listed_deviations(record):
    assert _checker().check(record) == []
    # the third part ran on 3ec36c1, 12 commits past the registration, with 24 source files changed
    source = [f for f in record["deviations"][0]["files"] if f.startswith("src/")]
    assert len(source) >= 24


@pytest.mark.e2e  # runs git
def test_an_unlisted_file_is_refused(record):
    checker = _checker()
    dropped = copy.deepcopy(record)
    dropped["deviations"][0]["files"].remove("src/semrl/runtime/trainer.py")
    refusals = checker.check(dropped)
    assert len(refusals) == 2 and all("src/semrl/runtime/trainer.py" in r for r in refusals), refusals
    assert refusals[0].startswith("deviation 1") and "seed 201" in refusals[1]


@pytest.mark.e2e  # runs git
def test_a_deviation_that_lists_a_file_it_does_not_change_is_refused(record, tmp_path):
    """Through the command: a listed file that the deviation's commits leave alone would cover a later
    change to that file without a record of it."""
    import sys

    padded = copy.deepcopy(record)
    padded["deviations"][0]["files"].append("src/semrl/reward/verify.py")
    path = tmp_path / "code.yaml"
    path.write_text(yaml.safe_dump(padded))
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_study_code.py"), str(path)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2, out.stdout
    assert (
        "refused: deviation 1" in out.stderr
        and "lists ['src/semrl/reward/verify.py'] that it does not change" in out.stderr
    )


@pytest.mark.e2e  # runs git
def test_a_part_that_names_too_few_deviations_is_refused(record):
    checker = _checker()
    unlisted = copy.deepcopy(record)
    unlisted["parts"][2]["deviations"] = [2, 3]  # ran on 3ec36c1 without deviation 1
    (refusal,) = checker.check(unlisted)
    assert "3ec36c1" in refusal and "src/semrl/methods/registry.py" in refusal
    driver = copy.deepcopy(record)
    driver["parts"][1]["deviations"] = []  # the driver of deviation 2, unlisted
    (refusal,) = checker.check(driver)
    assert "scripts/study4a.sh" in refusal and "e444db9" in refusal


@pytest.mark.e2e  # runs git
def test_the_command_exits_2_on_a_refused_record(record, tmp_path):
    changed = copy.deepcopy(record)
    changed["deviations"][2]["files"] = []
    path = tmp_path / "code.yaml"
    path.write_text(yaml.safe_dump(changed))
    import sys

    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_study_code.py"), str(path)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "refused: deviation 3" in out.stderr
    ok = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_study_code.py"), str(RECORD)],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0 and len(ok.stdout.splitlines()) == 3
