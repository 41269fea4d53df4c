"""semrl's tests. semrl is imported before conftest and helpers import torch, so that OpenMP in this process and in
every process a test starts waits passively (semrl.core.threads): tests that run two processes on
two cores would otherwise spin against each other."""

import semrl  # noqa: F401
