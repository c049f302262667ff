"""The run's inbox: signed requests from other processes, each read once and checked (no Ray, no training)."""

from __future__ import annotations

import os
import sqlite3
import time

import pytest

from framework.driver.commands import Command, InboxCommands, QueueCommands, Sources
from framework.store.catalog import UnsafePathError
from framework.store.inbox import INBOX_FILE, read_requests, send_request

RUN_ID = "0123456789abcdef"


def test_a_request_is_read_back_verified_in_order(tmp_path):
    a = send_request(str(tmp_path), RUN_ID, "add_workers", {"count": 2})
    b = send_request(str(tmp_path), RUN_ID, "drain_worker", {"worker": 1}, source="cli")
    got = read_requests(str(tmp_path), RUN_ID)
    assert [(r.nonce, r.name, r.args, r.source, r.problem) for r in got] == [
        (a, "add_workers", {"count": 2}, "connect", None), (b, "drain_worker", {"worker": 1}, "cli", None)]
    assert [r.nonce for r in read_requests(str(tmp_path), RUN_ID, after=got[0].id)] == [b]


def test_no_inbox_is_no_request(tmp_path):
    assert read_requests(str(tmp_path), RUN_ID) == []
    assert not (tmp_path / INBOX_FILE).exists()  # reading makes no inbox


@pytest.mark.parametrize("edit, problem", [
    ("UPDATE requests SET args = '{\"count\": 50}'", "does not verify"),
    ("UPDATE requests SET name = 'kill_worker'", "does not verify"),
    ("UPDATE requests SET mac = NULL", "not signed"),
    ("INSERT INTO requests (time, nonce, name, args, source, mac) VALUES (0, 'n', 'add_workers', '{}', 'x', 'ab')",
     "does not verify"),
])
def test_an_edited_or_planted_request_is_flagged_not_trusted(tmp_path, edit, problem):
    send_request(str(tmp_path), RUN_ID, "add_workers", {"count": 2})
    db = sqlite3.connect(tmp_path / INBOX_FILE)
    db.execute(edit)
    db.commit()
    db.close()
    flagged = [r for r in read_requests(str(tmp_path), RUN_ID) if r.problem is not None]
    assert len(flagged) == 1 and problem in flagged[0].problem


def test_a_request_for_another_run_does_not_verify(tmp_path):
    send_request(str(tmp_path), "another-run-id00", "add_workers", {"count": 1})
    [r] = read_requests(str(tmp_path), RUN_ID)
    assert "does not verify" in r.problem


def test_an_inbox_that_links_out_of_the_run_is_never_opened(tmp_path):
    outside = tmp_path / "elsewhere.db"
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(outside, run / INBOX_FILE)
    with pytest.raises(UnsafePathError):
        send_request(str(run), RUN_ID, "add_workers", {"count": 1})
    with pytest.raises(UnsafePathError):
        read_requests(str(run), RUN_ID)
    assert not outside.exists()


def test_inbox_commands_apply_each_request_once_and_skip_those_a_resume_saw(tmp_path):
    first = send_request(str(tmp_path), RUN_ID, "add_workers", {"count": 1})
    source = InboxCommands(lambda after: read_requests(str(tmp_path), RUN_ID, after), seen={first}, interval_s=0)
    assert source.poll() == []  # applied before the crash: its `command` event names it
    second = send_request(str(tmp_path), RUN_ID, "drain_worker", {"worker": 0})
    [command] = source.poll()
    assert (command.name, command.args, command.request, command.problem) == (
        "drain_worker", {"worker": 0}, second, None)
    assert source.poll() == []
    # a signed request copied into a new row keeps its nonce: applied once
    db = sqlite3.connect(tmp_path / INBOX_FILE)
    db.execute("INSERT INTO requests (time, nonce, name, args, source, mac) SELECT time, nonce, name, args, source, "
               "mac FROM requests WHERE nonce = ?", (second,))
    db.commit()
    db.close()
    assert source.poll() == []


def test_sources_read_the_queue_first_then_the_inbox(tmp_path):
    queue = QueueCommands()
    queue.put("drain_worker", worker=3)
    send_request(str(tmp_path), RUN_ID, "add_workers", {"count": 1})
    both = Sources(queue, InboxCommands(lambda after: read_requests(str(tmp_path), RUN_ID, after), interval_s=0))
    got = both.poll()
    assert [c.name for c in got] == ["drain_worker", "add_workers"] and isinstance(got[0], Command)
    assert got[1].source == "inbox:connect"


def test_framework_connect_stays_the_function_once_its_module_is_imported():
    import framework
    import framework.steering.connect  # noqa: F401 - a submodule named like the function would replace it on import

    assert callable(framework.connect) and framework.connect is framework.steering.connect.connect


def test_inbox_commands_read_the_inbox_at_most_once_per_interval(tmp_path):
    reads = []
    source = InboxCommands(lambda after: reads.append(after) or read_requests(str(tmp_path), RUN_ID, after),
                           interval_s=0.2)
    assert source.poll() == [] and len(reads) == 1
    send_request(str(tmp_path), RUN_ID, "add_workers", {"count": 1})
    assert source.poll() == [] and len(reads) == 1  # within the interval: the inbox is not opened
    time.sleep(0.25)
    assert [c.name for c in source.poll()] == ["add_workers"] and len(reads) == 2
