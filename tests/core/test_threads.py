"""Threads on a busy machine (semrl.core.threads): OpenMP waits passively unless the user chose a
policy, and torch gets no more threads than the process has cores."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from semrl.core.threads import available_cores, torch_threads


def _policy_after_import(env: dict[str, str]) -> str:
    code = "import semrl, os; print(os.environ.get('OMP_WAIT_POLICY'))"
    clean = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    return subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.mark.e2e  # starts a process
def test_importing_semrl_makes_openmp_wait_passively_unless_the_user_chose():
    assert _policy_after_import({}) == "PASSIVE"
    assert _policy_after_import({"OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE"


def test_torch_threads_follow_the_config_then_omp_num_threads_then_the_affinity(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for cores in range(1, 5):
        monkeypatch.setattr(os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)))
        assert available_cores() == cores
        for current in range(1, 9):
            assert torch_threads(None, current) == (cores if cores < current else None)
            assert torch_threads(3, current) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert torch_threads(None, 8) is None and torch_threads(2, 8) == 2


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to narrow to one")
def test_a_run_pinned_to_one_core_trains_on_one_thread(digit_model_dir, seven_task, tmp_path, monkeypatch):
    from semrl.config.load import load_config
    from semrl.runtime.trainer import Trainer
    from tests.helpers import DIGIT_SYSTEM_PROMPT

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores, threads = os.sched_getaffinity(0), torch.get_num_threads()
    os.sched_setaffinity(0, {min(cores)})
    try:
        torch.set_num_threads(2)
        cfg = load_config(
            None,
            [
                f"model.name={digit_model_dir}",
                f"data.train={seven_task}",
                "data.eval=null",
                f"data.system_prompt={DIGIT_SYSTEM_PROMPT}",
                "reward.num_workers=1",
                "logging.progress=false",
                f"logging.output_dir={tmp_path / 'run'}",
                "logging.report_to=[]",
            ],
        )
        Trainer(cfg).close()
        assert torch.get_num_threads() == 1
    finally:
        os.sched_setaffinity(0, cores)
        torch.set_num_threads(threads)
