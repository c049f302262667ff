"""What user code returns, checked on the MOP engine: a non-finite metric or a bad `num_examples` fails its config
with a reason naming it (never a NaN in the leaderboard), and a freezing run leaves no activation cache behind."""

from __future__ import annotations

import os
import tempfile

import pytest

import automl
import framework
from framework.examples import classifier_eval_fn, classifier_train_fn, mlp_model_fn

pytestmark = pytest.mark.ray

SPACE = {"hidden": [16], "lr": [0.05, 0.2], "batch_size": [50]}  # 2 configs; lr=0.2 is the one whose code misbehaves


def _nan_accuracy_eval_fn(model, data, config):
    metrics = classifier_eval_fn(model, data, config)
    return {**metrics, "accuracy": float("nan")} if config["lr"] == 0.2 else metrics


def _zero_examples_train_fn(model, optimizer, data, config):
    metrics = classifier_train_fn(model, optimizer, data, config)
    return {**metrics, "num_examples": 0} if config["lr"] == 0.2 else metrics


def _run(digits, tmp_path, train_fn=classifier_train_fn, eval_fn=classifier_eval_fn, **kw):
    x, y = digits
    ds = framework.PartitionedDataset.from_arrays(x[:400], y[:400], num_partitions=2, seed=0)
    return framework.ModelSelection(
        mlp_model_fn, train_fn, eval_fn, ds, automl.GridSearch(SPACE, epochs=1),
        storage_path=str(tmp_path / "run"), progress=False, metric="valid_accuracy", mode="max", **kw,
    ).run()


def _by_lr(result):
    status = result.status.set_index("config_id")
    return {cfg["lr"]: status.loc[cid] for cid, cfg in result.configs.items()}


def test_a_nan_eval_metric_fails_its_config_with_the_metric_named(ray_cluster, digits, tmp_path):
    result = _run(digits, tmp_path, eval_fn=_nan_accuracy_eval_fn)
    rows = _by_lr(result)
    assert rows[0.2].status == "failed" and "eval_fn returned a non-finite metric: accuracy = nan" in rows[0.2].error
    assert rows[0.05].status == "completed"
    best = result.get_best_result()
    assert result.configs[best.config_id]["lr"] == 0.05 and len(result.failures) == 1
    assert not result.metrics.valid_accuracy.isna().any()  # the NaN never reached the metrics


def test_num_examples_zero_fails_its_config_instead_of_dropping_its_train_metrics(ray_cluster, digits, tmp_path):
    result = _run(digits, tmp_path, train_fn=_zero_examples_train_fn)
    rows = _by_lr(result)
    assert rows[0.2].status == "failed"
    assert "train_fn returned `num_examples` = 0, but it must be a positive int" in rows[0.2].error
    healthy = result.metrics[result.metrics.config_id.map(lambda cid: result.configs[cid]["lr"]) == 0.05]
    assert rows[0.05].status == "completed" and healthy.train_loss.notna().all()


class _CacheObserver(framework.Callback):
    """Counts the activation-cache folders in the temporary folder while the run goes on."""

    def __init__(self) -> None:
        self.seen = 0

    def on_epoch_end(self, config_id, epoch, metrics, config) -> None:
        self.seen = max(self.seen, len(_cache_entries()))


def _cache_entries() -> list[str]:
    tmp = tempfile.gettempdir()
    return [os.path.join(d, f) for d in os.listdir(tmp) if d.startswith("modelhopper-cache-")
            for f in os.listdir(os.path.join(tmp, d))] + [d for d in os.listdir(tmp) if d.startswith("modelhopper-w")]


def test_a_freezing_run_leaves_no_activation_cache_in_the_temporary_folder(ray_cluster, digits, tmp_path, monkeypatch):
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # this test's own: no other process counts
    observer = _CacheObserver()
    result = _run(digits, tmp_path, freezing={"modules": "children", "eval_interval": 4, "cache": True},
                  callbacks=[observer])
    assert (result.status.status == "completed").all()
    assert observer.seen == 2  # each worker had its cache while the run went on
    assert os.listdir(tmp_path / "tmp") == []
