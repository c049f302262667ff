"""The embedded Ray is the run's own: a cluster someone else started on this machine with `ray start` is never
attached to (Ray's plain `ray.init()` would, through its ray_current_cluster file), not even when Ray Data starts Ray
before the run does; a process that a plain `ray.init()` attached to it is refused; no run starts Ray's dashboard;
and the Ray processes of a driver that was killed are stopped by the next start."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

import psutil
import pytest

from framework.cluster import orphans
from framework.result import Result

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # minutes of Ray clusters and drivers: make test-slow
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Foreign(NamedTuple):
    port: int
    tmpdir: str  # what a driver's $RAY_TMPDIR is for its plain `ray.init()` to find the cluster
    current: str  # the cluster's ray_current_cluster file


@pytest.fixture(scope="module")
def foreign_cluster():
    """A head started with `ray start`, as another user of the machine would, on ports and in a temp dir of its own
    (`--temp-dir`, where it names itself in ray_current_cluster): a driver whose `$RAY_TMPDIR` is that dir's parent
    sees it as every process sees /tmp/ray's, and no other Ray of the machine is disturbed."""
    tmpdir = tempfile.mkdtemp(prefix="mh-foreign-", dir="/tmp")  # short: Ray's sockets live under it
    current = os.path.join(tmpdir, "ray", "ray_current_cluster")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    head = subprocess.Popen([ray_cli, "start", "--head", f"--port={port}", f"--temp-dir={tmpdir}/ray",
                             f"--ray-client-server-port={_free_port()}", f"--dashboard-port={_free_port()}",
                             f"--dashboard-agent-listen-port={_free_port()}", "--num-cpus=1", "--block",
                             "--include-dashboard=false", "--disable-usage-stats"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 120
        while not (os.path.exists(current) and open(current).read().strip().endswith(f":{port}")):
            assert head.poll() is None and time.time() < deadline, "ray start --head did not come up"
            time.sleep(0.2)
        yield _Foreign(port, tmpdir, current)
    finally:
        procs = [head_proc := psutil.Process(head.pid), *head_proc.children(recursive=True)]
        for p in procs:
            p.kill()
        psutil.wait_procs(procs, timeout=10)
        shutil.rmtree(tmpdir, ignore_errors=True)


def _env(tmp_path, foreign: _Foreign) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(XDG_STATE_HOME=str(tmp_path / "state"), MODELHOPPER_STORAGE=str(tmp_path / "runs"),
               PYTHONPATH=ROOT, RAY_TMPDIR=foreign.tmpdir)
    return env


def test_demo_and_a_resume_start_their_own_ray_beside_a_foreign_cluster_and_reap_a_killed_drivers(
        foreign_cluster, tmp_path):
    env = _env(tmp_path, foreign_cluster)
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
    assert open(foreign_cluster.current).read().strip().endswith(f":{foreign_cluster.port}")  # left alone


def test_runs_from_ray_data_parquet_and_arrays_start_their_own_ray_without_its_dashboard_beside_a_foreign_cluster(
        foreign_cluster, tmp_path):
    env = _env(tmp_path, foreign_cluster)
    # Ray Data starts Ray before the runs do: with modelhopper imported first, that start is the engine's
    done = subprocess.run([sys.executable, "-m", "tests.integration.own_ray_job", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["started_here"] and not report["gcs"].endswith(f":{foreign_cluster.port}")
    assert "Connecting to existing Ray cluster" not in done.stderr
    assert done.stderr.count("Started a local Ray instance") == 1  # one start, Ray Data's, for the three runs
    said = [line for line in done.stderr.splitlines() if line.startswith("modelhopper: started this run's own")]
    assert len(said) == 1 and f":{foreign_cluster.port} that `ray start` started on this machine" in said[0]
    assert not report["webui_url"] and report["dashboard_listens"] == []  # (its process runs, serving no page)
    assert report["ray_processes"] and set(report["ray_processes"]) <= set(report["recorded"])  # for `cleanup`
    for kind in ("ray", "parquet", "arrays"):
        with Result.open(str(tmp_path / kind)) as result:
            assert result.verified and set(result.status.status) == {"completed"}, kind
    # a plain ray.init() (here Ray Data's, before modelhopper was imported) attached to the foreign cluster: refused
    attached = ("import ray.data; ds = ray.data.range(8); import framework; "
                "framework.PartitionedDataset.from_ray_dataset(ds, 2)")
    refused = subprocess.run([sys.executable, "-c", attached], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=300)
    assert "Connecting to existing Ray cluster" in refused.stderr, refused.stderr[-3000:]  # (what the test sets up)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1].startswith(
        "RuntimeError: this process is attached to the Ray cluster at "), refused.stderr[-3000:]
    assert f":{foreign_cluster.port} that `ray start` started on this machine" in refused.stderr
