"""semrl sweep: grid expansion, bad grids, dry run, skip / resume with tiny-model runs, submitit."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from semrl.cli import main
from semrl.errors import ConfigError
from semrl.studies.discovery import DONE_FILE
from semrl.studies.launch import run_local
from semrl.studies.sweep import TIME_FILE, SweepError, load_sweep
from semrl.studies.sweep_runs import SegmentClock, recorded_time, run_state
from tests.helpers import DIGIT_SYSTEM_PROMPT


@pytest.fixture
def forked_runs(monkeypatch):
    """The sweep's runs start as forks of this worker's preloaded server (``tests.forked``), not as
    fresh interpreters: the same ``semrl train`` command lines, environment and exit codes, without
    about 9 s of imports each. The tests of the launch itself (Ctrl-C reaching the run and the
    sweep, submitit) keep the real one."""
    import semrl.studies.sweep_runs as sweep_runs
    from tests.forked import run_semrl

    def call(command: list[str]) -> tuple[int, bool]:
        assert command[:3] == [sys.executable, "-m", "semrl"], command
        done = run_semrl(*command[3:])
        sys.stdout.write(done.stdout)
        sys.stderr.write(done.stderr)
        return done.returncode, False

    monkeypatch.setattr(sweep_runs, "_call_letting_it_stop", call)


def _write(path: Path, body: dict) -> Path:
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def _tiny_sweep(tmp_path: Path, model_dir: Path, task: Path, variants: dict, seeds: list, **extra) -> Path:
    base = _write(
        tmp_path / "base.yaml",
        {
            "model": {"name": str(model_dir)},
            "data": {
                "train": str(task),
                "eval": str(task),
                "eval_size": 4,
                "system_prompt": DIGIT_SYSTEM_PROMPT,
            },
            "rollout": {"group_size": 4, "prompts_per_step": 2, "max_new_tokens": 3},
            "trainer": {"steps": 2, "lr": 2e-3, "micro_batch_size": 8},
            "reward": {"num_workers": 1},
            "logging": {"progress": False, "eval_samples": 4, "report_to": [], "save_every": 1},
        },
    )
    return _write(
        tmp_path / "sweep.yaml",
        {
            "base": base.name,
            "output_dir": str(tmp_path / "out"),
            "seeds": seeds,
            "variants": variants,
            **extra,
        },
    )


def test_grid_expands_variants_times_seeds_seed_by_seed(tmp_path):
    base = _write(tmp_path / "base.yaml", {"trainer": {"steps": 3}})
    sweep = load_sweep(
        _write(
            tmp_path / "s.yaml",
            {
                "base": "base.yaml",
                "output_dir": "study",
                "seeds": [3, 1],
                "overrides": {"trainer": {"lr": 1e-5}, "rollout.top_k": 5},
                "variants": {
                    "a": {"algorithm.method": "grpo"},
                    "b": {"algorithm": {"method": "rose"}, "rollout.top_k": 7},
                },
            },
        )
    )
    assert sweep.base == base.resolve()
    assert [r.name for r in sweep.runs] == ["a/seed-3", "b/seed-3", "a/seed-1", "b/seed-1"]
    assert sweep.runs[1].run_dir == Path("study/b/seed-3")
    from semrl.config.load import load_config

    cfg = load_config(sweep.base, list(sweep.runs[1].overrides))
    assert (cfg.algorithm.method, cfg.trainer.seed, cfg.trainer.steps) == ("rose", 3, 3)
    assert (cfg.trainer.lr, cfg.rollout.top_k) == (1e-5, 7)  # the variant's value wins over the common one
    assert cfg.logging.output_dir == "study/b/seed-3" and cfg.logging.eval_cache == "study/.eval-cache"
    # a variant's config outside the grid (the benchmarks): the run's, less what the sweep sets per run
    alone = sweep.variant_config("b", ["trainer.seed=3", "logging.output_dir=study/b/seed-3"]).to_dict()
    run = cfg.to_dict()
    assert alone["logging"].pop("eval_cache") != run["logging"].pop(
        "eval_cache"
    )  # the study's cache is the sweep's
    assert alone == run
    assert sweep.variant_config("a", ["trainer.steps=9"]).trainer.steps == 9
    with pytest.raises(SweepError, match="no variant 'c'; its variants: a, b"):
        sweep.variant_config("c")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"variants": {"a": {"trainer.stpes": 3}}}, "trainer.stpes"),
        ({"variants": {"a": {"algorithm.method": "nope"}}}, "variant 'a'"),
        ({"seeds": [0, "1"]}, "seeds"),
        ({"seeds": [0, 1.5]}, "seeds"),
        ({"seeds": [True]}, "seeds"),
        ({"seeds": []}, "seeds"),
        ({"seeds": [2, 2]}, "twice"),
        ({"variants": {}}, "variants"),
        ({"variants": {"a/b": {}}}, "variant name"),
        ({"variants": {"a": {"trainer.seed": 4}}}, "set by the sweep"),
        ({"variants": {"a": {}}, "sweeps": 1}, "unknown key 'sweeps'"),
        ({"base": "missing.yaml"}, "does not exist"),
        ({"slurm": {"partion": "gpu"}}, "slurm"),
        ({"output_dir": None}, "output_dir"),
    ],
)
def test_bad_grids_fail_naming_the_key(tmp_path, body, message):
    sweep = {"output_dir": "out", "seeds": [0], "variants": {"a": {"algorithm.method": "grpo"}}, **body}
    with pytest.raises(SweepError, match=message.replace("(", r"\(")):
        load_sweep(_write(tmp_path / "s.yaml", sweep))


def test_a_variant_named_twice_fails(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        "output_dir: out\nvariants:\n  a: {algorithm.method: grpo}\n  a: {algorithm.method: rose}\n"
    )
    with pytest.raises(SweepError, match="'a' is given twice"):
        load_sweep(path)


def test_cli_reports_a_bad_grid_before_running(tmp_path, capsys):
    path = _write(
        tmp_path / "s.yaml", {"output_dir": str(tmp_path / "out"), "variants": {"a": {"trainer.lrr": 1}}}
    )
    assert main(["sweep", str(path)]) == 2
    assert "trainer.lrr" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_dry_run_lists_runs_and_commands(tmp_path, capsys):
    path = _write(
        tmp_path / "s.yaml",
        {
            "output_dir": str(tmp_path / "out"),
            "seeds": [0, 1],
            "variants": {"g": {"algorithm.method": "grpo"}},
        },
    )
    assert main(["sweep", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "2 runs (1 variants x 2 seeds)" in out
    assert "g/seed-1  [new]" in out and 'algorithm.method="grpo"' in out and "trainer.seed=1" in out
    assert not (tmp_path / "out").exists()


def _steps(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_local_sweep_skips_done_runs_and_resumes_an_interrupted_one(
    digit_model_dir, seven_task, tmp_path, monkeypatch, forked_runs
):
    path = _tiny_sweep(tmp_path, digit_model_dir, seven_task, {"dr": {"algorithm.method": "dr_grpo"}}, [0, 1])
    sweep = load_sweep(path)
    first, second = sweep.runs
    # the second run is killed in its second step, after the checkpoint of step 1
    messages: list[str] = []
    monkeypatch.setenv("SEMRL_FAULT_KILL", "rollout@2")
    assert run_local(sweep, messages.append) != 0
    assert run_state(first) == "resume" and run_state(second) == "new"  # the sweep stopped at the kill
    killed_after, processes = recorded_time(first.run_dir)
    assert killed_after > 0 and processes == 1
    monkeypatch.delenv("SEMRL_FAULT_KILL")
    started = time.monotonic()
    assert run_local(sweep, messages.append) == 0
    elapsed = time.monotonic() - started
    assert run_state(first) == run_state(second) == "done"
    # a run's time is every process's that ran it: the killed one's and the resumed one's
    done = [json.loads((r.run_dir / DONE_FILE).read_text()) for r in (first, second)]
    assert [d["processes"] for d in done] == [2, 1]
    assert done[0]["seconds"] == pytest.approx(recorded_time(first.run_dir)[0], abs=0.1)
    resumed_process = elapsed - done[1]["seconds"]  # this call ran the resume, then all of seed 1
    # resumed_process holds the sweep's own time between the runs as well (0.35 s in a fresh clone's
    # CI, where 0.5 * killed_after failed by 0.003 s); without the killed process's seconds the left
    # side would be minus that time, so it must be positive
    assert done[0]["seconds"] - resumed_process > 0
    resumed = _steps(first.run_dir)
    assert [r["step"] for r in resumed] == [0, 1, 2]
    code = json.loads((first.run_dir / DONE_FILE).read_text())["code"]  # the code that ran, recorded
    assert code["semrl"] and len(code["commit"]) == 40 and isinstance(code["modified"], bool)
    evaluated = [r for r in resumed if "eval/mean@4" in r]
    assert len(evaluated) == 2 and all(0 < r["time/eval_s/eval"] == r["time/eval_s"] for r in evaluated)
    assert "| dr/seed-0 | done |" in messages[-1] and "2 done" in messages[-1]

    # the resumed run equals an uninterrupted one
    (tmp_path / "again").mkdir()
    straight = _tiny_sweep(
        tmp_path / "again", digit_model_dir, seven_task, {"dr": {"algorithm.method": "dr_grpo"}}, [0]
    )
    assert run_local(load_sweep(straight), messages.append) == 0
    uninterrupted = _steps(tmp_path / "again" / "out" / "dr" / "seed-0")
    for key in ("reward", "loss", "actor/grad_norm", "eval/mean@4"):
        assert [r.get(key) for r in resumed] == [r.get(key) for r in uninterrupted], key

    # a finished sweep runs nothing again
    done_times = [(r.run_dir / DONE_FILE).stat().st_mtime_ns for r in sweep.runs]
    assert run_local(sweep, messages.append) == 0
    assert [(r.run_dir / DONE_FILE).stat().st_mtime_ns for r in sweep.runs] == done_times
    # the second seed reused nothing from the first, but the base evaluation was shared per seed
    cache = sorted(p.name for p in (tmp_path / "out" / ".eval-cache").glob("*.jsonl"))
    assert len(cache) == 2


def test_ctrl_c_lets_the_run_stop_after_its_step_and_stops_the_sweep(digit_model_dir, seven_task, tmp_path):
    """Ctrl-C reaches the sweep and its run together (one process group): the run finishes the step
    it is in and writes its checkpoint, the sweep waits for that instead of killing it, and stops."""
    from semrl.runtime.checkpoint import list_checkpoints, verify_checkpoint
    from semrl.runtime.preemption import EXIT_PREEMPTED

    path = _tiny_sweep(
        tmp_path,
        digit_model_dir,
        seven_task,
        {"dr": {"algorithm.method": "dr_grpo"}},
        [0, 1],
        overrides={"trainer.steps": 3},
    )
    sweep = load_sweep(path)
    first, second = sweep.runs
    # a session of its own: the fault's SIGINT goes to the sweep's process group, not to pytest's
    proc = subprocess.run(
        [sys.executable, "-m", "semrl", "sweep", str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "SEMRL_FAULT_CTRL_C": "rollout@2"},
        start_new_session=True,
        timeout=600,
    )
    assert proc.returncode == EXIT_PREEMPTED, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "stopped after step 2" in proc.stderr
    assert [c.name for c in list_checkpoints(first.run_dir)] == ["step-000001", "step-000002"]
    assert not verify_checkpoint(first.run_dir / "checkpoints" / "step-000002")
    assert run_state(first) == "resume" and run_state(second) == "new"
    assert recorded_time(first.run_dir)[1] == 1


@pytest.mark.e2e  # starts a process
def test_the_recorded_code_is_the_code_that_runs_not_the_installed_one(tmp_path):
    """A study's frozen worktree runs with PYTHONPATH=src beside another installed semrl: its runs
    record the worktree's version and source, not the installed distribution's."""
    import shutil

    import semrl

    copy = tmp_path / "src" / "semrl"
    shutil.copytree(Path(semrl.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    init = copy / "__init__.py"
    init.write_text(init.read_text().replace(f'__version__ = "{semrl.__version__}"', '__version__ = "0.0.1"'))
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json; from semrl.studies.sweep_runs import code_version; print(json.dumps(code_version()))",
        ],
        env={**os.environ, "PYTHONPATH": str(tmp_path / "src")},
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    code = json.loads(proc.stdout)
    assert code["semrl"] == "0.0.1" and code["source"] == str(copy)
    assert code["commit"] is None  # not a git checkout


def test_a_running_run_writes_its_time_as_it_goes(tmp_path):
    """The time file is written while the process runs, not only at its end, so a sweep killed
    outright (a lost machine) still counts most of the run's time against max_hours."""
    run_dir = tmp_path / "run"
    with SegmentClock(run_dir, before=5.0, processes=2, every=0.01):
        deadline = time.monotonic() + 10
        while not (run_dir / TIME_FILE).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        seconds, processes = recorded_time(run_dir)
        assert processes == 2 and seconds >= 5.0
        time.sleep(0.2)
    assert recorded_time(run_dir)[0] >= 5.2
    assert recorded_time(tmp_path / "new") == (0.0, 0)


