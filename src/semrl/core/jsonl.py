"""JSON-lines logs (metrics, samples, trees, evaluation records) read back safely.

A finished study's records may be stored gzip-compressed, ``metrics.jsonl.gz`` beside nothing
(docs/sweeps.md, "Committing a study"): every reader goes through ``stored``, so a run directory
reads the same either way. Logs are always written plain, since they are appended to.
"""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

COMPRESSED_SUFFIX = ".gz"


def stored(path: str | Path) -> Path:
    """``path``, or its compressed copy ``path.gz`` where only that exists."""
    path = Path(path)
    if not path.exists():
        compressed = path.with_name(path.name + COMPRESSED_SUFFIX)
        if compressed.exists():
            return compressed
    return path


def log_exists(path: str | Path) -> bool:
    """Whether the log ``path`` exists, plain or compressed."""
    return stored(path).exists()


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Complete JSON lines of a log, plain or compressed (``stored``); a torn last line (a process
    killed mid-write) is skipped, and a missing log reads as no lines."""
    path = stored(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    if path.name.endswith(COMPRESSED_SUFFIX):
        data = gzip.decompress(data)
    rows = []
    for line in data.decode("utf-8").splitlines():
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            logger.warning("%s: skipping a line that is not complete JSON", path)
    return rows
