"""What the vllm engine keeps for the whole process, in one place (docs/engines.md).

The engine core runs in the training process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), and one vLLM
engine serves every ``VLLMEngine`` of a model shape, so these outlive any one engine object:

* ``ENGINES``: the started vLLM engines, one per model shape (``semrl.rollout.engines.vllm.start``);
  a second Trainer, test or evaluation reuses one instead of paying vLLM's start-up again.
* ``REQUEST_IDS``: the counter behind every request id, so no two requests of the process share one
  (vLLM's scheduler, the fork's marks and the entropy records are keyed by it).
* ``ENTROPY_RECORDS``: request id -> the entropy of each output position, written by vLLM's sampler
  (``semrl.rollout.engines.vllm.entropy``) and taken by the engine when the request finishes; empty
  after every engine call.
* ``NOTICES_SAID``: the fork's notices already logged (why it is off, a full hold budget), each said
  once per process.

Modules read them through this module (``state.ENGINES``), so a test may swap one for its own.
"""

from __future__ import annotations

import itertools
from typing import Any

ENGINES: dict[tuple[Any, ...], Any] = {}  # model shape -> start.StartedEngine
REQUEST_IDS = itertools.count()
ENTROPY_RECORDS: dict[str, list[float]] = {}
NOTICES_SAID: set[str] = set()