def test_base_evaluation_is_computed_once_per_seed(digit_model_dir, seven_task, tmp_path, forked_runs):
    path = _tiny_sweep(
        tmp_path,
        digit_model_dir,
        seven_task,
        {"dr": {"algorithm.method": "dr_grpo"}, "g": {"algorithm.method": "grpo", "trainer.lr": 1e-3}},
        [0],
        keep_checkpoints=False,
    )
    cache = tmp_path / "out" / ".eval-cache"
    sweep = load_sweep(path)
    assert run_local(dataclasses.replace(sweep, runs=sweep.runs[:1]), print) == 0
    (cached,) = cache.glob("eval-*.jsonl")
    # tamper with the cached records: the second variant must read them instead of sampling
    records = [json.loads(line) for line in cached.read_text().splitlines()]
    for r in records:
        for s in r["samples"]:
            s["correct"] = True
    cached.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert run_local(sweep, print) == 0
    dr, g = (_steps(tmp_path / "out" / v / "seed-0")[0] for v in ("dr", "g"))
    assert dr["eval/mean@4"] < 1.0 and g["eval/mean@4"] == 1.0
    assert not (tmp_path / "out" / "g" / "seed-0" / "checkpoints").exists()  # keep_checkpoints: false


def test_a_changed_sweep_refuses_to_mix_runs(digit_model_dir, seven_task, tmp_path, forked_runs):
    path = _tiny_sweep(tmp_path, digit_model_dir, seven_task, {"dr": {"algorithm.method": "dr_grpo"}}, [0])
    assert run_local(load_sweep(path), print) == 0
    body = yaml.safe_load(path.read_text())
    body["variants"]["dr"]["trainer.lr"] = 0.5
    _write(path, body)
    with pytest.raises(SweepError, match="trainer.lr"):
        run_local(load_sweep(path), print)


