"""reward.functions: built-in checks, the user's own (module path, file path, verl style), weights,
and what happens when a function raises, hangs, is missing or has the wrong signature."""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from semrl.reward import VerifierPool, extract_answer, reward_functions
from semrl.reward.functions import RewardFunctionError, boxed_match, final_number

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
USER_MODULE = textwrap.dedent(
    """
    import time

    def length_reward(prompts, completions, completion_ids, **kwargs):
        return [len(ids) / 10 for ids in completion_ids]

    def mentions_answer(prompts, completions, answer, **kwargs):
        return [1.0 if a in c else None for c, a in zip(completions, answer)]

    def level_bonus(prompts, completions, level, id, **kwargs):
        return [float(lv) + (0.5 if i.endswith("x") else 0.0) for lv, i in zip(level, id)]

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": 2.0 if solution_str.strip().endswith(ground_truth) else -1.0, "acc": 0}

    def raises_on_q(prompts, completions, **kwargs):
        if "q" in completions[0]:
            raise RuntimeError("no q allowed")
        return [0.25]

    def hangs_on_h(prompts, completions, **kwargs):
        if "h" in completions[0]:
            while True:  # spins: the budget counts the worker's CPU time
                pass
        return [1.0]

    def wrong(text):
        return 1.0
    """
)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    package = tmp_path / "myrewards"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "scores.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "loose.py").write_text(USER_MODULE)
    return tmp_path


def _random_cases(n: int, seed: int):
    rng = random.Random(seed)
    prompts = [f"What is {i}?" for i in range(n)]
    answers = [str(rng.randint(0, 9)) for _ in range(n)]
    completions = [
        " ".join(
            rng.choice(["the", "answer", "is", "\\boxed{3}", "7", "x"]) for _ in range(rng.randint(0, 6))
        )
        + rng.choice(["", f" {answers[i]}", f" \\boxed{{{answers[i]}}}"])
        for i in range(n)
    ]
    ids = [list(range(rng.randint(0, 12))) for _ in range(n)]
    columns = [
        {
            "id": f"p{i}" + rng.choice(["", "x"]),
            "answer": answers[i],
            "solution": None,
            "level": rng.randint(1, 5),
            "subject": None,
        }
        for i in range(n)
    ]
    return prompts, completions, ids, columns


def _score(functions, weights, cases, pool):
    prompts, completions, ids, columns = cases
    return functions.score(pool, prompts, completions, ids, columns, final_number_fallback=True)


@pytest.mark.e2e  # starts a process
def test_weighted_sum_of_module_file_and_builtin_functions(user_module):
    names = [
        "myrewards.scores:length_reward",
        f"{user_module / 'loose.py'}:mentions_answer",
        "myrewards.scores:level_bonus",
        "final_number",
        "boxed_match",
        "math",
    ]
    cases = _random_cases(40, 0)
    prompts, completions, ids, columns = cases
    for seed in range(3):
        rng = random.Random(seed)
        weights = [rng.uniform(-2, 2) for _ in names]
        functions = reward_functions(names, weights)
        answers = [c["answer"] for c in columns]
        with VerifierPool(2, 10.0, functions.pool_functions) as pool:
            results, sums = _score(functions, weights, cases, pool)
            math = [
                float(v.correct)
                for v in pool.verify_many(
                    [(a, extract_answer(c, True)) for a, c in zip(answers, completions, strict=True)]
                )
            ]
        expected_scores = [
            [len(i) / 10 for i in ids],
            [1.0 if a in c else 0.0 for c, a in zip(completions, answers, strict=True)],  # None: 0
            [float(c["level"]) + (0.5 if c["id"].endswith("x") else 0.0) for c in columns],
            final_number(prompts, completions, answers),
            boxed_match(prompts, completions, answers),
            math,
        ]
        for i, result in enumerate(results):
            want = sum(w * s[i] for w, s in zip(weights, expected_scores, strict=True))
            assert result.reward == pytest.approx(want, abs=1e-9)
            assert result.correct == (expected_scores[3][i] == 1.0)  # final_number: the first check listed
        assert sums["rewards/length_reward/sum"] == pytest.approx(sum(expected_scores[0]))
        assert sums["rewards/mentions_answer/errors"] == 0


