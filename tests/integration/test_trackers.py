"""Callbacks and trackers on a real run: TensorBoard and MLflow files read back with their own readers, a callback
that raises does not end the run, and a run mirrored to a URI."""

from __future__ import annotations

import os
import tempfile

import pytest

import automl
import framework
from framework.examples import classifier_eval_fn, classifier_train_fn, mlp_model_fn
from framework.store.storage import READ_PREFIX

pytestmark = pytest.mark.ray

SPACE = {"hidden": [16, 32], "lr": [0.05], "batch_size": [32]}


class Recorder(framework.Callback):
    def __init__(self):
        self.calls = []

    def on_run_start(self, run):
        self.calls.append(("start", run.metric, run.resumed))

    def on_unit_end(self, config_id, epoch, partition, kind, worker, seconds, metrics):
        self.calls.append(("unit", config_id, epoch, kind))

    def on_epoch_end(self, config_id, epoch, metrics, config):
        self.calls.append(("epoch", config_id, epoch, round(metrics["valid_loss"], 9), config["hidden"]))

    def on_decision(self, round, decision):
        self.calls.append(("decision", round))

    def on_run_end(self, result):
        self.calls.append(("end", result.best_config_id))


class Broken(framework.Callback):
    def on_epoch_end(self, config_id, epoch, metrics, config):
        raise RuntimeError("tracker down")


def test_trackers_write_what_their_own_readers_read_back(ray_cluster, digits, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("MODELHOPPER_STORAGE", str(tmp_path / "root"))
    ds = framework.PartitionedDataset.from_arrays(*digits, num_partitions=2, seed=0)
    rec, uri = Recorder(), f"file://{tmp_path}/remote/run"
    with pytest.warns(UserWarning, match="callback Broken.on_epoch_end raised and is switched off"):
        result = framework.ModelSelection(
            mlp_model_fn, classifier_train_fn, classifier_eval_fn, ds, automl.GridSearch(SPACE, epochs=2),
            storage_path=uri, progress=False,
            callbacks=[Broken(), rec, framework.TensorBoardCallback(), framework.MLflowCallback()],
        ).run()
    # the recorder saw every hook, epochs as committed (0-based, the numbers Result.metrics holds)
    assert rec.calls[0] == ("start", "valid_loss", False) and rec.calls[-1] == ("end", result.best_config_id)
    assert sum(c[0] == "unit" for c in rec.calls) == len(result.schedule) == 2 * 2 * 4
    epochs = sorted(c[1:] for c in rec.calls if c[0] == "epoch")
    expected = sorted((int(r.config_id), int(r.epoch), round(r.valid_loss, 9), int(r["config/hidden"]))
                      for _, r in result.metrics.iterrows())
    assert epochs == expected
    assert [c[1] for c in rec.calls if c[0] == "decision"] == [-1, 0, 1]  # -1: the first configs, before any epoch
    assert (result.events.kind == "callback_failed").sum() == 1
    # TensorBoard: one run per config, a scalar per epoch, and the HParams plugin's data
    for cid in result.configs:
        acc = EventAccumulator(os.path.join(result.storage_path, "tensorboard", f"config_{cid}")).Reload()
        scalars = acc.Scalars("valid_loss")
        rows = result.metrics[result.metrics.config_id == cid].sort_values("epoch")
        assert [s.step for s in scalars] == list(rows.epoch)
        assert [s.value for s in scalars] == pytest.approx(list(rows.valid_loss), rel=1e-6)
        assert acc.PluginTagToContent("hparams")  # the HParams plugin's session data
    # MLflow: a parent run and one nested run per config, metrics by epoch
    client = MlflowClient(tracking_uri=f"sqlite:///{os.path.join(result.storage_path, 'mlflow.db')}")
    runs = client.search_runs([client.get_experiment_by_name("run").experiment_id])
    children = {r.data.tags["modelhopper.config_id"]: r for r in runs if "mlflow.parentRunId" in r.data.tags}
    assert sorted(children) == ["0", "1"] and len(runs) == 3
    for cid, r in children.items():
        assert r.data.params["hidden"] == str(result.configs[int(cid)]["hidden"])
        assert r.data.tags["modelhopper.outcome"] == "completed" and r.info.status == "FINISHED"
        history = client.get_metric_history(r.info.run_id, "valid_loss")
        assert sorted(m.step for m in history) == [0, 1]
    # the mirror holds the finished run: it opens from the URI alone
    assert sorted(os.listdir(tmp_path / "remote" / "run" / "tensorboard")) == ["config_0", "config_1"]
    again = framework.Result.open(uri)
    assert again.best_config_id == result.best_config_id and len(again.metrics) == 4
    # a replay of the URI reads a temporary copy, removes it, and writes a new run under the storage root
    copies = lambda: {n for n in os.listdir(tempfile.gettempdir()) if n.startswith(READ_PREFIX)}  # noqa: E731
    before = copies()
    replayed = framework.replay(uri, device="cpu")
    assert replayed.meta["replay_of"] == uri and replayed.storage_path.startswith(str(tmp_path / "root"))
    assert list(replayed.metrics.valid_loss) == pytest.approx(list(result.metrics.valid_loss), rel=1e-6)
    assert copies() <= before
