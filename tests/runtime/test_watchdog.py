"""The stall watchdog belongs to its training (docs/reliability.md, "A stalled engine"): its thread
ends with the training, a second training is watched by its own limit and advice alone, and a phase's
time counts from the phase's start."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

from tests.helpers import tiny_run_config, tiny_run_overrides


def _watchdog_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "semrl-watchdog" and t.is_alive()]


def _run(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter: a watchdog that stalls ends its process (exit code 3)."""
    script = "import time\nfrom semrl.core.watchdog import Watchdog, beat\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)


@pytest.mark.e2e  # starts a process
def test_a_second_training_is_watched_by_its_own_limit_and_advice_only():
    """The first training's watchdog (0.3 s, advice "first") is closed; the second one's (30 s) phase
    goes 1.5 s without a beat, which only the first one's limit would call a stall."""
    done = _run(
        """
        first = Watchdog(0.3, "hf", "rollout.stall_timeout_s", lambda: "first. ")
        with first.watching("step 1's rollout"):
            beat()
        first.close()
        second = Watchdog(30.0, "hf", "rollout.stall_timeout_s", lambda: "second. ")
        with second.watching("step 1's rollout"):
            time.sleep(1.5)
        second.close()
        print("watched alone")
        """
    )
    assert done.returncode == 0 and "watched alone" in done.stdout, done.stderr


@pytest.mark.e2e  # starts a process
def test_a_phase_counts_from_its_start_not_from_the_last_beat_before_it():
    """1 s passes between two phases (an update, say) with no beat; the next phase, 0.4 s long within
    a 0.8 s limit, is not a stall. A stall inside a phase still ends the process, with its advice."""
    done = _run(
        """
        dog = Watchdog(0.8, "hf", "rollout.stall_timeout_s", lambda: "kept step-000002. ")
        with dog.watching("step 1's rollout"):
            beat()
        time.sleep(1.0)
        with dog.watching("step 2's rollout"):
            time.sleep(0.4)
        print("no stall")
        with dog.watching("step 3's rollout"):
            time.sleep(5)
        print("never printed")
        """
    )
    assert "no stall" in done.stdout and "never printed" not in done.stdout, done.stderr
    assert done.returncode == 3 and "in step 3's rollout" in done.stderr and "kept step-000002" in done.stderr


class _Interrupted(BaseException):
    """Raised from a reward function: nothing in the trainer catches it."""


def test_no_watchdog_thread_outlives_semrl_train_when_it_returns_or_raises(
    digit_model_dir, seven_task, tmp_path
):
    import semrl

    # a test that ran a Trainer's phases by hand in this worker may have left its own thread
    before = set(_watchdog_threads())
    semrl.train(overrides=tiny_run_overrides(digit_model_dir, seven_task, tmp_path / "a", "trainer.steps=1"))
    assert set(_watchdog_threads()) == before

    def interrupts(prompts, completions, **kwargs):
        assert set(_watchdog_threads()) - before  # the rollout before it was watched
        raise _Interrupted

    with pytest.raises(_Interrupted):
        semrl.train(
            overrides=tiny_run_overrides(digit_model_dir, seven_task, tmp_path / "b", "trainer.steps=1"),
            reward_functions=[interrupts],
        )
    assert set(_watchdog_threads()) == before


def test_a_trainer_whose_stages_run_by_hand_ends_its_watchdog_thread_when_closed(
    digit_model_dir, seven_task, tmp_path
):
    """A caller that runs a Trainer's stages itself (here ``rollout``) ends the watchdog's thread
    with ``close()``, here through a ``with`` block, as ``train`` does when it returns."""
    from semrl.runtime.trainer import Trainer

    before = set(_watchdog_threads())
    with Trainer(tiny_run_config(digit_model_dir, seven_task, tmp_path / "a", "trainer.steps=0")) as trainer:
        trainer.rollout()
        assert len(set(_watchdog_threads()) - before) == 1  # the rollout was watched
    assert set(_watchdog_threads()) <= before
