"""`framework.engine.orphans.reap` as a clean-up without a run: a dry run names what it would stop and touches
nothing; a record made on another host (a shared home directory) is left to that host."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import psutil

from framework.engine import orphans


def _record(name: str, body: dict) -> str:
    path = os.path.join(orphans.records_dir(), name)
    with open(path, "w") as f:
        json.dump(body, f)
    return path


def test_reap_dry_run_names_what_it_would_stop_then_reap_stops_it(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    os.makedirs(orphans.records_dir())
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        child = psutil.Process(sleeper.pid)
        gone = {"driver": [1, 0.0], "processes": [[child.pid, child.create_time()]], "host": socket.gethostname()}
        path = _record("driver-5.json", gone)
        unreadable = _record("driver-6.json", "not a record")
        assert orphans.reap(dry_run=True) == [child.pid]
        assert sleeper.poll() is None and os.path.exists(path) and os.path.exists(unreadable)  # nothing touched
        assert orphans.reap() == [child.pid]
        sleeper.wait(timeout=10)
        assert os.listdir(orphans.records_dir()) == []
        assert orphans.reap() == [] and orphans.reap(dry_run=True) == []
    finally:
        sleeper.kill()


def test_reap_leaves_another_hosts_record_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    os.makedirs(orphans.records_dir())
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        child = psutil.Process(sleeper.pid)
        elsewhere = {"driver": [1, 0.0], "processes": [[child.pid, child.create_time()]],
                     "host": socket.gethostname() + "-elsewhere"}
        path = _record("driver-7.json", elsewhere)
        assert orphans.reap() == []
        assert sleeper.poll() is None and os.path.exists(path)  # its pids mean nothing here; its host reaps it
    finally:
        sleeper.kill()


def test_a_record_names_its_host(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    path = orphans.record(since=0.0)
    try:
        with open(path) as f:
            body = json.load(f)
        assert body["host"] == socket.gethostname() and body["driver"][0] == os.getpid()
    finally:
        orphans.forget()
    assert not os.path.exists(path)