def test_builtin_checks():
    answers = ["7", "3/4", "x^2"]
    completions = ["so \\boxed{7}", "it is 0.75 or \\boxed{3/4}", "\\boxed{x ^ 2} and 5"]
    assert boxed_match([""] * 3, completions, answers) == [1.0, 1.0, 1.0]
    assert final_number([""] * 3, completions, answers) == [1.0, 1.0, 0.0]
    assert boxed_match([""], ["\\boxed{7.0}"], ["7"]) == [0.0]  # a strict string match, as ROSE's code
    assert final_number([""], ["6/8"], ["3/4"]) == [1.0]


@pytest.mark.e2e  # starts a process
def test_verl_style_function_through_the_adapter(user_module):
    functions = reward_functions(["myrewards.scores:compute_score"])
    cases = _random_cases(20, 1)
    with VerifierPool(1, 10.0, functions.pool_functions) as pool:
        results, _ = _score(functions, None, cases, pool)
    for result, completion, columns in zip(results, cases[1], cases[3], strict=True):
        assert result.reward == (2.0 if completion.strip().endswith(columns["answer"]) else -1.0)


@pytest.mark.e2e  # starts a process
def test_raising_and_hanging_functions_score_zero_and_are_counted(user_module, caplog):
    names = ["myrewards.scores:raises_on_q", "myrewards.scores:hangs_on_h"]
    functions = reward_functions(names)
    prompts = ["p"] * 4
    completions = ["fine", "q only", "h!", "qh"]
    columns = [{"id": str(i), "answer": "1"} for i in range(4)]
    with caplog.at_level(logging.WARNING), VerifierPool(2, 1.0, functions.pool_functions) as pool:
        start = time.monotonic()
        results, sums = functions.score(
            pool, prompts, completions, [[1]] * 4, columns, final_number_fallback=True
        )
        elapsed = time.monotonic() - start
    assert [r.reward for r in results] == [0.25 + 1.0, 0.0 + 1.0, 0.25 + 0.0, 0.0 + 0.0]
    assert sums["rewards/raises_on_q/errors"] == 2 and sums["rewards/raises_on_q/timeouts"] == 0
    assert sums["rewards/hangs_on_h/timeouts"] == 2 and sums["rewards/hangs_on_h/errors"] == 2
    assert elapsed < 30  # killed at the 1 s CPU budget, not left to spin until the wall-clock net
    logged = [r.getMessage() for r in caplog.records if "raises_on_q" in r.getMessage()]
    assert len(logged) == 1 and "RuntimeError: no q allowed" in logged[0]  # the first traceback, once


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("no_such_package.module:fn", "cannot import module 'no_such_package.module'"),
        ("myrewards.scores:absent", "has no function 'absent'"),
        ("myrewards.scores:lenght_reward", "Did you mean 'myrewards.scores:length_reward'?"),
        ("missing_file.py:fn", "does not exist"),
        ("myrewards.scores:wrong", "expected TRL's"),
        ("notaname", "expected a built-in"),
        ("boxed_mach", "Did you mean 'boxed_match'?"),
        ("broken.py:fn", "broken.py, line 2: expected ':'\n    def fn(prompts, completions)"),
    ],
)
def test_bad_functions_fail_before_training(user_module, name, message, monkeypatch):
    (user_module / "broken.py").write_text("\ndef fn(prompts, completions)\n    return [1.0]\n")
    monkeypatch.chdir(user_module)
    with pytest.raises(RewardFunctionError) as err:
        reward_functions([name])
    assert message in str(err.value)


