"""A user's cluster workflow end to end (opt-in: `make test-cluster`; about a minute on 2 cores, so not part of
`make test`): `ray start --head`, a job submitted through Ray's job SDK with the code uploaded as its working
directory, a second node joining while the job runs, and the results found where the README says they go."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RAY = os.path.join(os.path.dirname(sys.executable), "ray")

pytestmark = pytest.mark.cluster


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def head(tmp_path, monkeypatch):
    """A throw-away cluster on the loopback interface with token authentication, as the README sets one up: a
    token of its own (not the user's `~/.ray/auth_token`), handed to every node and to the submitting process."""
    port, dash = _free_port(), _free_port()
    token = tmp_path / "auth_token"
    token.write_text(secrets.token_hex(32))
    for key, value in (("RAY_AUTH_MODE", "token"), ("RAY_AUTH_TOKEN_PATH", str(token))):
        monkeypatch.setenv(key, value)  # this process submits the job: Ray's job SDK sends the token
    env = dict(os.environ)
    started = subprocess.run([RAY, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=true",
                              f"--dashboard-port={dash}", "--node-ip-address=127.0.0.1", "--disable-usage-stats"],
                             env=env, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    try:
        yield f"127.0.0.1:{port}", f"http://127.0.0.1:{dash}", env
    finally:
        subprocess.run([RAY, "stop", "--force"], env=env, capture_output=True, timeout=120)


def test_a_submitted_job_keeps_its_results_when_a_node_joins(head, tmp_path):
    from ray.job_submission import JobStatus, JobSubmissionClient

    address, dashboard, env = head
    with pytest.raises(urllib.error.HTTPError) as refused:  # without the token, the job API answers nothing
        urllib.request.urlopen(f"{dashboard}/api/jobs/", timeout=30)
    assert refused.value.code in (401, 403)
    storage = tmp_path / "results"
    client = JobSubmissionClient(dashboard)
    job = client.submit_job(
        entrypoint=f"{sys.executable} -m framework demo --workers 2 --epochs 4",  # the venv: what `python` is to a user
        runtime_env={"working_dir": ROOT, "excludes": [".venv", ".git", "results", "runs", "mutants", "*.pt"],
                     "env_vars": {"MODELHOPPER_STORAGE": str(storage)}},
    )
    deadline = time.time() + 300
    while client.get_job_status(job) in (JobStatus.PENDING,) and time.time() < deadline:
        time.sleep(0.5)
    # a second node joins while the job runs (in the report that started this, Ray re-unpacked the job's working
    # directory then and deleted results written under it)
    subprocess.run([RAY, "start", f"--address={address}", "--num-cpus=1", "--node-ip-address=127.0.0.1",
                    "--disable-usage-stats"], check=True, env=env, capture_output=True, timeout=120)
    while client.get_job_status(job) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
        assert time.time() < deadline, "the job did not finish in 300 s"
        time.sleep(1)
    logs = client.get_job_logs(job)
    assert client.get_job_status(job) == JobStatus.SUCCEEDED, logs
    runs = sorted(p for p in os.listdir(storage) if p.startswith("gridsearch-"))
    assert len(runs) == 1, os.listdir(storage)
    run = storage / runs[0]
    assert f"Results: {run}" in logs  # printed where a user looks: the job's log
    import framework
    from framework.examples import mlp_model_fn

    result = framework.Result.open(str(run))
    assert len(result.configs) == 6 and result.metrics.epoch.max() == 3
    assert result.meta["code_digest"] and (run / "learning_curves.png").exists()
    moved = shutil.move(str(run), str(tmp_path / "moved"))  # a copied run loads its weights
    assert framework.Result.open(moved).load_model(model_fn=mlp_model_fn) is not None
