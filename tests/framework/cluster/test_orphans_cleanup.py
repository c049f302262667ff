"""`framework.cluster.orphans.reap` as a clean-up without a run: a dry run names what it would stop and touches
nothing; a record made on another host (a shared home directory) is left to that host."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import psutil
import pytest

from framework.cluster import orphans


@pytest.fixture
def sleeper():
    """A process of this user a killed driver could have left: (its Popen, its psutil.Process)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc, psutil.Process(proc.pid)
    finally:
        proc.kill()


def _record(name: str, body: dict) -> str:
    path = os.path.join(orphans.records_dir(), name)
    with open(path, "w") as f:
        json.dump(body, f)
    return path


def test_reap_dry_run_names_what_it_would_stop_then_reap_stops_it(tmp_path, monkeypatch, sleeper):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    os.makedirs(orphans.records_dir())
    proc, child = sleeper
    gone = {"driver": [1, 0.0], "processes": [[child.pid, child.create_time()]], "host": socket.gethostname()}
    path = _record("driver-5.json", gone)
    unreadable = _record("driver-6.json", "not a record")
    assert orphans.reap(dry_run=True) == [child.pid]
    assert proc.poll() is None and os.path.exists(path) and os.path.exists(unreadable)  # nothing touched
    assert orphans.reap() == [child.pid]
    proc.wait(timeout=10)
    assert os.listdir(orphans.records_dir()) == []
    assert orphans.reap() == [] and orphans.reap(dry_run=True) == []


def test_reap_leaves_another_hosts_record_alone(tmp_path, monkeypatch, sleeper):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    os.makedirs(orphans.records_dir())
    proc, child = sleeper
    elsewhere = {"driver": [1, 0.0], "processes": [[child.pid, child.create_time()]],
                 "host": socket.gethostname() + "-elsewhere"}
    path = _record("driver-7.json", elsewhere)
    assert orphans.reap() == []
    assert proc.poll() is None and os.path.exists(path)  # its pids mean nothing here; its host reaps it


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


def test_the_cleanup_command_names_then_stops_what_a_killed_driver_left(tmp_path, sleeper):
    """`modelhopper cleanup --dry-run` lists the left-over process and stops nothing; `cleanup` stops it."""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path)}
    os.makedirs(os.path.join(tmp_path, "modelhopper", "ray"))
    proc, child = sleeper
    with open(os.path.join(tmp_path, "modelhopper", "ray", "driver-5.json"), "w") as f:
        json.dump({"driver": [1, 0.0], "processes": [[child.pid, child.create_time()]],
                   "host": socket.gethostname()}, f)
    cli = [sys.executable, "-m", "framework", "cleanup"]
    dry = subprocess.run([*cli, "--dry-run"], env=env, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0 and f"{child.pid} " in dry.stdout and "none stopped" in dry.stdout, dry
    assert proc.poll() is None
    done = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "stopped 1 Ray processes" in done.stdout, done
    proc.wait(timeout=10)
    again = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=60)
    assert "No Ray processes left" in again.stdout
