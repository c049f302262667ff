"""The Weights & Biases tracker on a real run, offline: its files read back with wandb's own record schema, one W&B
run per config with the config, a point per epoch and the config's outcome (a failed config's run failed)."""

from __future__ import annotations

import glob
import json
import os
import struct

import psutil
import pytest

import automl
import framework
from framework.examples import classifier_eval_fn, classifier_train_fn, digits_arrays, mlp_model_fn

pytestmark = pytest.mark.ray

wandb = pytest.importorskip("wandb")

# hidden=13 fails in its second epoch; every config holds the dict `optim` (W&B keeps it nested)
SPACE = {"hidden": [13, 16], "lr": [0.05], "batch_size": [32], "optim": {"momentum": 0.9, "nesterov": False}}


def _fails_in_epoch_1_train_fn(model, optimizer, data, config):
    group = optimizer.param_groups[0]  # saved with the optimizer's state: it travels with the config
    group["units"] = group.get("units", 0) + 1
    if config["hidden"] == 13 and group["units"] > 2:  # 2 partitions: its third training unit is in epoch 1
        raise RuntimeError("fails in epoch 1 on purpose")
    return classifier_train_fn(model, optimizer, data, config)


def _records(path: str) -> list:
    """The records of a `.wandb` file, parsed by wandb's own schema (`wandb_internal_pb2.Record`). wandb 0.31 writes
    the file from its Go core and ships no Python reader; the framing is LevelDB's log format after a 7-byte header
    (`:W&B`, magic 0xBEE1, version): 32 KiB blocks of chunks, each `crc32 (4) | length (2) | type (1)`, type 1 a
    whole record and 2/3/4 its first/middle/last part."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = open(path, "rb").read()
    assert data[:4] == b":W&B" and struct.unpack("<H", data[4:6])[0] == 0xBEE1
    records, pos, part = [], 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        part += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = Record()
            record.ParseFromString(part)
            records.append(record)
            part = b""
    assert not part, f"{path} ends in the middle of a record"
    return records


def _items(items) -> dict:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def _read_run(path: str) -> dict:
    """What an offline run holds: its run record, config, history rows, summary and exit code."""
    run: dict = {"config": {}, "history": [], "summary": {}, "exit_code": None}
    for r in _records(path):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            run.update(id=r.run.run_id, name=r.run.display_name, group=r.run.run_group, project=r.run.project,
                       tags=list(r.run.tags))
            run["config"].update(_items(r.run.config.update))
        elif kind == "config":
            run["config"].update(_items(r.config.update))
        elif kind == "history":
            run["history"].append(_items(r.history.item))
        elif kind == "summary":
            run["summary"].update(_items(r.summary.update))
        elif kind == "exit":
            run["exit_code"] = r.exit.exit_code
    run["config"].pop("_wandb", None)
    return run


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    """W&B offline and quiet, every file of it under `tmp_path`, any network call aimed at a closed local port; its
    service process is shut down after the test."""
    home = tmp_path / "wandb_home"
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    for name in ("WANDB_DISABLE_GIT", "WANDB_DISABLE_CODE", "WANDB__DISABLE_STATS", "WANDB__DISABLE_META"):
        monkeypatch.setenv(name, "true")
    for name, sub in (("WANDB_DIR", "dir"), ("WANDB_CONFIG_DIR", "config"), ("WANDB_CACHE_DIR", "cache"),
                      ("WANDB_DATA_DIR", "data"), ("WANDB_ARTIFACT_DIR", "artifacts")):
        monkeypatch.setenv(name, str(home / sub))
    yield
    wandb.teardown()


class Ends(framework.Callback):
    """Called after the tracker: whether it still holds a config's W&B run open when that config ends."""

    def __init__(self, tracker):
        self.tracker, self.seen = tracker, []

    def on_decision(self, round, decision):
        self.seen += [(cid, cid in self.tracker.runs) for cid in decision.stop]

    def on_event(self, kind, detail):
        if kind == "config_failed":
            self.seen.append((detail["config_id"], detail["config_id"] in self.tracker.runs))


