"""The warm local service (`modelhopper up` / `down`, `framework.cluster.service`): a run attaches to it and starts on
its pool's workers, a crashed run's workers are reclaimed and replaced, a worker given back forgot its run, a cluster
not in this user's record is never adopted, and `down` ends an attached run's session cleanly, resumable.

One service for the module, in a folder of its own (`MODELHOPPER_SERVICE_DIR`, its own Ray token): the user's
service and every other Ray of the machine are never touched. Drivers run in subprocesses (this process may hold the
test session's Ray). The finalizer runs `down` and stops whatever of the service is left.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

import framework
from framework.cluster import service
from framework.engine.ray_backend import _RayWorker
from framework.store.catalog import SQLiteCatalog
from tests.integration.ft_functions import classifier_eval_fn, classifier_train_fn, mlp_model_fn

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # a Ray head and drivers of their own: make test-slow
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: a driver: `python -c DRIVER RUN_DIR SLEEP EPOCHS` runs a small selection (2 configs, 2 workers; each unit sleeps
#: SLEEP seconds and sets torch's threads to 3, as user code may) and prints a JSON report as its last line
DRIVER = """
import json, sys, time
import torch
import automl, framework
from framework.examples import digits_arrays
from tests.integration.ft_functions import classifier_eval_fn, mlp_model_fn, slow_train_fn

def train_fn(model, optimizer, data, config):
    torch.set_num_threads(3)
    return slow_train_fn(model, optimizer, data, config)

path, sleep, epochs = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
x, y = digits_arrays()
ds = framework.PartitionedDataset.from_arrays(x[:400], y[:400], num_partitions=2, seed=0)
space = {"hidden": [16], "lr": [0.05, 0.1], "batch_size": [64], "sleep": [sleep]}
result = framework.ModelSelection(mlp_model_fn, train_fn, classifier_eval_fn, ds, automl.GridSearch(space, epochs=epochs),
                                  storage_path=path, progress=False, seed=0).run()
joined = result.events[result.events.kind == "worker_joined"]
print(json.dumps({"pids": sorted({json.loads(d)["pid"] for d in joined.detail}),
                  "events": result.events.kind.tolist(), "statuses": result.status.status.tolist()}))
"""


def _cli(env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "framework", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _status(env: dict) -> dict:
    return json.loads(_cli(env, "up", "--status", "--json").stdout)


def _up(env: dict) -> dict:
    """The module's service, up (started again when a test took it down)."""
    return json.loads(_cli(env, "up", "--num-cpus", "2", "--pool", "2", "--json").stdout)