@pytest.mark.e2e  # starts a process
def test_a_function_failing_above_max_error_rate_stops_scoring_with_its_name(user_module):
    """raises_on_q fails on 2 of 4 completions: above reward.max_error_rate=0.25 scoring stops with
    its name and first traceback; at 0.5 it is scored 0 and counted. hangs_on_h's 2 time-outs of 4
    never count: a time-out is a hostile answer's, not a broken function's."""
    from semrl.errors import TrainingError

    names = ["myrewards.scores:raises_on_q", "myrewards.scores:hangs_on_h"]
    completions = ["fine", "q only", "h!", "qh"]
    columns = [{"id": str(i), "answer": "1"} for i in range(4)]
    call = (["p"] * 4, completions, [[1]] * 4, columns)
    with VerifierPool(2, 1.0, tuple(names)) as pool:
        stopping = reward_functions(["math", *names], max_error_rate=0.25)
        with pytest.raises(TrainingError, match="'myrewards.scores:raises_on_q' failed on 2 of the 4") as err:
            stopping.score(pool, *call, final_number_fallback=True)
        assert "RuntimeError: no q allowed" in str(err.value) and "reward.max_error_rate=0.25" in str(
            err.value
        )
        _, sums = reward_functions(["math", *names], max_error_rate=0.5).score(
            pool, *call, final_number_fallback=True
        )
        assert sums["rewards/raises_on_q/errors"] == 2
    with VerifierPool(2, 1.0, (names[1],)) as pool:
        only_timeouts = reward_functions([names[1]], max_error_rate=0.0)
        _, sums = only_timeouts.score(pool, *call, final_number_fallback=True)
        assert sums["rewards/hangs_on_h/timeouts"] == 2


ALWAYS_FAILS = textwrap.dedent(
    """
    def raises(prompts, completions, **kwargs):
        raise ValueError("my reward is broken")

    def too_many(prompts, completions, **kwargs):  # written for a batch: one score per call is expected
        return [1.0, 1.0]
    """
)


@pytest.mark.parametrize("function", ["raises", "too_many"])
def test_a_reward_function_failing_on_every_completion_stops_the_run_at_step_1(
    digit_model_dir, seven_task, tmp_path, capsys, function
):
    """`semrl train` with a function that raises, or returns two scores for one completion, on every
    completion: exit code 3 at step 1, naming the function and its error, no step logged; with
    reward.max_error_rate=1 the run goes on and its end-of-run table shows the errors (2 steps of 32)."""
    from semrl.cli import main
    from tests.helpers import read_metrics, tiny_run_overrides

    (tmp_path / "broken.py").write_text(ALWAYS_FAILS)
    listed = f"reward.functions=[math, {tmp_path / 'broken.py'}:{function}]"
    run = tmp_path / "run"
    code = main(["train", *tiny_run_overrides(digit_model_dir, seven_task, run, listed, "trainer.steps=2")])
    err = capsys.readouterr().err
    assert code == 3, err[-2000:]
    assert (
        f"semrl: stopped: reward function '{tmp_path / 'broken.py'}:{function}' failed on 32 of the 32" in err
    )
    assert (
        "ValueError: my reward is broken" if function == "raises" else "expected a list of 1 score"
    ) in err
    assert not (run / "metrics.jsonl").exists() or not [m for m in read_metrics(run) if "reward" in m]
    kept = tmp_path / "kept"
    more = ("trainer.steps=2", "reward.max_error_rate=1")
    assert main(["train", *tiny_run_overrides(digit_model_dir, seven_task, kept, listed, *more)]) == 0
    rows = [
        line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith(function)
    ]
    assert rows == [[function, "64", "0"]]


def test_training_reward_is_the_custom_function(tiny_model_dir, tmp_path, user_module):
    from semrl.config.load import load_config
    from semrl.runtime.trainer import Trainer

    task = tmp_path / "task.jsonl"
    task.write_text(
        "".join(json.dumps({"id": f"t{i}", "problem": f"Say {i}.", "answer": "7"}) + "\n" for i in range(8))
    )
    cfg = load_config(
        None,
        [
            f"model.name={tiny_model_dir}",
            f"data.train={task}",
            "data.eval=null",
            "rollout.group_size=4",
            "rollout.prompts_per_step=2",
            "rollout.max_new_tokens=8",
            "trainer.steps=1",
            "logging.progress=false",
            "logging.report_to=[]",
            f"logging.output_dir={tmp_path / 'run'}",
            "reward.num_workers=1",
            f"reward.functions=[{user_module / 'loose.py'}:length_reward]",
            "reward.weights=[3]",
        ],
    )
    metrics = Trainer(cfg).train()
    # length_reward = tokens / 10, weighted by 3: the step's reward is 0.3 x the mean response length
    assert metrics["reward"] == pytest.approx(0.3 * metrics["response_length"], rel=1e-6)
    assert metrics["rewards/length_reward/mean"] == pytest.approx(metrics["response_length"] / 10, rel=1e-6)


