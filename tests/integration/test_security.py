"""The embedded local Ray keeps Ray's token authentication: another process on this machine without the token
cannot join the cluster or run work on it; the user's own processes (same token) can."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.ray

JOIN = ("import ray, sys; ray.init(address=sys.argv[1]); "
        "print('ran:', ray.get(ray.remote(lambda: 'work').remote()))")


def _join(address: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", JOIN, address], env=env, capture_output=True, text=True, timeout=120)


def test_a_process_without_the_token_cannot_join_or_submit_work(ray_actors, tmp_path):
    address = ray_actors.get_runtime_context().gcs_address  # (spares freed: the token holder's task needs a CPU)
    assert os.environ.get("RAY_AUTH_MODE") != "disabled"  # nothing in the project turns authentication off
    stranger = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    stranger["HOME"] = str(tmp_path)  # another user: no ~/.ray/auth_token of ours
    # Ray's client retries for about 20 s before it gives up; the refusal is in its log from the first attempt
    proc = subprocess.Popen([sys.executable, "-c", JOIN, address], env=stranger, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    assert "ran:" not in out and "InvalidAuthToken" in err, err[-2000:]
    mine = _join(address, dict(os.environ))  # the user's own process, with the token: it may
    assert mine.returncode == 0 and "ran: work" in mine.stdout, mine.stderr[-2000:]