def _driver(env: dict, path: str, sleep: float, epochs: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", DRIVER, path, str(sleep), str(epochs)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[dict, str]:
    """A driver's report, and what it wrote (stdout, then stderr)."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1]), out + err


def _wait_for(what: str, check, timeout: float = 120):
    deadline = time.time() + timeout
    while not (found := check()):
        assert time.time() < deadline, f"waited {timeout:g} s for {what}"
        time.sleep(0.5)
    return found


@pytest.fixture(scope="module")
def service_env():
    """The environment of a driver of the module's service: its own service folder (short: Ray's sockets live in
    its temp dir), Ray token, state and storage folders."""
    folder = tempfile.mkdtemp(prefix="mhs-", dir="/tmp")
    token = os.path.join(folder, "token")
    fd = os.open(token, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, secrets.token_hex(32).encode())
    os.close(fd)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    env.update(MODELHOPPER_SERVICE_DIR=os.path.join(folder, "svc"), RAY_AUTH_TOKEN_PATH=token, PYTHONPATH=ROOT,
               XDG_STATE_HOME=os.path.join(folder, "state"), MODELHOPPER_STORAGE=os.path.join(folder, "runs"))
    try:
        yield env
    finally:
        subprocess.run([sys.executable, "-m", "framework", "down", "--timeout", "0"], cwd=ROOT, env=env,
                       capture_output=True, timeout=300)
        temp_dir = os.path.join(folder, "svc", "ray")
        left = service._head_processes(temp_dir)  # (none, unless `down` failed: stopped here, by pid)
        for proc in left:
            proc.kill()
        psutil.wait_procs(left, timeout=10)
        shutil.rmtree(folder, ignore_errors=True)
        assert not left, f"`down` left the service's processes {[p.pid for p in left]}"


@pytest.fixture(scope="module")
def attached_run(service_env):
    """One run attached to the service: the pool before it, what the run reported, and the pool after it."""
    before = _up(service_env)
    again = _cli(service_env, "up", "--json").stderr
    path = os.path.join(service_env["MODELHOPPER_STORAGE"], "attached")
    report, err = _finish(_driver(service_env, path, 0.0, 1))
    after = _status(service_env)
    holds = json.loads(subprocess.run(
        [sys.executable, "-c", "import json; from framework.cluster import service; print(json.dumps(service.pool_holds()))"],
        cwd=ROOT, env=service_env, capture_output=True, text=True, timeout=300, check=True).stdout.splitlines()[-1])
    return {"before": before, "again": again, "path": path, "report": report, "stderr": err, "after": after,
            "holds": holds}


def test_a_run_attaches_to_the_service_and_starts_on_its_pool(attached_run):
    before, after, report = attached_run["before"], attached_run["after"], attached_run["report"]
    assert "already up" in attached_run["again"]
    assert before["up"] and before["idle"] == 2 and before["leased"] == 0
    assert "modelhopper: attached to the local service at" in attached_run["stderr"]
    assert len(report["pids"]) == 2 and set(report["pids"]) <= set(before["idle_pids"])  # the pool's processes
    assert after["idle"] == 2 and after["leased"] == 0 and set(after["idle_pids"]) == set(report["pids"])  # back
    assert set(report["statuses"]) == {"completed"}


def test_a_worker_given_back_holds_nothing_of_its_run(attached_run):
    holds = [h for h in attached_run["holds"] if h["pid"] in attached_run["report"]["pids"]]
    assert len(holds) == 2  # the run's two workers, back in the pool
    for h in holds:
        assert h["fields"] == sorted(_RayWorker._KEEP)  # no data, states, functions, ledger
        assert h["tensors"] == 0 and h["tensor_bytes"] == 0
        assert not [f for f in h["open_files"] if f.startswith(attached_run["path"])]
        assert h["threads"] == h["threads_at_start"]  # (the run's train_fn set 3)
        assert h["user_modules"] == []  # tests.integration.ft_functions, which the run's functions came from


def test_a_killed_drivers_workers_are_reclaimed_and_replaced(service_env, tmp_path):
    _up(service_env)
    proc = _driver(service_env, str(tmp_path / "killed"), 1.0, 20)
    try:
        leased = _wait_for("the run to lease the pool's workers",
                           lambda: (s := _status(service_env))["leased"] == 2 and s["leased_pids"])
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    status = _wait_for("the keeper to replace the killed run's workers",
                       lambda: (s := _status(service_env))["idle"] == 2 and not s["leased"] and s)
    assert status["reclaimed"] >= 2 and not set(status["idle_pids"]) & set(leased)  # fresh ones, never reused
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in leased)
    report, err = _finish(_driver(service_env, str(tmp_path / "next"), 0.0, 1))  # the next run works, attached
    assert "attached to the local service" in err and set(report["pids"]) <= set(status["idle_pids"])


def test_a_cluster_not_in_this_users_record_is_never_adopted(service_env, tmp_path, monkeypatch):
    running = _up(service_env)  # a `ray start` cluster on this machine, live, of this user
    with open(os.path.join(service_env["MODELHOPPER_SERVICE_DIR"], "service.json")) as f:
        record = json.load(f)
    assert record["address"] == running["address"] and service._head_processes(record["temp_dir"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    cases = {"no record": None,  # (the cluster runs all the same)
             "its pids under another temp dir": {**record, "temp_dir": str(tmp_path / "not-its-temp-dir")},
             "another user's": {**record, "uid": os.getuid() + 1}, "another host's": {**record, "host": "elsewhere"},
             "its address, its processes gone": {**record, "temp_dir": str(tmp_path / "gone"),
                                                 "processes": [[gone.pid, time.time(), "raylet"]]}}
    for case, forged in cases.items():
        folder = tmp_path / case.replace(" ", "-")
        folder.mkdir()
        if forged is not None:
            (folder / "service.json").write_text(json.dumps(forged))
            os.chmod(folder / "service.json", 0o600)
        monkeypatch.setenv("MODELHOPPER_SERVICE_DIR", str(folder))
        assert service.live_record()[0] is None, case
        assert service.attach() is None, case  # (before any ray.init: nothing of Ray was touched)
    assert _status(service_env)["up"]  # the stale-record clean-ups stopped nothing of the real cluster
    assert service._head_processes(record["temp_dir"])


def test_a_stale_record_is_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELHOPPER_SERVICE_DIR", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    service._write_record({"address": "127.0.0.1:1", "temp_dir": service._temp_dir(), "uid": os.getuid(),
                           "host": socket.gethostname(),
                           "processes": [[gone.pid, time.time(), "gcs_server"], [gone.pid, time.time(), "raylet"]]})
    record, note = service.live_record()
    assert record is None and "removed the record of a service that is gone" in note
    assert not (tmp_path / "service.json").exists()


def test_down_ends_an_attached_runs_session_cleanly_and_it_resumes(service_env, ray_cluster, tmp_path):
    _up(service_env)
    path = str(tmp_path / "stopped")
    proc = _driver(service_env, path, 1.0, 6)  # 24 units of >= 1 s on 2 workers: still running when `down` comes
    try:
        _wait_for("the run to lease the pool's workers", lambda: _status(service_env)["leased"] == 2)
        down = _cli(service_env, "down", "--timeout", "240").stdout
        report, err = _finish(proc)
    finally:
        proc.kill()
    assert "asked 1 attached run(s) to stop" in down and "is down" in down
    assert "service_stopping" in report["events"] and "active" in report["statuses"]  # ended, not finished
    assert "the local service is going down" in err
    assert not os.path.exists(os.path.join(service_env["MODELHOPPER_SERVICE_DIR"], "service.json"))
    assert not service._head_processes(os.path.join(service_env["MODELHOPPER_SERVICE_DIR"], "ray"))
    catalog = SQLiteCatalog(os.path.join(path, "run.db"), readonly=True)
    try:
        assert set(catalog.units(status=None).status) == {"done"}  # what was in flight finished and counts
    finally:
        catalog.close()
    resumed = framework.ModelSelection.resume(path, mlp_model_fn, classifier_train_fn, classifier_eval_fn,
                                              progress=False).run()  # (on this process's Ray: the service is down)
    assert set(resumed.status.status) == {"completed"} and (resumed.status.epochs == 6).all()
