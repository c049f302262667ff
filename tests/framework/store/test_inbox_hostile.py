"""The inbox is untrusted input: whatever someone without the key writes into `inbox.db` (other bytes, a link, a
FIFO, another table, planted ids, huge values, a flood of rows) is read as no request or as rejected requests,
reported a bounded number of times, and never crashes, stalls or steers the driver (real SQLite files, the driver
loop on `LocalBackend`; no Ray)."""

from __future__ import annotations

import os
import sqlite3

import pytest

from framework.callbacks import Callback
from framework.driver import Driver, MemoryRunLog
from framework.driver.commands import Command, InboxCommands, InboxNotice, apply
from framework.engine.local import LocalBackend
from framework.options import RunOptions
from framework.store.catalog import CatalogError, UnsafePathError
from framework.store.inbox import (
    INBOX_FILE,
    MAX_ARGS,
    MAX_ID,
    MAX_INBOX_BYTES,
    MAX_NAME,
    READ_LIMIT,
    InboxError,
    read_requests,
    send_request,
)
from tests.framework.driver.test_driver import FNS, P, _entries, _events, _grid

RUN_ID = "0123456789abcdef"
INSERT = "INSERT INTO requests (id, time, nonce, name, args, source, mac) VALUES (?, 0, ?, ?, ?, 'x', ?)"


def _sql(run, *statements: tuple) -> None:
    db = sqlite3.connect(os.path.join(run, INBOX_FILE))
    for statement in statements:
        db.execute(*statement) if isinstance(statement, tuple) else db.execute(statement)
    db.commit()
    db.close()


def _reader(run) -> InboxCommands:
    return InboxCommands(lambda after: read_requests(str(run), RUN_ID, after), interval_s=0)


def _move_aside(run) -> None:
    """What the error tells a person to do: the inbox and its companions, kept, out of the way."""
    os.mkdir(run / "inbox.broken")
    for name in os.listdir(run):
        if name.startswith(INBOX_FILE):
            os.rename(run / name, run / "inbox.broken" / name)


def _garbage(run, outside) -> None:
    (run / INBOX_FILE).write_bytes(os.urandom(4096))


def _link_out(run, outside) -> None:
    os.symlink(outside, run / INBOX_FILE)


def _link_to_catalog(run, outside) -> None:  # inside the run, but to another file: SQLite would write run.db
    (run / "run.db").write_bytes(b"the catalog")
    os.symlink(run / "run.db", run / INBOX_FILE)


def _wal_links_out(run, outside) -> None:  # SQLite opens (and truncates) -shm and -wal beside the inbox
    send_request(str(run), RUN_ID, "pause", {})
    os.symlink(outside, run / f"{INBOX_FILE}-shm")


def _fifo(run, outside) -> None:  # opening it would block the driver for ever
    os.mkfifo(run / INBOX_FILE)


def _text_ids(run, outside) -> None:
    _sql(run, "CREATE TABLE requests (id TEXT, time REAL, nonce TEXT, name TEXT, args TEXT, source TEXT, mac TEXT)",
         ("INSERT INTO requests VALUES ('x', 0, 'n', 'pause', '{}', 'x', 'ab')",))


def _trigger(run, outside) -> None:  # the senders' table, with a trigger that would fire in a sender's insert
    send_request(str(run), RUN_ID, "pause", {})
    _sql(run, "CREATE TRIGGER t AFTER INSERT ON requests BEGIN DELETE FROM requests; END")


def _oversized(run, outside) -> None:  # sparse: no disk, but larger than any inbox may be
    with open(run / INBOX_FILE, "wb") as f:
        f.truncate(MAX_INBOX_BYTES + 1)


BROKEN = {"garbage": (_garbage, "unreadable"), "link out": (_link_out, "link"),
          "link to run.db": (_link_to_catalog, "link"), "-shm links out": (_wal_links_out, "link"),
          "fifo": (_fifo, "link"), "text ids": (_text_ids, "schema"), "trigger": (_trigger, "schema"),
          "over the size limit": (_oversized, "size")}