def _select(tmp_path, procedure, train_fn=classifier_train_fn):
    ds = framework.PartitionedDataset.from_arrays(*digits_arrays(), num_partitions=2, seed=0)
    tracker = framework.WandbCallback(project="mh-test", mode="offline", tags=["ci"], job_type="selection")
    ends = Ends(tracker)
    result = framework.ModelSelection(
        mlp_model_fn, train_fn, classifier_eval_fn, ds, procedure, storage_path=str(tmp_path / "run"), progress=False,
        callbacks=[tracker, ends],
    ).run()
    assert not (result.events.kind == "callback_failed").any()
    return result, tracker, ends


def _check_runs(result, tracker) -> dict:
    """Every config's W&B run as read back: its id, group, config, a point per committed epoch, its outcome."""
    status = result.status.set_index("config_id").status.to_dict()
    assert not tracker.runs and tracker.outcomes == status  # every run finished, with its config's outcome
    files = glob.glob(os.path.join(result.storage_path, "wandb", "offline-run-*", "run-*.wandb"))
    runs = {r["name"]: r for r in map(_read_run, files)}
    assert len(files) == len(result.configs) and sorted(runs) == sorted(f"config_{c}" for c in result.configs)
    for cid, config in result.configs.items():
        run = runs[f"config_{cid}"]
        assert run["id"] == f"{result.meta['run_id']}-{cid}"
        assert (run["group"], run["project"], run["tags"]) == ("run", "mh-test", ["ci"])
        assert run["config"] == config and run["config"]["optim"] == {"momentum": 0.9, "nesterov": False}
        rows = result.metrics[result.metrics.config_id == cid].sort_values("epoch")
        assert len(rows) >= 1
        assert [h["_step"] for h in run["history"]] == list(rows.epoch)
        assert [h["valid_loss"] for h in run["history"]] == pytest.approx(list(rows.valid_loss), rel=1e-6)
        assert [h["train_loss"] for h in run["history"]] == pytest.approx(list(rows.train_loss), rel=1e-6)
        assert run["summary"]["modelhopper/outcome"] == status[cid]
        assert run["exit_code"] == (1 if status[cid] == "failed" else 0)
    return status


def test_wandb_offline_runs_read_back_one_per_config(ray_cluster, tmp_path, wandb_offline):
    result, tracker, ends = _select(tmp_path, automl.GridSearch(SPACE, epochs=2), _fails_in_epoch_1_train_fn)
    status = _check_runs(result, tracker)
    assert sorted(status.values()) == ["completed", "failed"]
    failed = [cid for cid, s in status.items() if s == "failed"]
    assert list(result.metrics[result.metrics.config_id == failed[0]].epoch) == [0]  # it committed epoch 0 only
    # each run was finished as its config ended: the failure at once, the completed one at the procedure's stop
    assert sorted(ends.seen) == [(0, False), (1, False)]
    wandb.teardown()  # the service process ends with the last run: none lingers
    assert not [p for p in psutil.Process().children(recursive=True) if "wandb" in p.name()]


def test_wandb_runs_of_pruned_configs_finish_at_their_stop(ray_cluster, tmp_path, wandb_offline):
    space = {**SPACE, "hidden": [8, 16, 32]}
    result, tracker, ends = _select(tmp_path, automl.HyperBand(space, max_epochs=2, eta=2, seed=0))
    status = _check_runs(result, tracker)
    assert "pruned" in status.values() and "completed" in status.values()
    assert sorted(cid for cid, _ in ends.seen) == sorted(status) and not any(held for _, held in ends.seen)


def test_a_wandb_error_switches_the_tracker_off_and_the_run_goes_on(ray_cluster, tmp_path, wandb_offline):
    ds = framework.PartitionedDataset.from_arrays(*digits_arrays(), num_partitions=2, seed=0)
    tracker = framework.WandbCallback(project="mh-test", mode="online")  # no API key: wandb.init raises at once
    with pytest.warns(UserWarning, match="callback WandbCallback.on_epoch_end raised and is switched off"):
        result = framework.ModelSelection(
            mlp_model_fn, classifier_train_fn, classifier_eval_fn, ds,
            automl.GridSearch({**SPACE, "hidden": [16]}, epochs=2), storage_path=str(tmp_path / "run"),
            progress=False, callbacks=[tracker],
        ).run()
    assert list(result.status.status) == ["completed"] and len(result.metrics) == 2
    failed = result.events[result.events.kind == "callback_failed"]
    assert len(failed) == 1 and "No API key configured" in failed.detail.iloc[0]
    assert not tracker.runs
