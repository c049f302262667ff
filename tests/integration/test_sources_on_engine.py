"""Data sources on the MOP engine: real runs on Parquet files, a Hugging Face dataset saved to disk, a torch
`Dataset` and a Ray Data dataset, each partition read by the Ray worker that holds it; the driver's process never
opens a data file (checked exactly, with `strace`); a Parquet run resumes and replays from its run.db; bad input
is one clear error."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import automl
import framework
from framework.examples import arrays_as_parquet, classifier_step_fn, mlp_model_fn
from tests.integration.ft_helpers import ray_cluster_address

pytestmark = pytest.mark.ray

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPACE = {"hidden": [16], "lr": [0.1], "batch_size": [64]}


def _write_digits(folder, digits, files=(2, 1)):
    """600 of the digits as Parquet: `files[0]` train files (480 rows) and `files[1]` valid files (120) under
    folder/train and folder/valid, one column per pixel (f0..f63) and `label`, row groups of 64 rows."""
    x, y = digits
    return Path(arrays_as_parquet(str(folder), x[:600], y[:600], files=files, row_group_size=64))


def _run(ds, tmp_path, name="run", epochs=1):
    return framework.ModelSelection(
        mlp_model_fn, step_fn=classifier_step_fn, dataset=ds, procedure=automl.GridSearch(SPACE, epochs=epochs),
        num_workers=2, storage_path=str(tmp_path / name), progress=False,
    ).run()


def _opened(trace: str, folder: str) -> list[str]:
    """The files under `folder` that a strace log of open/openat calls shows opened (its folders, opened to list
    them, are not data)."""
    quoted = re.findall(r'open(?:at2?)?\((?:[^,]*, )?"([^"]+)"', trace)
    return sorted({p for p in quoted if os.path.realpath(p).startswith(os.path.realpath(folder) + os.sep)
                   and os.path.isfile(p)})


def _strace(argv: list[str], out: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """`argv` run under strace, every open of every thread of it (and of any child) logged to `out`. Where the
    kernel allows it, a seccomp filter stops the traced process only at the open calls (the same log; without it
    every system call of every thread of a Ray driver stops for strace, which costs the machine's CPU many times)."""
    fast = ["--seccomp-bpf"] if _can_filter() else []
    return subprocess.run(["strace", "-f", *fast, "-qq", "-e", "trace=open,openat,openat2", "-o", out, *argv],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _can_trace() -> bool:
    """Whether strace is installed and may trace here (a container may forbid ptrace)."""
    if shutil.which("strace") is None:
        return False
    return subprocess.run(["strace", "-f", "-qq", "-e", "trace=openat", "-o", os.devnull, "true"],
                          capture_output=True).returncode == 0


@functools.cache
def _can_filter() -> bool:
    """Whether strace's `--seccomp-bpf` works here: a probe under it logs the open of a file it makes."""
    with tempfile.TemporaryDirectory() as folder:
        log, made = os.path.join(folder, "probe.strace"), os.path.join(folder, "made")
        ok = subprocess.run(["strace", "-f", "--seccomp-bpf", "-qq", "-e", "trace=open,openat,openat2", "-o", log,
                             sys.executable, "-c", f"open({made!r}, 'w').close()"], capture_output=True).returncode == 0
        return ok and os.path.isfile(log) and made in open(log).read()


@pytest.mark.skipif(not _can_trace(), reason="needs strace (and ptrace) to see what the driver's process opens")
def test_the_driver_never_opens_a_data_file_and_the_parquet_run_resumes_and_replays(
        ray_cluster, digits, tmp_path, assert_complete):
    """Exact, not a byte count: the driver (tests/integration/sources_job.py) runs in a process of its own under
    `strace -f`, attached to this session's Ray cluster, so every open(2)/openat(2) of any of its threads is logged
    (pyarrow's C++ reader and a memory map open the file too: there is no read of a file without an open). The
    workers are Ray's processes, started by the raylet, not children of the driver, so their opens are not in the
    log. The control case shows the check can fail: a process that reads one of the files with pyarrow (memory-
    mapped, which a byte count of read(2) calls would miss) is caught by the same check. The driver kills itself
    after its first commit; the run is then resumed here from its run.db (the Parquet sources rebuilt from their
    JSON) and replayed."""
    data = _write_digits(tmp_path / "data", digits)
    storage = str(tmp_path / "run")
    env = {**os.environ, "RAY_ADDRESS": ray_cluster_address(cpus=2),  # (sources_job: two workers)
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    trace = str(tmp_path / "driver.strace")
    proc = _strace([sys.executable, "-m", "tests.integration.sources_job", str(data), storage, "crash"], trace, env)
    assert proc.returncode == -9, f"the driver was not killed by its fault ({proc.returncode}):\n{proc.stderr[-3000:]}"
    with open(trace) as f:
        log = f.read()
    assert "run.db" in log  # the log holds the driver's opens (it wrote its run.db)
    assert _opened(log, str(data)) == []

    control = str(tmp_path / "control.strace")
    code = f"import pyarrow.parquet as pq; pq.read_table({str(data / 'train' / 'part-1.parquet')!r}, memory_map=True)"
    assert _strace([sys.executable, "-c", code], control).returncode == 0
    with open(control) as f:
        assert _opened(f.read(), str(data)) == [str(data / "train" / "part-1.parquet")]

    from tests.integration.sources_job import SPACE as JOB_SPACE

    resumed = framework.ModelSelection.resume(storage, mlp_model_fn, step_fn=classifier_step_fn, progress=False).run()
    assert set(resumed.status.status) == {"completed"} and len(resumed.status) == len(JOB_SPACE["lr"])
    assert_complete(resumed)
    assert sorted(resumed.metrics.epoch.unique()) == [0, 1]
    replayed = framework.replay(storage, model_fn=mlp_model_fn, step_fn=classifier_step_fn,
                                out_path=str(tmp_path / "replay"))
    assert len(replayed.schedule) == len(resumed.schedule)  # every unit the run logged, read from the same files
    run_metrics = resumed.metrics.sort_values(["config_id", "epoch"]).valid_loss.to_numpy()
    replay_metrics = replayed.metrics.sort_values(["config_id", "epoch"]).valid_loss.to_numpy()
    np.testing.assert_allclose(replay_metrics, run_metrics, rtol=1e-5)


class Digits(torch.utils.data.Dataset):
    """The digits as a map-style torch Dataset whose rows may not be read in the process that made it (the driver):
    there, `__getitem__` raises."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y, self.maker = x.astype(np.float32), y.astype(np.int64), os.getpid()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if os.getpid() == self.maker:
            raise AssertionError("the driver indexed the torch dataset: its rows must be read on the workers")
        return torch.from_numpy(self.x[i]), int(self.y[i])


def _hf(folder, digits):
    datasets = pytest.importorskip("datasets")
    x, y = digits
    for split, rows in (("train", slice(0, 480)), ("valid", slice(480, 600))):
        d = datasets.Dataset.from_dict({"pixels": x[rows].astype(np.float32).tolist(), "label": y[rows].tolist()})
        d.save_to_disk(str(folder / split), num_shards=1)
    return framework.PartitionedDataset.from_hf_dataset(str(folder / "train"), str(folder / "valid"),
                                                        num_partitions=2)


def _torch(folder, digits):
    x, y = digits
    return framework.PartitionedDataset.from_torch_dataset(Digits(x[:600], y[:600]), 2, valid_fraction=0.2)


def _ray(folder, digits):
    _write_digits(folder, digits)
    import ray.data

    # read by Ray tasks, the blocks staying in the object store; two blocks each, as the files are small (else Ray
    # Data reads in as many tasks as the session has CPUs, each a new Ray worker process that idles after)
    train = ray.data.read_parquet(str(folder / "train"), override_num_blocks=2)
    valid = ray.data.read_parquet(str(folder / "valid"), override_num_blocks=2)
    return framework.PartitionedDataset.from_ray_dataset(train, 2, valid=valid)


@pytest.mark.parametrize(("make", "kind"), [(_hf, "arrow"), (_torch, "torch"), (_ray, "ray")])
def test_each_source_trains_on_the_engine_with_its_partitions_read_on_the_workers(
        ray_cluster, digits, tmp_path, make, kind):
    ds = make(tmp_path / "data", digits)
    result = _run(ds, tmp_path)
    assert set(result.status.status) == {"completed"}
    meta = result.meta
    assert {e["value"]["kind"] for e in meta["dataset"]["train"]} == {kind}
    assert len(meta["data_bytes_per_worker"]) == 2 and min(meta["data_bytes_per_worker"]) > 0  # held by each worker
    rows = result.schedule.groupby("kind").num_examples.sum()
    assert rows["train"] == 480 and rows["eval"] == 120  # every row of each split, read where its partition lives
    assert np.isfinite(result.metrics.valid_loss).all()


def test_a_torch_dataset_run_resumes_and_replays_only_with_its_dataset_passed_again(ray_cluster, digits, tmp_path):
    ds = _torch(tmp_path, digits)
    result = _run(ds, tmp_path)
    with pytest.raises(ValueError, match=r"\(torch: .*pass the same dataset again, as dataset=\.\.\. to "
                                         r"ModelSelection.resume\(\) or replay\(\)"):
        framework.ModelSelection.resume(str(tmp_path / "run"), mlp_model_fn, step_fn=classifier_step_fn)
    x, y = digits
    again = framework.PartitionedDataset.from_torch_dataset(Digits(x[:600], y[:600]), 2, valid_fraction=0.2)
    sel = framework.ModelSelection.resume(str(tmp_path / "run"), mlp_model_fn, step_fn=classifier_step_fn,
                                          dataset=again, progress=False)
    assert set(sel.run().status.status) == {"completed"}  # (it had finished)
    with pytest.raises(ValueError, match="pass the same dataset again, as dataset="):
        framework.replay(str(tmp_path / "run"), model_fn=mlp_model_fn, step_fn=classifier_step_fn)
    again.train[0].dataset.maker = -1  # replay trains in this process
    replayed = framework.replay(str(tmp_path / "run"), model_fn=mlp_model_fn, step_fn=classifier_step_fn,
                                dataset=again, out_path=str(tmp_path / "replay"))
    np.testing.assert_allclose(replayed.metrics.valid_loss.to_numpy(), result.metrics.valid_loss.to_numpy(),
                               rtol=1e-5)
    other = framework.PartitionedDataset.from_torch_dataset(Digits(x[:600], y[:600]), 2, seed=1)
    with pytest.raises(ValueError, match="`dataset` is not the run's"):
        framework.ModelSelection.resume(str(tmp_path / "run"), mlp_model_fn, step_fn=classifier_step_fn,
                                        dataset=other)


def test_a_missing_parquet_column_fails_the_run_naming_the_column_and_the_file(ray_cluster, digits, tmp_path):
    data = _write_digits(tmp_path / "data", digits)
    ds = framework.PartitionedDataset.from_parquet(data / "train", data / "valid", columns=["f1", "pixels"])
    with pytest.raises(ValueError, match=r"name column\(s\) \['pixels'\], but .*part-\d\.parquet has no such column"):
        _run(ds, tmp_path)


_PLAIN = {"compression": "none", "use_dictionary": False, "write_statistics": False}  # (sizes that labels keep)


def _write_plain(folder, digits, shift: int = 0, rename: dict | None = None):
    """digits as plain Parquet (two train files, one valid), labels shifted by `shift` mod 10 (other labels, the
    same file sizes); `rename`: {file index: {old column: new}} for train files."""
    x, y = digits[0][:480], digits[1][:480]
    for split, rows, count in (("train", slice(0, 400), 2), ("valid", slice(400, 480), 1)):
        os.makedirs(folder / split, exist_ok=True)
        for i, chunk in enumerate(np.array_split(np.arange(len(x))[rows], count)):
            cols = {**{f"f{k}": x[chunk, k].astype(np.float32) for k in range(x.shape[1])},
                    "label": ((y[chunk] + shift) % 10).astype(np.int64)}
            for old, new in ((rename or {}).get(i, {}) if split == "train" else {}).items():
                cols[new] = cols.pop(old)
            pq.write_table(pa.table(cols), folder / split / f"part-{i}.parquet", **_PLAIN)
    return folder


def test_a_run_reads_the_files_it_recorded_and_a_changed_or_edited_one_is_refused_naming_it(
        ray_cluster, digits, tmp_path, monkeypatch):
    from framework.sources import DataChangedError

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _write_plain(tmp_path / "a" / "data", digits)
    monkeypatch.chdir(tmp_path / "a")
    result = _run(framework.PartitionedDataset.from_parquet("data/train", "data/valid"), tmp_path)  # relative paths
    read = [json.loads(d) for d in result.events[result.events.kind == "source_read"].detail]
    assert {f["path"] for d in read for f in d["files"]} == {str(tmp_path / "a" / "data" / s / f"part-{i}.parquet")
                                                             for s, n in (("train", 2), ("valid", 1)) for i in range(n)}

    # files of the same names in another working directory, other labels: a replay from there reads the run's own
    _write_plain(tmp_path / "b" / "data", digits, shift=3)
    monkeypatch.chdir(tmp_path / "b")
    again = framework.replay(result.storage_path, out_path=str(tmp_path / "r1"))
    np.testing.assert_array_equal(again.metrics.valid_loss.to_numpy(), result.metrics.valid_loss.to_numpy())

    # the run's own file replaced by other content of the same size and modification time: refused, naming it
    target = tmp_path / "a" / "data" / "train" / "part-1.parquet"
    st = target.stat()
    shutil.copy(tmp_path / "b" / "data" / "train" / "part-1.parquet", target)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert target.stat().st_size == st.st_size
    with pytest.raises(DataChangedError, match=rf"{target} has other content than when the run read it"):
        framework.replay(result.storage_path, out_path=str(tmp_path / "r2"))
    accepted = framework.replay(result.storage_path, out_path=str(tmp_path / "r3"), accept_changed_data=True)
    assert (accepted.events.kind == "source_changed_accepted").sum() == 1

    # a dataset entry edited to name a file the run never read (run.db edited: trust_unverified) is never opened
    import sqlite3

    db = sqlite3.connect(os.path.join(result.storage_path, "run.db"))
    (meta,) = db.execute("SELECT value FROM meta WHERE key = 'dataset'").fetchone()
    db.execute("UPDATE meta SET value = ? WHERE key = 'dataset'", (meta.replace(str(target), "/etc/passwd"),))
    db.commit()
    db.close()
    from framework.store.catalog import UnverifiedRunWarning

    with pytest.warns(UnverifiedRunWarning), pytest.raises(DataChangedError, match="names /etc/passwd, a file the "
                                                                                   "run never read"):
        framework.replay(result.storage_path, out_path=str(tmp_path / "r4"), trust_unverified=True,
                         model_fn=mlp_model_fn, step_fn=classifier_step_fn)

    # a first run whose files disagree on a column: refused at load, naming the file and the column
    _write_plain(tmp_path / "c", digits, rename={1: {"f3": "g3"}})
    with pytest.raises(DataChangedError, match=r"part-1\.parquet: column\(s\) \['f3'\] are gone and \['g3'\] are new"):
        _run(framework.PartitionedDataset.from_parquet(tmp_path / "c" / "train", tmp_path / "c" / "valid"), tmp_path,
             name="renamed")
