"""Hot reload with last-good semantics."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.config_yaml import ConfigError, Problem
from gateway.reload import Reloadable


def _parse(path: Path) -> int:
    text = path.read_text()
    if not text.strip().isdigit():
        raise ConfigError([Problem(str(path), 1, 1, "not a number")])
    return int(text)


def _write(path: Path, text: str, tick: int) -> None:
    path.write_text(text)
    os.utime(path, ns=(tick * 10**9, tick * 10**9))  # distinct mtimes even within one clock tick


def test_reload_swaps_and_keeps_last_good(tmp_path: Path) -> None:
    f = tmp_path / "n.txt"
    _write(f, "1", 1)
    r = Reloadable(f, _parse)
    assert (r.current, r.check()) == (1, False)
    _write(f, "2", 2)
    assert r.check() and r.current == 2
    first = r.revision
    _write(f, "two", 3)
    assert not r.check()
    assert r.current == 2 and r.revision == first
    assert r.last_error == f"{f}:1:1: not a number"
    _write(f, "3", 4)
    assert r.check() and r.current == 3 and r.last_error is None
    f.unlink()
    assert not r.check() and r.current == 3


def test_whitespace_only_touch_does_not_reparse(tmp_path: Path) -> None:
    calls: list[int] = []

    def parse(path: Path) -> int:
        calls.append(1)
        return _parse(path)

    f = tmp_path / "n.txt"
    _write(f, "5", 1)
    r = Reloadable(f, parse)
    _write(f, "5", 2)  # same bytes, new mtime: digest unchanged
    assert not r.check()
    assert len(calls) == 1


def test_broken_file_at_start_is_an_error(tmp_path: Path) -> None:
    f = tmp_path / "n.txt"
    f.write_text("x")
    with pytest.raises(ConfigError):
        Reloadable(f, _parse)
