"""Running a training job: the trainer loop, set-up, checkpoints, processes, preemption."""
