"""Atomic directories and files (semrl.core.atomic): a crash leaves the old version or nothing."""

from __future__ import annotations

import pytest

from semrl.core.atomic import atomic_directory, write_text_atomic


def test_atomic_directory_appears_whole_or_not_at_all(tmp_path):
    final = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with atomic_directory(final) as tmp:
            (tmp / "a.txt").write_text("half")
            raise RuntimeError("crash while writing")
    assert not final.exists() and list(tmp_path.iterdir()) == []  # the temporary is gone too
    with atomic_directory(final) as tmp:
        (tmp / "a.txt").write_text("whole")
    assert (final / "a.txt").read_text() == "whole" and [p.name for p in tmp_path.iterdir()] == ["out"]
    with atomic_directory(final) as tmp:  # replaces the previous version
        (tmp / "b.txt").write_text("new")
    assert sorted(p.name for p in final.iterdir()) == ["b.txt"]
    with pytest.raises(OSError):  # without replace, an existing non-empty directory stays
        with atomic_directory(final, replace=False) as tmp:
            (tmp / "c.txt").write_text("loser")
    assert sorted(p.name for p in final.iterdir()) == ["b.txt"] and len(list(tmp_path.iterdir())) == 1


def test_write_text_atomic_replaces_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / "x.jsonl"
    write_text_atomic(path, "one\n")
    write_text_atomic(path, "two\n")
    assert path.read_text() == "two\n" and [p.name for p in path.parent.iterdir()] == ["x.jsonl"]
