"""`framework.cluster.orphans`: the Ray processes of a killed driver are stopped, and nothing else ever is."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil

from framework.cluster import orphans


def test_reap_leaves_a_live_driver_and_foreign_pids_alone_and_drops_unreadable_records(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    os.makedirs(orphans.records_dir())
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        me = psutil.Process()
        child = psutil.Process(sleeper.pid)
        live = {"driver": [me.pid, me.create_time()], "processes": [[child.pid, child.create_time()]]}
        reused = {"driver": [1, 0.0], "processes": [[child.pid, child.create_time() - 100.0]]}  # pid since reused
        for name, body in (("driver-1.json", live), ("driver-2.json", reused), ("driver-3.json", "not a record")):
            with open(os.path.join(orphans.records_dir(), name), "w") as f:
                json.dump(body, f)
        with open(os.path.join(orphans.records_dir(), "driver-4.json"), "w") as f:
            f.write("{garbage")
        assert orphans.reap() == []
        assert sleeper.poll() is None  # neither the live driver's process nor a reused pid was touched
        assert sorted(os.listdir(orphans.records_dir())) == ["driver-1.json"]
        gone = {"driver": [1, 0.0], "processes": [[child.pid, child.create_time()]]}  # its driver is gone
        with open(os.path.join(orphans.records_dir(), "driver-5.json"), "w") as f:
            json.dump(gone, f)
        assert orphans.reap() == [child.pid]
        sleeper.wait(timeout=10)  # it was stopped (psutil reaped its status: no TimeoutExpired is the proof)
        assert not child.is_running()
    finally:
        sleeper.kill()