@pytest.mark.parametrize("name", list(BROKEN))
def test_a_broken_inbox_is_refused_by_reader_and_sender_and_nothing_outside_is_touched(tmp_path, name):
    make, kind = BROKEN[name]
    run, outside = tmp_path / "run", tmp_path / "outside.db"
    run.mkdir()
    outside.write_bytes(b"not yours")
    make(run, outside)
    before = {n: (run / n).read_bytes() for n in os.listdir(run) if (run / n).is_file() and n != INBOX_FILE + "-shm"}
    with pytest.raises(InboxError) as read:
        read_requests(str(run), RUN_ID)
    with pytest.raises(InboxError) as sent:
        send_request(str(run), RUN_ID, "pause", {})
    assert read.value.kind == kind and isinstance(read.value, CatalogError)  # the CLI's one-line errors
    assert "move inbox.db" in str(sent.value) and "aside" in str(sent.value)  # the way out, in one message
    assert outside.read_bytes() == b"not yours" and not os.path.exists(f"{outside}-wal")
    assert {n: (run / n).read_bytes() for n in before} == before  # nothing repaired, renamed or deleted


def test_an_inbox_that_links_out_stays_an_unsafe_path(tmp_path):
    os.symlink(tmp_path / "elsewhere.db", tmp_path / INBOX_FILE)
    with pytest.raises(UnsafePathError, match="symbolic link: refused, never opened"):
        read_requests(str(tmp_path), RUN_ID)


@pytest.mark.parametrize("values, problem", [
    ((1, None, None, None, None), "its `nonce` is missing"),
    ((1, "n", "x" * (MAX_NAME + 1), "{}", "ab"), f"its `name` is longer than {MAX_NAME} characters"),
    ((1, "n", "pause", "[" * (MAX_ARGS + 1), "ab"), f"its `args` is longer than {MAX_ARGS} characters"),
    ((1, "n", "pause", b"\x00" * 10**6, "ab"), "its `args` is a blob, not text"),
    ((1, "n", b"pause", "{}", "ab"), "its `name` is a blob, not text"),
    ((1, "n" * 10**6, "pause", "{}", "ab"), "its `nonce` is longer than 64 characters"),
    ((1, "n", "pause", "{}", "ab" * 10**5), "it is not signed"),  # no MAC is that long: not computed over it
])
def test_a_malformed_row_is_rejected_and_its_value_never_reaches_python(tmp_path, values, problem):
    send_request(str(tmp_path), RUN_ID, "pause", {})
    _sql(tmp_path, "DELETE FROM requests", (INSERT, values))
    [r] = read_requests(str(tmp_path), RUN_ID)
    assert r.problem.endswith(problem) and r.args == {}
    assert all(v is None or (isinstance(v, str) and len(v) <= MAX_NAME) for v in (r.nonce, r.name, r.source))


def test_the_sender_refuses_a_name_or_arguments_over_the_limits(tmp_path):
    with pytest.raises(ValueError, match=f"`name` is {MAX_NAME + 1} characters, but must be text of at most"):
        send_request(str(tmp_path), RUN_ID, "x" * (MAX_NAME + 1), {})
    with pytest.raises(ValueError, match=r"`args` is \d+ characters, but must be .* \(as JSON\)"):
        send_request(str(tmp_path), RUN_ID, "add_config", {"config": {"note": "x" * MAX_ARGS}})
    assert read_requests(str(tmp_path), RUN_ID) == []


def test_a_planted_last_id_fails_senders_clearly_until_moved_aside_then_the_run_reads_the_new_inbox(tmp_path):
    first = send_request(str(tmp_path), RUN_ID, "pause", {})
    _sql(tmp_path, (INSERT, (MAX_ID, "n", "pause", "{}", "ab")))
    reader = _reader(tmp_path)
    assert [(c.request, c.problem) for c in reader.poll()] == [
        (first, None), ("n", "its signature does not verify under this machine's key (edited, or not sent to this "
                              "run)")]
    with pytest.raises(InboxError, match="has no request id left") as full:
        send_request(str(tmp_path), RUN_ID, "unpause", {})
    assert full.value.kind == "ids"
    _move_aside(tmp_path)
    again = send_request(str(tmp_path), RUN_ID, "unpause", {})  # a new inbox, ids from 1 again
    _sql(tmp_path, ("INSERT INTO requests (time, nonce, name, args, source, mac) SELECT time, nonce, name, args, "
                    "source, mac FROM requests", ))  # and a copy of it
    assert [(c.name, c.request, c.problem) for c in reader.poll()] == [("unpause", again, None)]  # the copy: once
    assert reader.poll() == []