def test_python_api_with_file_and_in_process_functions(tiny_model_dir, tmp_path):
    """semrl.train as the README shows it: the example file's function by path, and a function
    defined here (nested, so the workers cannot import it: it runs in this process)."""
    import semrl

    calls = []

    def short_answers(prompts, completions, completion_ids, **kwargs):
        calls.append(len(completions))
        return [1.0 if len(ids) < 4 else 0.0 for ids in completion_ids]

    task = tmp_path / "task.jsonl"
    task.write_text(
        "".join(json.dumps({"id": f"t{i}", "problem": f"Say {i}.", "answer": "7"}) + "\n" for i in range(8))
    )
    metrics = semrl.train(
        overrides=[
            f"model.name={tiny_model_dir}",
            f"data.train={task}",
            "data.eval=null",
            "rollout.group_size=4",
            "rollout.prompts_per_step=2",
            "rollout.max_new_tokens=8",
            "trainer.steps=1",
            "logging.progress=false",
            "logging.report_to=[]",
            f"logging.output_dir={tmp_path / 'run'}",
            "reward.num_workers=1",
        ],
        reward_functions=["math", (f"{EXAMPLES / 'rewards.py'}:boxed_format", 0.5), (short_answers, 2.0)],
    )
    assert calls == [1] * 8  # one call per completion
    assert metrics["reward"] == pytest.approx(
        metrics["rewards/math/mean"]
        + 0.5 * metrics["rewards/boxed_format/mean"]
        + 2.0 * metrics["rewards/short_answers/mean"],
        abs=1e-9,
    )


def test_the_api_gives_a_config_object_left_auto_a_directory_of_its_own(
    tiny_model_dir, tmp_path, monkeypatch
):
    """semrl.train(Config) with logging.output_dir 'auto' (a Config built in Python, not loaded from
    a file) trains into runs/METHOD-YYYYMMDD-HHMMSS, as load_config would have named it."""
    import dataclasses
    import re

    import semrl
    from semrl.config.load import load_config

    task = tmp_path / "task.jsonl"
    task.write_text("".join(json.dumps({"problem": f"Say {i}.", "answer": "7"}) + "\n" for i in range(8)))
    cfg = load_config(
        None,
        [
            f"model.name={tiny_model_dir}",
            f"data.train={task}",
            "data.eval=null",
            "rollout.group_size=2",
            "rollout.prompts_per_step=2",
            "rollout.max_new_tokens=4",
            "trainer.steps=1",
            "logging.progress=false",
            "logging.report_to=[]",
            "reward.num_workers=1",
            "logging.output_dir=placeholder",
        ],
    )
    cfg = dataclasses.replace(cfg, logging=dataclasses.replace(cfg.logging, output_dir="auto"))
    monkeypatch.chdir(tmp_path)
    semrl.train(cfg)
    (made,) = (tmp_path / "runs").iterdir()
    assert re.fullmatch(r"dr_grpo-\d{8}-\d{6}", made.name) and (made / "metrics.jsonl").is_file()
    assert not (tmp_path / "auto").exists()


