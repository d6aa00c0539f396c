"""The deletion queue's objects (:mod:`fairpipe.storage.queue`): a request is read only as it was
written (malformed objects refused with their reason), its folders are checked, a failed write
leaves nothing, notes are read within bounds. No Prefect: the queue is files."""

from __future__ import annotations

import functools
import json
import os
import re

import numpy as np
import pytest

from fairpipe.errors import FairpipeInputError

RID = "20261127T000000000000Z-aaaaaaaa"
GOOD = {"request": RID, "ids": [1, 2], "reason": "", "requested_at": "2026-11-27T00:00:00+00:00"}


def body(**changes) -> bytes:
    return json.dumps({**GOOD, **changes}).encode()


@pytest.mark.parametrize(
    "data, says",
    [
        (b'{"request": "2026', "not valid JSON"),
        (b"\xff\xfe{}", "not UTF-8 text: line 1 holds the byte 0xff"),
        # Nested past the parser's recursion limit, as arrays and as objects: refused before
        # it is parsed, as any object nested deeper than 64.
        (b"[" * 200_000 + b"]" * 200_000, "nests arrays and objects 200,000 deep, over 64"),
        (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "nests arrays and objects 100,000 deep"),
        (
            body(reason=functools.reduce(lambda inner, _: [inner], range(65), [])),
            "nests arrays and objects 67 deep, over 64",
        ),  # a reason of 66 lists, in the request
        (b"[1, 2]", "JSON list, not an object"),
        (body(request="20261127T000000000000Z-other"), "'request' field is not its own name"),
        (body(request="../../../victim"), "'request' field is not its own name"),
        (body(ids=[]), "'ids' field is not a list"),
        (body(ids="1,2"), "'ids' field is not a list"),
        (body(ids=[1, "2"]), "not an integer in"),
        (body(ids=[1.0]), "not an integer in"),
        (body(ids=[True]), "not an integer in"),
        (body(ids=[[1]]), "not an integer in"),
        (body(ids=[-1]), "not an integer in"),
        (body(ids=[2**63]), "not an integer in"),
        (body(ids=[2**64 + 5]), "not an integer in"),
        (body(reason=7), "'reason' is not text"),
        (body(reason="x" * 10_001), "'reason' is not text of at most 10,000"),
        (body(requested_at=None), "'requested_at' is not an ISO 8601"),
        (body(requested_at="yesterday"), "'requested_at' is not an ISO 8601"),
    ],
)
def test_a_malformed_request_object_is_refused_with_its_reason(data, says):
    from fairpipe.storage.queue import MalformedRequest, parse_request

    with pytest.raises(MalformedRequest, match=says):
        parse_request(RID, data)
    assert parse_request(RID, body()).ids.tolist() == [1, 2]  # the well-formed one parses


def test_brackets_and_quotes_inside_a_reason_are_text_not_nesting():
    from fairpipe.storage.queue import parse_request

    reason = '[[[[{{{{"\\"]]]]' * 1000  # brackets, quotes and backslashes in a string
    assert parse_request(RID, body(reason=reason[:10_000])).reason == reason[:10_000]


def test_a_queue_or_quarantine_that_is_not_a_folder_is_named(tmp_path):
    from fairpipe.storage import queue

    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "queue").write_text("not a folder")
    url = str(tmp_path / "s")
    says = (
        f"{tmp_path / 's' / 'queue'} is not a folder: fairpipe keeps the store's deletion requests"
    )
    for call in (lambda: queue.file_request(url, np.array([1])), lambda: queue.pending(url),
                 lambda: queue.unrecognised(url), lambda: queue.quarantined(url),
                 lambda: queue.check_queue(url)):  # fmt: skip
        with pytest.raises(FairpipeInputError, match=re.escape(says)):
            call()
    (tmp_path / "s" / "queue").unlink()
    (tmp_path / "s" / "quarantine").symlink_to(tmp_path / "nowhere")  # a dangling link
    with pytest.raises(FairpipeInputError, match="quarantine is a symbolic link"):
        queue.pending(url)


def test_a_request_that_cannot_be_written_leaves_no_temporary_file(tmp_path, monkeypatch):
    """A full disk fails the write or the flush: the temporary file, which holds ids, goes with
    the error."""
    import errno

    from fairpipe.storage import queue

    (tmp_path / "s").mkdir()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(queue.os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        queue.file_request(str(tmp_path / "s"), np.array([1, 2]))
    assert os.listdir(tmp_path / "s") == []  # the queue's folder too, made for it
    (tmp_path / "s" / "queue").mkdir()
    with pytest.raises(OSError, match="No space left"):
        queue.file_request(str(tmp_path / "s"), np.array([1, 2]))
    assert os.listdir(tmp_path / "s" / "queue") == []  # a queue's folder that was there stays


def test_notes_that_are_not_the_drains_are_left_out(tmp_path):
    """The quarantine's notes are read within bounds: a note nested too deep, larger than a note,
    not a regular file, or not an object with the fields of a note is no note."""
    from fairpipe.storage import queue

    (tmp_path / "s" / "quarantine").mkdir(parents=True)
    url, aside = str(tmp_path / "s"), tmp_path / "s" / "quarantine"
    note = {"object": "x.json", "moved_to": "t", "why": "its name is not", "at": "2026"}
    (aside / "a.why.json").write_text(json.dumps(note))
    (aside / "b.why.json").write_bytes(b"[" * 200_000 + b"]" * 200_000)
    (aside / "c.why.json").write_text(json.dumps({**note, "why": "x" * queue.MAX_NOTE_BYTES}))
    (aside / "d.why.json").write_text(json.dumps([note]))
    (aside / "e.why.json").write_text(json.dumps({**note, "why": 7}))
    (aside / "f.why.json").mkdir()
    os.mkfifo(aside / "g.why.json")  # a pipe: never waited on
    assert queue.quarantined(url) == [note]


def test_a_request_of_too_many_ids_is_refused_when_filed_and_when_read(tmp_path, monkeypatch):
    from fairpipe.storage import queue

    with pytest.raises(ValueError, match="at most 1,000,000 ids; got 1,000,001.*backfill"):
        queue.new_request(np.arange(queue.MAX_REQUEST_IDS + 1))
    with pytest.raises(queue.MalformedRequest, match="1,000,001 ids, over 1,000,000"):
        queue.parse_request(RID, body(ids=list(range(queue.MAX_REQUEST_IDS + 1))))