def test_a_read_takes_at_most_read_limit_rows(tmp_path):
    send_request(str(tmp_path), RUN_ID, "pause", {})
    _sql(tmp_path, ("WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < ?) INSERT INTO "
                    "requests (time, nonce, name) SELECT 0, 'n' || i, 'pause' FROM s", (READ_LIMIT + 5,)))
    got = read_requests(str(tmp_path), RUN_ID)
    assert len(got) == READ_LIMIT and [r.id for r in got] == list(range(1, READ_LIMIT + 1))
    assert len(read_requests(str(tmp_path), RUN_ID, after=got[-1].id)) == 6


def test_a_broken_inbox_is_reported_once_per_kind_and_again_only_in_the_count(tmp_path):
    now, reads = [0.0], []
    reader = InboxCommands(lambda after: reads.append(now[0]) or read_requests(str(tmp_path), RUN_ID, after),
                           interval_s=0.05, report_s=60, clock=lambda: now[0])

    def poll_for(seconds: float) -> list:  # the driver's polls over `seconds`, every 1/64 s (exact in binary)
        out = []
        for _ in range(round(seconds * 64)):
            now[0] += 1 / 64
            out += reader.poll()
        return out

    _garbage(tmp_path, None)
    [notice] = poll_for(0.5)
    assert isinstance(notice, InboxNotice) and (notice.args["what"], notice.args["problem"]) == ("unreadable",
                                                                                               "unreadable")
    assert poll_for(3.0) == [] and len(reads) == 4  # not per poll, and read again once a second while broken
    os.remove(tmp_path / INBOX_FILE)
    os.symlink(tmp_path / "elsewhere", tmp_path / INBOX_FILE)
    [link] = poll_for(1.0)
    assert link.args["problem"] == "link" and "symbolic link" in link.line
    os.remove(tmp_path / INBOX_FILE)
    assert poll_for(1.0) == []  # no inbox: nothing to say, and read every 50 ms again
    _garbage(tmp_path, None)
    assert poll_for(1.0) == []  # broken the same way again: counted, not logged again
    now[0] = 70.0
    [count] = reader.poll()
    assert count.args["what"] == "rejected" and count.args["reasons"] == {"the inbox could not be read (unreadable)": 1}


def _flood(run, rows: int = 5000) -> None:
    _sql(run, ("WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < ?) INSERT INTO requests "
               "(time, nonce, name, args, source, mac) SELECT 0, 'n' || i, 'add_workers', '{\"count\": 9}', 'x', 'ab' "
               "FROM s", (rows,)))


UNTRUSTED = "its signature does not verify under this machine's key (edited, or not sent to this run)"


def test_a_flood_of_unsigned_requests_is_three_rejections_then_one_count_per_window(tmp_path):
    send_request(str(tmp_path), RUN_ID, "pause", {})
    _flood(tmp_path)
    now = [0.0]
    reader = InboxCommands(lambda after: read_requests(str(tmp_path), RUN_ID, after), interval_s=0, report_s=60,
                           clock=lambda: now[0])
    polled = [c for _ in range(6) for c in reader.poll()]  # 5,001 rows, 1,000 a read
    assert [(c.name, c.problem) for c in polled] == [("pause", None)] + [("add_workers", UNTRUSTED)] * 3
    now[0] = 59.0
    assert reader.poll() == []
    now[0] = 61.0
    [count] = reader.poll()  # the window has ended: what it held, in one notice
    assert isinstance(count, InboxNotice) and count.args["count"] == 4997 and count.args["reasons"] == {
        UNTRUSTED: 4997}
    assert "4997 more untrusted request(s) rejected" in count.line
    assert reader.poll() == []


