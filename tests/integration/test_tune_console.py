"""What a small run prints, as a Ray Tune user meets it: a run in a process of its own (it starts its own Ray, with
`RAY_AUTH_MODE` unset) under `progress=False` prints no third-party chatter (no Optuna "A new study created" line,
not Ray's token-authentication warning) and, in place of Ray's warning, one short line of ours about the token; with
`RAY_AUTH_MODE` set, Ray says nothing and neither do we (`token_auth_notice`). The W&B tracker prints nothing by
default."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from framework.cluster import ray_start
from framework.cluster.ray_start import token_auth_notice

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUR_LINE = "modelhopper: this run's Ray takes only processes holding the token in "

SCRIPT = """
import sys
from ray import tune
import automl, framework
from framework.examples import classifier_step_fn, mlp_model_fn, synthetic_classification
x, y = synthetic_classification(128, 16, classes=4, seed=0)
ds = framework.PartitionedDataset.from_arrays(x, y, num_partitions=1, seed=0)
space = {"hidden": 8, "lr": tune.loguniform(0.01, 0.1), "batch_size": 64, "in_features": 16, "classes": 4}
result = framework.ModelSelection(mlp_model_fn, step_fn=classifier_step_fn, dataset=ds, num_workers=1, seed=0,
                                  procedure=automl.ASHA(space, max_epochs=1, max_configs=2, seed=0),
                                  storage_path=sys.argv[1], progress=False).run()
print("statuses", sorted(result.status.status))
"""


@pytest.mark.ray
@pytest.mark.slow  # a process of its own that starts its own Ray: make test-slow
def test_a_quiet_run_prints_no_optuna_line_no_ray_token_warning_and_our_one_short_line(tmp_path):
    pytest.importorskip("ray.tune")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}  # a run of its own Ray
    env.update(XDG_STATE_HOME=str(tmp_path / "state"), PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "run")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=400)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert "statuses ['completed', 'completed']" in done.stdout
    assert "A new study created" not in log and "optuna" not in log.lower()
    assert "Token authentication is enabled" not in log  # Ray's warning, left out
    ours = [line for line in log.splitlines() if line.startswith(OUR_LINE)]
    assert len(ours) == 1 and len(ours[0]) < 260, ours
    assert not [line for line in log.splitlines() if "token" in line.lower() and len(line) >= 300]


def test_our_token_line_comes_only_where_ray_would_warn(tmp_path):
    assert token_auth_notice("token") is None and token_auth_notice("disabled") is None
    line = token_auth_notice(None, {"RAY_AUTH_TOKEN_PATH": str(tmp_path / "token")})
    assert line.startswith(OUR_LINE) and len(line) < 260 and "\n" not in line


def test_rays_token_warning_is_left_out_while_ray_starts_and_its_other_lines_pass(caplog):
    ray_logger = logging.getLogger(ray_start._RAY_AUTH_LOGGER)
    with caplog.at_level(logging.INFO, logger=ray_start._RAY_AUTH_LOGGER), ray_start._without_token_warning():
        ray_logger.warning("Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to "
                           "opt out. For more information, see https://docs.ray.io/...")
        ray_logger.warning("Token authentication is disabled for this Ray cluster. Anyone with network access ...")
    ray_logger.warning("Token authentication is enabled for this Ray cluster. (after the start)")
    said = [r.getMessage() for r in caplog.records]
    assert said == ["Token authentication is disabled for this Ray cluster. Anyone with network access ...",
                    "Token authentication is enabled for this Ray cluster. (after the start)"]
    assert not ray_logger.filters  # the filter is removed


def test_the_wandb_tracker_prints_nothing_by_default(tmp_path, capfd):
    pytest.importorskip("wandb")
    from framework.callbacks import RunInfo
    from framework.trackers import WandbCallback

    callback = WandbCallback(mode="offline", dir=str(tmp_path / "wandb"), project="p")
    callback.on_run_start(RunInfo(str(tmp_path), "valid_loss", "min", {"run_id": "quiet"}, False, "run"))
    for cid in (0, 1):
        callback.on_epoch_end(cid, 0, {"valid_loss": 0.5}, {"lr": 0.1})
    callback._finish(0, "completed")
    callback._finish(1, "pruned")
    out, err = capfd.readouterr()
    assert "wandb:" not in out + err, out + err