@pytest.mark.e2e  # starts a process
def test_functions_with_one_name_from_two_files_get_distinct_metric_keys(user_module):
    other = user_module / "other"
    other.mkdir()
    (other / "loose.py").write_text(USER_MODULE.replace("len(ids) / 10", "len(ids) / 5"))
    (user_module / "second.py").write_text(USER_MODULE.replace("len(ids) / 10", "1.0 + 0 * len(ids)"))
    names = [
        f"{user_module / 'loose.py'}:length_reward",
        f"{user_module / 'second.py'}:length_reward",
        "myrewards.scores:length_reward",
        f"{other / 'loose.py'}:length_reward",
        "math",
        "math",
    ]
    functions = reward_functions(names, None)
    assert functions.metric_keys == (
        "loose.length_reward#1",
        "second.length_reward",
        "scores.length_reward",
        "loose.length_reward#2",
        "math#1",
        "math#2",
    )
    assert reward_functions(["myrewards.scores:length_reward", "math"], None).metric_keys == (
        "length_reward",
        "math",
    )
    cases = _random_cases(12, 1)
    with VerifierPool(2, 10.0, functions.pool_functions) as pool:
        _, sums = _score(functions, None, cases, pool)
    ids = cases[2]
    assert sums["rewards/loose.length_reward#1/sum"] == pytest.approx(sum(len(i) / 10 for i in ids))
    assert sums["rewards/loose.length_reward#2/sum"] == pytest.approx(sum(len(i) / 5 for i in ids))
    assert sums["rewards/second.length_reward/sum"] == pytest.approx(12.0)
    assert len([k for k in sums if k.endswith("/sum")]) == 6


SCRIPT = """
import semrl

semrl.train(None, ["model.name={model}", "data.train={task}", "data.eval=null", "rollout.group_size=2",
                   "rollout.prompts_per_step=2", "rollout.max_new_tokens=2", "trainer.steps=1",
                   "reward.num_workers=1", "logging.output_dir={out}", "logging.progress=false",
                   "logging.report_to=[]", "reward.functions=[{rewards}:length_reward]"])
print("TRAINED")
"""


def _run_script(script: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """``script`` run as a user runs it (``python script.py``), with this interpreter's import path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=timeout
    )


def _assert_told_to_add_a_guard(out: subprocess.CompletedProcess[str], script: Path) -> None:
    assert out.returncode != 0
    assert "has no 'if __name__ == \"__main__\":' guard" in out.stderr and str(script) in out.stderr
    assert "check that 'python -c" not in out.stderr


@pytest.mark.parametrize("guarded", [False, True])
def test_a_script_without_a_main_guard_is_told_to_add_one(tiny_model_dir, seven_task, tmp_path, guarded):
    (tmp_path / "rewards.py").write_text(USER_MODULE)  # a function of its own: scored in the reward workers
    body = SCRIPT.format(
        model=tiny_model_dir, task=seven_task, out=tmp_path / "run", rewards=tmp_path / "rewards.py"
    )
    if guarded:
        body = "if __name__ == '__main__':\n" + textwrap.indent(body, "    ")
    script = tmp_path / "train_me.py"
    script.write_text(body)
    out = _run_script(script, timeout=600)
    if guarded:
        assert out.returncode == 0 and "TRAINED" in out.stdout, out.stderr[-2000:]
    else:
        _assert_told_to_add_a_guard(out, script)


UNGUARDED_SLOW_SCRIPT = """
import time

import semrl.reward.verify as verify
from semrl.reward import VerifierPool

verify.STARTUP_TIMEOUT_S = 3.0  # the real limit is 120 s; the test need not wait that long (the
# diagnosis reads the script, not the worker, so a worker still importing says the same)
if __name__ == "__mp_main__":  # a worker re-running the script: as if it loaded a model first
    time.sleep(60)
VerifierPool(1, 5.0).wait_ready()
print("READY")
"""
GUARDED_SCRIPT = """
from semrl.reward import VerifierPool

if __name__ == "__main__":
    VerifierPool(1, 5.0).wait_ready()
    print("READY")
"""


@pytest.mark.e2e  # starts a process
@pytest.mark.parametrize("guarded", [False, True])
def test_a_worker_still_running_an_unguarded_script_is_told_to_add_a_guard(tmp_path, guarded):
    """A worker that has not started in time because it re-runs the script's slow top-level code
    names the script and the guard, not math-verify; with the guard the worker starts."""
    script = tmp_path / "slow_script.py"
    script.write_text(GUARDED_SCRIPT if guarded else UNGUARDED_SLOW_SCRIPT)
    out = _run_script(script, timeout=300)
    if guarded:
        assert out.returncode == 0 and "READY" in out.stdout, out.stderr[-2000:]
    else:
        _assert_told_to_add_a_guard(out, script)
        assert "did not start within 3 s because" in out.stderr
