"""Where a training runs, apart from its models: its directory, its processes, the faults a test
injects, its random stream, its files and the watchdog of its rollouts (docs/architecture.md). The
``Trainer`` keeps this as one object beside its models (``semrl.runtime.setup.Models``), and a
checkpoint or a stage change takes both instead of their parts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from semrl.core.distributed import ProcessGroup
    from semrl.core.faults import Faults
    from semrl.core.watchdog import Watchdog
    from semrl.tracking.run_log import RunLog


@dataclass
class RunEnvironment:
    """A run's surroundings, built once when the run starts.

    Attributes:
        run_dir: ``logging.output_dir``: the config, checkpoints, metrics and samples.
        processes: this process's rank, world and device (one process without ``torchrun``).
        faults: where a test makes the run fail or stall (``semrl.core.faults``; none in real runs).
        generator: this process's random stream, seeded ``trainer.seed + rank``, saved in checkpoints.
        log: the run's files and trackers, written by the main process.
        watchdog: stops the process when a rollout or evaluation stalls (``rollout.stall_timeout_s``).
    """

    run_dir: Path
    processes: ProcessGroup
    faults: Faults
    generator: torch.Generator
    log: RunLog
    watchdog: Watchdog

    def close(self) -> None:
        """End the watchdog's thread and close the trackers; a later watched phase starts a new thread."""
        self.watchdog.close()
        self.log.close()