@pytest.mark.parametrize(("held", "same"), [("arithmetic", True), ("auto", True), ("math500", False)])
def test_a_run_from_before_data_eval_auto_has_the_same_settings(tmp_path, held, same):
    """data.eval=auto on arithmetic training is the arithmetic held-out split that older runs named
    'arithmetic': a study written before resumes; another split is still refused."""
    from semrl.config.load import load_config
    from semrl.studies.sweep_runs import check_run_config

    _write(tmp_path / "base.yaml", {"data": {"train": "arithmetic", "eval": "auto"}})
    sweep = load_sweep(
        _write(
            tmp_path / "sweep.yaml",
            {
                "base": "base.yaml",
                "output_dir": str(tmp_path / "out"),
                "seeds": [0],
                "variants": {"dr": {}},
            },
        )
    )
    (run,) = sweep.runs
    run.run_dir.mkdir(parents=True)
    written = load_config(sweep.base, list(run.overrides)).to_dict()
    written["data"]["eval"] = held
    _write(run.run_dir / "config.yaml", written)
    if same:
        check_run_config(sweep, run)
    else:
        with pytest.raises(SweepError, match=r"data\.eval"):
            check_run_config(sweep, run)


def test_submitit_local_executor_runs_two_tiny_runs(digit_model_dir, seven_task, tmp_path):
    pytest.importorskip("submitit")
    path = _tiny_sweep(tmp_path, digit_model_dir, seven_task, {"dr": {"algorithm.method": "dr_grpo"}}, [0, 1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "semrl",
            "sweep",
            str(path),
            "--launcher",
            "submitit-local",
            "--timeout-min",
            "10",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for run in load_sweep(path).runs:
        assert run_state(run) == "done"
        assert [r["step"] for r in _steps(run.run_dir)] == [0, 1, 2]
    assert "2 job(s) submitted" in out.stdout
    assert list((tmp_path / "out" / ".submitit").glob("*_result.pkl"))


def test_a_sweep_file_given_to_train_names_semrl_sweep(tmp_path, capsys):
    from semrl.cli import main

    sweep = tmp_path / "study.yaml"
    sweep.write_text("base: null\noutput_dir: out\nseeds: [0]\nvariants:\n  a: {}\n")
    assert main(["train", "--config", str(sweep)]) == 2
    err = capsys.readouterr().err
    assert "is a sweep file" in err and f"semrl sweep {sweep}" in err
    assert not (tmp_path / "out").exists() and not any(tmp_path.glob("runs"))


def test_the_base_evaluation_can_be_left_out_or_cut_to_a_subset(
    digit_model_dir, seven_task, tmp_path, forked_runs
):
    """logging.eval_base=false: no step-0 evaluation; logging.eval_base_problems=2: the base model on
    the first 2 held-out problems, the final evaluation on all 4, and compare's base row says so."""
    from semrl.studies.discovery import find_runs
    from semrl.studies.tables import final_table

    path = _tiny_sweep(
        tmp_path,
        digit_model_dir,
        seven_task,
        {
            "none": {"algorithm.method": "dr_grpo", "logging.eval_base": False},
            "subset": {"algorithm.method": "dr_grpo", "logging.eval_base_problems": 2},
        },
        [0],
        keep_checkpoints=False,
    )
    assert run_local(load_sweep(path), print) == 0
    none, subset = (_steps(tmp_path / "out" / v / "seed-0") for v in ("none", "subset"))
    assert [(r["step"], r["eval/problems"]) for r in none if "eval/problems" in r] == [(2, 4.0)]
    assert [(r["step"], r["eval/problems"]) for r in subset if "eval/problems" in r] == [(0, 2.0), (2, 4.0)]
    _, rows = final_table(find_runs([tmp_path / "out"]), "eval")
    assert rows[0][0] == "base model (step 0, 2 of 4 problems)"
    assert [row[0] for row in rows[1:]] == ["none", "subset"]


def _forced_study(tmp_path: Path, model_dir: Path, task: Path, looks: list[int]) -> tuple[Path, Path]:
    """A sweep whose per-seed outcome is forced by its correctness judges: 'always' marks every
    held-out sample correct and 'never' none, so always - never of eval/mean@4 is 1 on every seed
    (decided at the first look), and never - never is 0 (ruled out)."""
    judges = tmp_path / "judges.py"
    judges.write_text(
        "def always(prompts, completions, **kwargs):\n    return [1.0] * len(completions)\n\n\n"
        "def never(prompts, completions, **kwargs):\n    return [0.0] * len(completions)\n"
    )
    variants = {
        name: {
            "algorithm.method": "dr_grpo",
            "reward.functions": ["math", f"{judges}:{judge}"],
            "reward.correctness": f"{judges}:{judge}",
        }
        for name, judge in (("always", "always"), ("never", "never"), ("never2", "never"))
    }
    sweep = _tiny_sweep(tmp_path, model_dir, task, variants, [0, 1, 2, 3], keep_checkpoints=False)
    rules = _write(
        tmp_path / "rules.yaml",
        {
            "design": {"type": "group_sequential", "looks": looks, "boundary": "pocock"},
            "families": {"primary": "holm"},
            "rules": [
                {
                    "id": "up",
                    "metric": "eval/mean@4",
                    "pair": ["always", "never"],
                    "expect": "greater",
                    "margin": 0.1,
                },
                {
                    "id": "same",
                    "metric": "eval/mean@4",
                    "pair": ["never2", "never"],
                    "expect": "greater",
                    "margin": 0.1,
                },
            ],
        },
    )
    return sweep, rules


def test_until_decided_stops_at_the_look_that_settles_every_primary_rule_and_resumes_after_a_kill(
    digit_model_dir, seven_task, tmp_path, monkeypatch, capsys, forked_runs
):
    from semrl.studies.rules_file import load_rules
    from semrl.studies.study_loop import run_until_decided

    sweep_file, rules_file = _forced_study(tmp_path, digit_model_dir, seven_task, [2, 4])
    sweep, rules = load_sweep(sweep_file), load_rules(rules_file)
    out = tmp_path / "out"
    # killed in the first run: nothing judged yet, and the run resumes where it stopped
    monkeypatch.setenv("SEMRL_FAULT_KILL", "rollout@2")  # the first run dies in its second step
    assert run_until_decided(sweep, rules) != 0
    assert not (out / "looks.jsonl").exists()
    killed = [r.name for r in sweep.runs if run_state(r) == "resume"]
    assert killed == ["always/seed-0"]
    monkeypatch.delenv("SEMRL_FAULT_KILL")
    assert run_until_decided(sweep, rules) == 0
    looks = [json.loads(line) for line in (out / "looks.jsonl").read_text().splitlines()]
    assert [(e["look"], e["seeds"]) for e in looks] == [(1, [0, 1])]
    outcomes = {r["id"]: r["outcome"] for r in looks[0]["rules"]}
    assert outcomes == {"up": "decided", "same": "ruled out"}
    # stopped at look 1: seeds 2 and 3 never ran
    assert {r.seed for r in sweep.runs if run_state(r) == "done"} == {0, 1}
    assert not (out / "always" / "seed-2").exists()
    # running it again changes nothing and says why it stopped
    assert run_until_decided(sweep, rules) == 0
    assert "every primary rule is settled" in capsys.readouterr().out
    assert len((out / "looks.jsonl").read_text().splitlines()) == 1
    # --dry-run says so too, from the log
    assert main(["sweep", str(sweep_file), "--dry-run", "--until-decided", str(rules_file)]) == 0
    status = capsys.readouterr().out
    assert "look 1 at 2 seeds" in status and "up decided, same ruled out" in status
    assert "stopped at look 1: every primary rule is settled" in status
    # a look the design did not plan is refused; --descriptive shows it without outcomes
    from semrl.studies.seeds import compare_seeds

    with pytest.raises(ConfigError, match="looks at 2, 4 seeds only"):
        compare_seeds([out], rules=rules, seeds=[0])
    assert "descriptive only" in compare_seeds([out], rules=rules, seeds=[0], descriptive=True)


def test_until_decided_needs_a_design_and_enough_seeds(digit_model_dir, seven_task, tmp_path):
    from semrl.studies.rules_file import load_rules
    from semrl.studies.study_loop import run_until_decided

    sweep_file, rules_file = _forced_study(tmp_path, digit_model_dir, seven_task, [2, 6])
    with pytest.raises(SweepError, match="needs 6 seeds"):
        run_until_decided(load_sweep(sweep_file), load_rules(rules_file))
    plain = _write(tmp_path / "plain.yaml", yaml.safe_load(rules_file.read_text())["rules"])
    with pytest.raises(SweepError, match="design"):
        run_until_decided(load_sweep(sweep_file), load_rules(plain))


def test_dry_run_of_a_sequential_study_says_where_it_stands_and_judges_nothing(
    digit_model_dir, seven_task, tmp_path, capsys
):
    """--dry-run --until-decided reads the looks log and the finished runs' records only: the looks
    taken, the next look and the runs it needs, the hours against max_hours. It takes no look, even
    when the seeds of the next one are all finished (these runs hold no metrics to judge)."""
    sweep_file, rules_file = _forced_study(tmp_path, digit_model_dir, seven_task, [2, 4])
    rules = yaml.safe_load(rules_file.read_text())
    rules["design"]["max_hours"] = 5
    _write(rules_file, rules)
    out = tmp_path / "out"
    for variant in ("always", "never", "never2"):
        for seed in (0, 1):
            (out / variant / f"seed-{seed}").mkdir(parents=True)
            (out / variant / f"seed-{seed}" / "sweep_done.json").write_text(json.dumps({"seconds": 1200.0}))
    (out / "always" / "seed-2").mkdir()
    (out / "always" / "seed-2" / "metrics.jsonl").write_text('{"step": 1}\n')
    look = {
        "time": "2026-11-27T00:00:00+00:00",
        "look": 1,
        "seeds": [0, 1],
        "rules": [
            {"id": "up", "family": "primary", "outcome": "undecided"},
            {"id": "same", "family": "primary", "outcome": "ruled out"},
        ],
    }
    log = json.dumps(look) + "\n"
    (out / "looks.jsonl").write_text(log)

    def status() -> str:
        assert main(["sweep", str(sweep_file), "--dry-run", "--until-decided", str(rules_file)]) == 0
        return capsys.readouterr().out

    text = status()
    assert "2 of 4 seeds finished every variant (6 of 12 runs); runs' hours 2.0 of max_hours 5" in text
    assert "look 1 at 2 seeds (2026-11-27T00:00:00+00:00): up undecided, same ruled out" in text
    assert "next: look 2 at 4 seeds (seeds 0-3): 6 run(s) left; started: always/seed-2" in text
    assert "always/seed-3  [new]" in text  # the runs' list follows
    for variant in ("always", "never", "never2"):
        for seed in (2, 3):
            (out / variant / f"seed-{seed}").mkdir(exist_ok=True)
            (out / variant / f"seed-{seed}" / "sweep_done.json").write_text(json.dumps({"seconds": 600.0}))
    text = status()
    assert "4 of 4 seeds finished every variant (12 of 12 runs); runs' hours 3.0 of max_hours 5" in text
    assert "next: look 2 at 4 seeds (seeds 0-3): every run it reads is finished" in text
    assert (out / "looks.jsonl").read_text() == log
    rules["design"]["max_hours"] = 3
    _write(rules_file, rules)
    assert "stopped: the runs' hours passed max_hours" in status()
    look["look"], look["seeds"] = 2, [0, 1, 2, 3]
    (out / "looks.jsonl").write_text(log + json.dumps(look) + "\n")
    assert "stopped: the design's last look (2) is taken" in status()
