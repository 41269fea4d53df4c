"""Files and directories written so that no reader ever sees them half written: under a temporary
name beside the target, renamed into place only once complete. A crash leaves the previous version
(or nothing) and, at worst, a temporary that the next write or ``cleanup_partial`` removes."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_directory(final: Path, *, prefix: str | None = None, replace: bool = True) -> Iterator[Path]:
    """Yield a fresh temporary directory beside ``final``; when the block ends without an error it
    becomes ``final``, otherwise it is removed.

    Args:
        prefix: the temporary's name prefix (default ``.NAME.tmp-``), for finding leftovers.
        replace: replace an existing ``final`` (removed just before the rename); without it the
            rename fails with ``OSError`` when ``final`` exists and is not empty.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix or f".{final.name}.tmp-", dir=final.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; what it holds is meant to be shared
    try:
        yield tmp
        if replace and final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already after the rename


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary sibling and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