def test_a_driver_flooded_with_unsigned_requests_logs_a_bounded_few_and_answers_the_signed_one(tmp_path):
    send_request(str(tmp_path), RUN_ID, "pause", {})  # rejected: a run on a simulated clock cannot pause
    _flood(tmp_path)
    signed = send_request(str(tmp_path), RUN_ID, "unpause", {})  # behind the flood
    log, notices = MemoryRunLog(), []
    reader = InboxCommands(lambda after: read_requests(str(tmp_path), RUN_ID, after), interval_s=0, report_s=0)
    driver = Driver(LocalBackend(FNS, _entries(), num_threads=1), _grid(epochs=1), log, {w: [w] for w in range(P)},
                    list(range(P)), RunOptions(queue_depth=1), observers=[_Notices(notices)], commands=reader)
    driver.run()
    commands = _events(log, "command")
    assert [(c["name"], c["applied"]) for c in commands if c["request"] == signed] == [("unpause", False)]
    one_by_one = [c for c in commands if c["outcome"].startswith("the request cannot be trusted")]
    counts = _events(log, "inbox")  # with `report_s=0` a window is one read of at most READ_LIMIT rows
    reads = -(-5002 // READ_LIMIT)
    assert counts and len(one_by_one) <= 3 * reads and len(counts) <= reads
    assert len(one_by_one) + sum(c["count"] for c in counts) == 5000  # each accounted for, once
    assert all(c["reasons"] == {UNTRUSTED: c["count"]} for c in counts)
    assert len(notices) == len(one_by_one) + 2 + len(counts)  # one line each, and one per signed rejection
    assert len(driver.run_state.workers.holds) == P  # nothing the flood asked for happened


class _Notices(Callback):
    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def on_notice(self, line: str) -> None:
        self.lines.append(line)


def test_a_driver_whose_inbox_is_garbage_runs_to_its_end_and_says_so_once(tmp_path):
    _garbage(tmp_path, None)
    log, notices = MemoryRunLog(), []
    driver = Driver(LocalBackend(FNS, _entries(), num_threads=1), _grid(epochs=2), log, {w: [w] for w in range(P)},
                    list(range(P)), RunOptions(queue_depth=1), observers=[_Notices(notices)],
                    commands=_reader(tmp_path))
    assert driver.run()
    [event] = _events(log, "inbox")
    assert event["problem"] == "unreadable" and "file is not a database" in event["error"]
    [line] = notices
    assert line.startswith("inbox: the run's inbox") and line.endswith("Read as empty: the run goes on")
    assert all(c.status == "stopped" for c in driver.run_state.configs) and len(log.schedule()) == 2 * 2 * 3 * P


def test_a_request_name_and_arguments_reach_the_console_escaped_and_truncated(tmp_path):
    evil = "\x1b[2J\x1b]0;owned\x07\r\u202e"
    send_request(str(tmp_path), RUN_ID, evil, {"worker": evil * 100})  # signed: an unknown command
    _sql(tmp_path, (INSERT, (None, "n", evil, "{}", "ab")))  # unsigned
    log, notices = MemoryRunLog(), []
    driver = Driver(LocalBackend(FNS, _entries(), num_threads=1), _grid(epochs=1), log, {0: list(range(P))},
                    list(range(P)), RunOptions(), observers=[_Notices(notices)])
    polled = _reader(tmp_path).poll()
    assert [c.name for c in polled] == [evil, evil] and all(isinstance(c, Command) for c in polled)
    for command in polled:
        assert not apply(driver.run_state, command)
    assert len(notices) == 2 and all(line.isprintable() and len(line) < 1000 for line in notices), notices
    assert "\\x1b[2J" in notices[0] and "\\u202e" in notices[1]
    assert [c["name"] for c in _events(log, "command")] == [evil, evil]  # the record keeps what was sent
