"""The embedded Ray is the run's own: a cluster someone else started on this machine with `ray start` is never
attached to (Ray's plain `ray.init()` would, through /tmp/ray/ray_current_cluster), and the Ray processes of a driver
that was killed are stopped by the next start."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import psutil
import pytest

from framework.engine import orphans
from framework.result import Result

pytestmark = pytest.mark.ray
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CURRENT = "/tmp/ray/ray_current_cluster"  # where `ray start` names the cluster `ray.init()` attaches to


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def foreign_cluster(tmp_path):
    """A head started with `ray start`, as another user of the machine would: named in ray_current_cluster."""
    before = open(CURRENT).read() if os.path.exists(CURRENT) else None
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    head = subprocess.Popen([ray_cli, "start", "--head", f"--port={port}", "--num-cpus=1", "--block",
                             "--include-dashboard=false", "--disable-usage-stats"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 60
        while not (os.path.exists(CURRENT) and open(CURRENT).read().strip().endswith(f":{port}")):
            assert head.poll() is None and time.time() < deadline, "ray start --head did not come up"
            time.sleep(0.2)
        yield port
    finally:
        procs = [head_proc := psutil.Process(head.pid), *head_proc.children(recursive=True)]
        for p in procs:
            p.kill()
        psutil.wait_procs(procs, timeout=10)
        if before is None:
            os.remove(CURRENT)
        else:
            with open(CURRENT, "w") as f:
                f.write(before)


def _env(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(XDG_STATE_HOME=str(tmp_path / "state"), MODELHOPPER_STORAGE=str(tmp_path / "runs"),
               PYTHONPATH=ROOT)
    return env


def test_demo_and_a_resume_start_their_own_ray_beside_a_foreign_cluster_and_reap_a_killed_drivers(
        foreign_cluster, tmp_path):
    env = _env(tmp_path)
    storage = str(tmp_path / "crashing")
    # a driver that SIGKILLs itself after round 0 commits: today's code attached to the foreign cluster and failed
    crashed = subprocess.run([sys.executable, "-m", "tests.integration.resume_job", storage, "commit"], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=300)
    assert crashed.returncode == -9, crashed.stderr[-3000:]
    records = os.listdir(os.path.join(env["XDG_STATE_HOME"], "modelhopper", "ray"))
    assert len(records) == 1, records  # the killed driver could not remove its record
    with open(os.path.join(env["XDG_STATE_HOME"], "modelhopper", "ray", records[0])) as f:
        listed = json.load(f)["processes"]
    assert listed, "the record names the processes the driver's Ray started"
    left = [p for pid, start in listed if (p := orphans._alive([pid, start])) is not None]
    assert left, "Ray's agents outlive a SIGKILLed driver"
    resumed = subprocess.run([sys.executable, "-m", "framework", "resume", storage], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in left)  # reaped by the resume
    assert os.listdir(os.path.join(env["XDG_STATE_HOME"], "modelhopper", "ray")) == []  # it exited normally
    with Result.open(storage) as result:
        assert result.verified and set(result.status.status) == {"completed"}
    demo = subprocess.run([sys.executable, "-m", "framework", "demo", "--epochs", "1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert demo.returncode == 0 and "Best config" in demo.stdout, demo.stderr[-3000:]
    assert open(CURRENT).read().strip().endswith(f":{foreign_cluster}")  # the foreign cluster was left alone
