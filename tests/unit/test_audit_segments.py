"""Audit chains in segments: the writer closes full files, the verifier reads them as one chain."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import audit

RECORD = {"kind": "request", "text": "提示 ünïcode"}  # 207 bytes once chained: 3 fill a 600-byte segment


def _write(path: Path, n: int, segment_bytes: int = 600, start: int = 0) -> audit.ChainWriter:
    w = audit.ChainWriter(path, segment_bytes)
    for i in range(start, start + n):
        w.append({**RECORD, "i": i})
    w.close()
    return w


def _names(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


def test_a_full_live_file_becomes_a_segment_and_the_chain_goes_on(tmp_path: Path) -> None:
    live = tmp_path / "h-w1.jsonl"
    w = _write(live, 7)
    assert _names(live) == ["h-w1.jsonl", "h-w1.seg000001.jsonl", "h-w1.seg000002.jsonl"]
    assert all(p.stat().st_size >= 600 for p in audit.segments(live))
    v = audit.verify(live, keep=True)
    assert (v.ok, v.records, v.files, v.head) == (True, 7, 3, w.head)
    assert [r["i"] for r in v.kept] == list(range(7))
    # a restarted writer continues the live file; with a new, empty live file, the last segment
    w = _write(live, 2, start=7)
    os.rename(live, live.with_name("h-w1.seg000003.jsonl"))  # as if it crashed right after a close
    _write(live, 1, start=9)
    v = audit.verify(live, keep=True)
    assert (v.ok, v.records) == (True, 10), v.problem
    assert [r["seq"] for r in v.kept] == list(range(10))


def test_a_missing_or_cut_segment_breaks_the_chain_where_it_no_longer_links(tmp_path: Path) -> None:
    live = tmp_path / "h-w1.jsonl"
    _write(live, 10)
    seg = audit.segments(live)
    assert len(seg) == 3
    first_of_third = audit.verify(seg[2]).problem  # a segment alone is not a chain start
    assert first_of_third is not None
    data = seg[1].read_bytes()
    seg[1].write_bytes(data[: data.rstrip(b"\n").rfind(b"\n") + 1])  # its last record cut off
    v = audit.verify(live)
    assert v.problem == "h-w1.seg000003.jsonl line 1: seq 6, expected 5 (removed or reordered)"
    seg[1].unlink()
    assert (
        audit.verify(live).problem == "h-w1.seg000003.jsonl line 1: seq 6, expected 3 (removed or reordered)"
    )


def test_a_pruned_chain_verifies_only_when_asked_and_says_where_it_starts(tmp_path: Path) -> None:
    live = tmp_path / "h-w1.jsonl"
    w = _write(live, 9)
    audit.segments(live)[0].unlink()  # archived away
    strict = audit.verify(live)
    assert strict.problem == "h-w1.seg000002.jsonl line 1: seq 3, expected 0 (removed or reordered)"
    pruned = audit.verify(live, pruned_ok=True)
    assert (pruned.ok, pruned.starts_at, pruned.records, pruned.head) == (True, 3, 6, w.head)
    # on trust is the first record only: an edit after it is still found
    live.write_bytes(live.read_bytes().replace(b'"i":7', b'"i":9'))
    assert not audit.verify(live, pruned_ok=True).ok


def test_chains_are_named_by_their_live_file(tmp_path: Path) -> None:
    _write(tmp_path / "a-w1.jsonl", 5)
    _write(tmp_path / "b.seg-w2.jsonl", 1)  # a name with ".seg" in it is still a live file
    (tmp_path / "c-w3.seg000001.jsonl").write_bytes((tmp_path / "a-w1.seg000001.jsonl").read_bytes())
    assert [p.name for p in audit.chain_files(tmp_path)] == ["a-w1.jsonl", "b.seg-w2.jsonl", "c-w3.jsonl"]
    assert audit.chain_files(tmp_path / "a-w1.seg000001.jsonl") == [tmp_path / "a-w1.jsonl"]
    assert audit.verify(tmp_path / "c-w3.jsonl").ok  # only its segment is there


def test_without_a_segment_size_the_chain_is_one_file(tmp_path: Path) -> None:
    live = tmp_path / "one.jsonl"
    _write(live, 20, segment_bytes=0)
    assert _names(live) == ["one.jsonl"]
    assert audit.verify(live).records == 20


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_changed_byte_in_any_segment_is_found(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    live = tmp_path_factory.mktemp("s") / "h-w1.jsonl"
    _write(live, 8)
    files = [*audit.segments(live), live]
    f = data.draw(st.sampled_from(files))
    raw = bytearray(f.read_bytes())
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] = data.draw(st.integers(0, 255).filter(lambda b: b != raw[i]))
    f.write_bytes(bytes(raw))
    assert not audit.verify(live).ok


def test_syncs_from_another_thread_never_meet_a_closed_file(tmp_path: Path) -> None:
    # The audit filter syncs in a thread while the loop goes on appending (and closing segments).
    live = tmp_path / "h-w1.jsonl"
    w = audit.ChainWriter(live, 600)
    w.open()
    errors: list[BaseException] = []
    done = threading.Event()

    def syncing() -> None:
        while not done.is_set():
            try:
                w.sync()
            except audit.AuditError as exc:
                errors.append(exc)

    t = threading.Thread(target=syncing)
    t.start()
    try:
        for i in range(300):
            w.append({**RECORD, "i": i})
    finally:
        done.set()
        t.join()
    w.close()
    assert errors == []
    assert len(audit.segments(live)) == 99
    assert audit.verify(live).records == 300


def _head_line(path: Path, w: audit.ChainWriter) -> str:
    return json.dumps({"event": "audit_head", "path": str(path), "records": w.seq, "head": w.head})


def test_logged_heads_show_records_cut_off_the_end_or_rewritten(tmp_path: Path) -> None:
    live = tmp_path / "h-w1.jsonl"
    w = _write(live, 5, segment_bytes=0)
    log = ["not json", '{"event": "request"}', _head_line(Path("/elsewhere") / live.name, w)]
    heads = audit.logged_heads(log)
    assert heads == {"h-w1.jsonl": {4: w.head}}
    assert audit.verify(live, anchors=heads["h-w1.jsonl"]).ok
    lines = live.read_bytes().splitlines(keepends=True)
    live.write_bytes(b"".join(lines[:3]))  # two records cut off: a valid, shorter chain
    assert audit.verify(live).ok
    assert audit.verify(live, anchors=heads["h-w1.jsonl"]).problem == (
        f"end: seq 4 was anchored (head {w.head[:12]}…) but the chain ends before it, at seq 2 "
        "(records cut off its end)"
    )
    # the cut records written anew, chained properly: the anchor still tells them apart
    w2 = _write(live, 2, segment_bytes=0, start=100)
    assert w2.seq == 5 and audit.verify(live).ok
    assert audit.verify(live, anchors=heads["h-w1.jsonl"]).problem == (
        "line 5: seq 4 is not the record anchored for it (rewritten)"
    )
