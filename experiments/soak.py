"""A soak: one long ASHA run on a two-node local Ray cluster while everything goes wrong at once, audited at the end.

The soak starts a Ray head of its own (`ray start --head`: a free port, a temporary folder and an auth token of its
own, as many CPUs as the run has workers), runs the driver as a child process (`python experiments/soak.py --driver
...`, attached with RAY_ADDRESS) and, for `--minutes`:
    worker kills     a worker actor process (`ray::_RayWorker`) of this cluster that is up (not one still starting
                     or loading its partitions) is SIGKILLed every `kill_every_s` seconds on average (exponential gaps)
    driver kills     the driver process is SIGKILLed at `driver_kills` random points, one in each equal slice of the
                     duration (once that driver committed a round of its own: a run with none cannot be resumed),
                     each followed at once by `python -m framework resume RUN`
    a second node    `ray start --address=HEAD` joins for `node_up_s` seconds on average and leaves for
                     `node_down_s`: its processes (and the workers on it) are stopped, the head's are not
    commands         every `command_every_s` seconds on average, one command through `framework.connect(run)`:
                     stop, resume a stopped config, clone, add, pause then unpause, add workers while the node is
                     up, drain an added worker, extend (more samples, when ASHA would run out before the duration)
ASHA over 200 configs of small MLPs on scikit-learn's digits (each training unit adds `device_s` seconds of emulated
accelerator time) starts new configs until the duration is over (its `time_budget_s`), so the run lasts at least that
long; then the chaos stops (a driver kill still due excepted), the configs in flight finish their rungs, and the
run's log is audited:

    units run            training and evaluation units logged done
    units re-run         first tries that did not count (interrupted, lost, failed) and ran again
    units lost           must be 0: a unit that started and neither finished nor ran again, plus any partition
                         missing from a committed epoch of a config that did not fail
    units counted twice  must be 0: a (config, epoch, partition) training unit logged done more than once
with the catalog's signatures (`Result.verified`) and the completeness proof (`Result.check_completeness`). It exits
with 1 when any of that fails, a config is left unfinished or a driver exits on its own. Everything it started
(drivers, the node, the head, their workers) is stopped at the end, on Ctrl-C, SIGTERM and errors too.

    python experiments/soak.py                 # 20 minutes (`make soak`)
    python experiments/soak.py --quick         # 2 minutes, smaller, with kills spaced for a small machine
    make soak SOAK_ARGS="--minutes 60"
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import pandas as pd  # noqa: E402
import psutil  # noqa: E402

import automl  # noqa: E402
import framework  # noqa: E402
from experiments._common import parse_config, record_run  # noqa: E402
from framework.examples import classifier_eval_fn, classifier_train_fn, digits_arrays, mlp_model_fn  # noqa: E402
from framework.result import CATALOG_FILE  # noqa: E402
from framework.steering.connect import CommandOutcome, NotRunningError  # noqa: E402
from framework.store.catalog import SQLiteCatalog  # noqa: E402

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
MARKER = "MODELHOPPER_SOAK"  # in the environment of every process the soak starts: what it may stop, and only that
WORKER_TITLE = "ray::_RayWorker"  # the process title of a worker actor (framework.engine.ray_backend._RayWorker)


@dataclass
class Defaults:
    minutes: float = 20.0  # the run lasts at least this long: ASHA starts new configs until then
    workers: int = 4  # workers of the run (and partitions of the data); the head has as many CPUs
    replicas: int = 2  # workers that hold each partition
    configs: int = 200  # configs ASHA samples (raised by `extend` when they would run out before the duration)
    max_epochs: int = 9  # ASHA's top rung
    eta: int = 3  # ASHA's reduction factor
    device_s: float = 0.3  # emulated accelerator seconds per training unit (a sleep); 0: CPU only
    kill_every_s: float = 2.0  # mean seconds between two worker SIGKILLs (exponential gaps)
    driver_kills: int = 5  # driver SIGKILLs, each followed by a resume, one in each slice of the duration
    node_up_s: float = 60.0  # mean seconds the second node stays in the cluster each time it joins
    node_down_s: float = 30.0  # mean seconds it stays away
    node_cpus: int = 2  # CPUs of the second node
    command_every_s: float = 4.0  # mean seconds between two commands through framework.connect
    grace_minutes: float = 20.0  # after the duration, how long the run may take to finish before the soak fails
    seed: int = 0  # seeds the data, the run and the chaos


# a small machine's 2 minutes: a worker takes several seconds to start there, and a resume tens of seconds
QUICK = dict(minutes=2.0, configs=40, max_epochs=3, device_s=0.1, kill_every_s=6.0, driver_kills=2, node_up_s=25.0,
             node_down_s=15.0, command_every_s=2.0, grace_minutes=5.0)
SPACE = {"hidden": [16, 32, 64, 128], "layers": [1, 2], "lr": automl.loguniform(1e-3, 0.3), "batch_size": [32, 64],
         "optimizer": ["sgd", "adam"]}


def soak_train_fn(model, optimizer, data, config):
    """`classifier_train_fn` plus `config["device_s"]` seconds of emulated accelerator time. Imported by resume as
    `experiments.soak:soak_train_fn` (the drivers and the Ray nodes run with the repository on PYTHONPATH)."""
    time.sleep(float(config.get("device_s", 0.0)))
    return classifier_train_fn(model, optimizer, data, config)


def selection(cfg: Defaults, storage: str) -> framework.ModelSelection:
    """The soak's run: ASHA over `cfg.configs` configs for at least `cfg.minutes`, on `cfg.workers` workers."""
    x, y = digits_arrays()
    ds = framework.PartitionedDataset.from_arrays(x, y, num_partitions=cfg.workers, valid_fraction=0.2,
                                                  seed=cfg.seed, replicas=cfg.replicas)
    asha = automl.ASHA({**SPACE, "device_s": cfg.device_s}, max_epochs=cfg.max_epochs, eta=cfg.eta,
                       max_configs=cfg.configs, time_budget_s=60.0 * cfg.minutes, seed=cfg.seed)
    return framework.ModelSelection(
        mlp_model_fn, soak_train_fn, classifier_eval_fn, ds, asha, num_workers=cfg.workers, seed=cfg.seed,
        metric="valid_accuracy", mode="max", storage_path=storage, progress=False,
        max_worker_restarts=1_000_000, unit_timeout_s=120.0)


# ---- processes ------------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _marked(marker: str) -> list[psutil.Process]:
    """This soak's processes: those whose environment carries its marker (inherited by every descendant)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get(MARKER) == marker:
                found.append(p)
        except psutil.Error:
            continue
    return found


def _title(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def _stop(procs: list[psutil.Process], grace_s: float = 3.0) -> None:
    """SIGTERM, then SIGKILL what is still there after `grace_s` (what `ray stop` does, to these processes only)."""
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace_s)


def _group(pgid: int) -> list[psutil.Process]:
    """The processes of process group `pgid` and all their descendants (worker processes have groups of their
    own but are children of their node's raylet)."""
    members = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(p.pid) == pgid:
                members.append(p)
    out = {p.pid: p for p in members}
    for p in members:
        with contextlib.suppress(psutil.Error):
            out.update({c.pid: c for c in p.children(recursive=True)})
    return list(out.values())


class SoakCluster:
    """A Ray head and a second node on this machine, owned by the soak: a port, a temporary folder and an auth token
    of their own, and every process they start marked (`MARKER`) so that `close` stops exactly those."""

    def __init__(self, cfg: Defaults, log_dir: str) -> None:
        self.cfg, self.log_dir = cfg, log_dir
        os.makedirs(log_dir, exist_ok=True)
        self.tmp = tempfile.mkdtemp(prefix="mhsoak-")  # short: Ray's socket paths live under it
        token = os.path.join(self.tmp, "auth_token")
        with open(token, "w") as f:
            f.write(secrets.token_hex(32))
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token, "PYTHONPATH": path,
                    MARKER: self.tmp}
        self.env.pop("RAY_ADDRESS", None)
        self.head_pgid: int | None = None
        self.node_pgid: int | None = None
        self.node_lock = threading.Lock()
        self.closed = False

    def _ray_start(self, args: list[str], log: str) -> int:
        with open(os.path.join(self.log_dir, log), "a") as out:
            proc = subprocess.Popen([RAY, "start", *args, "--node-ip-address=127.0.0.1", "--disable-usage-stats"],
                                    env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            rc = proc.wait(timeout=180)
        if rc != 0:
            raise RuntimeError(f"ray start {' '.join(args)} exited with {rc}: see {os.path.join(self.log_dir, log)}")
        return proc.pid  # the session (and process group) of every process it started

    def start_head(self) -> None:
        self.head_pgid = self._ray_start(
            ["--head", f"--port={self.port}", f"--num-cpus={self.cfg.workers}", f"--temp-dir={self.tmp}/ray",
             "--include-dashboard=false", f"--dashboard-port={_free_port()}",
             f"--ray-client-server-port={_free_port()}"], "ray-head.log")

    def join_node(self) -> None:
        with self.node_lock:
            if self.closed or self.node_pgid is not None:
                return
            self.node_pgid = self._ray_start([f"--address={self.address}", f"--num-cpus={self.cfg.node_cpus}"],
                                             "ray-node.log")

    def leave_node(self) -> int | None:
        """The second node leaves: its raylet, agents and the worker processes on it are stopped. Returns how many
        run workers were on it (None: no node was there)."""
        with self.node_lock:
            if self.node_pgid is None:
                return None
            procs = _group(self.node_pgid)
            self.node_pgid = None
        workers = sum(_title(p).startswith(WORKER_TITLE) for p in procs)
        _stop(procs)
        return workers

    def workers(self) -> list[psutil.Process]:
        """The run's worker actor processes that are up, on either node: not those still starting (`__init__`) or
        loading their partitions (`load`). A worker killed before it joins is only restarted, and the run waits
        for its workers to join before it trains: a worker takes longer to start (torch imported, data loaded) than
        the mean gap between kills, so killing starting workers would stop the run from ever training."""
        starting = {f"{WORKER_TITLE}.__init__", f"{WORKER_TITLE}.load"}
        return [p for p in _marked(self.tmp) if _title(p).split(" ")[0].startswith(WORKER_TITLE)
                and _title(p).split(" ")[0] not in starting]

    def env_for_driver(self) -> dict[str, str]:
        return {**self.env, "RAY_ADDRESS": self.address}

    def close(self) -> None:
        """Stop everything the soak started (drivers, the node, the head, stray raylets and workers). The temporary
        folder stays (Ray's logs are in it): `remove` removes it."""
        with self.node_lock:
            if self.closed:
                return
            self.closed = True
        self.leave_node()
        if self.head_pgid is not None:
            _stop(_group(self.head_pgid))
            self.head_pgid = None
        for _ in range(10):  # what outlived its group: a driver, a `ray start` in progress, re-parented workers
            left = _marked(self.tmp)
            if not left:
                break
            _stop(left, grace_s=2.0)

    def remove(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


# ---- the run's driver -----------------------------------------------------------------------------------------------
class DriverProcess:
    """The run's driver as a child process: started with `--driver`, resumed with `python -m framework resume`;
    `kill` SIGKILLs it (its process group)."""

    def __init__(self, cfg: Defaults, run: str, cluster: SoakCluster, log_dir: str) -> None:
        self.cfg, self.run, self.cluster, self.log_dir = cfg, run, cluster, log_dir
        self.proc: subprocess.Popen | None = None
        self.started = 0
        self.killed_by_us = False
        self.first_round = -2
        self.log = ""

    def _spawn(self, argv: list[str], name: str) -> None:
        self.log = os.path.join(self.log_dir, f"{self.started:02d}-{name}.log")
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=self.cluster.env_for_driver(),
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.started += 1
        self.killed_by_us = False
        self.first_round = _last_round(self.run)  # the last round committed before this driver started

    def start(self) -> None:
        self._spawn([os.path.abspath(__file__), "--driver", self.run, json.dumps(dataclasses.asdict(self.cfg))],
                    "driver")

    def resume(self) -> None:
        self._spawn(["-m", "framework", "resume", self.run, "--quiet"], "resume")

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def kill(self) -> None:
        self.killed_by_us = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)

    def tail(self, n: int = 15) -> str:
        with open(self.log) as f:
            return "".join(f.readlines()[-n:])


def _driver(storage: str, cfg_json: str) -> None:
    """The child process that drives the run; its functions are imported from `experiments.soak` (not `__main__`),
    so the run records names that `modelhopper resume` can import."""
    from experiments import soak as module

    module.selection(module.Defaults(**json.loads(cfg_json)), storage).run()


# ---- reading the run while it goes on ------------------------------------------------------------------------------
def _query(run: str, sql: str) -> list[tuple]:
    """A read-only look at run.db (no verification: the chaos only needs counts), [] before it exists."""
    path = os.path.join(run, CATALOG_FILE)
    if not os.path.exists(path):
        return []
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
        try:
            return db.execute(sql).fetchall()
        finally:
            db.close()
    except sqlite3.Error:
        return []


def _last_round(run: str) -> int:
    """The run's last committed round: -1 is the procedure's first decision, which resume cannot start from."""
    rows = _query(run, "SELECT MAX(round) FROM rounds")
    return int(rows[0][0]) if rows and rows[0][0] is not None else -2


# ---- commands -------------------------------------------------------------------------------------------------------
class Commander:
    """Sends commands through `framework.connect(run)` at exponential gaps, one at a time, and counts what came of
    them: applied, rejected by the driver (a legitimate answer: e.g. a config that finished meanwhile), or
    unanswered (the driver was down, killed and not yet resumed, or did not answer within a minute: a resume that
    is still starting its workers; such a command stays in the inbox and the driver applies it later)."""

    KINDS = ("stop", "resume", "clone", "add", "pause", "add_workers", "drain", "extend")

    def __init__(self, cfg: Defaults, run: str, rng: random.Random, cluster: SoakCluster, deadline: float) -> None:
        self.cfg, self.run, self.rng, self.cluster, self.deadline = cfg, run, rng, cluster, deadline
        self.counts = {k: {"sent": 0, "applied": 0, "rejected": 0, "unanswered": 0} for k in (*self.KINDS, "unpause")}
        self.sample_cap = cfg.configs
        self.person_configs = 0  # configs the soak's `add` and `clone` made
        self.added_workers: list[int] = []
        self.unanswered: list[str] = []  # why each command got no answer
        self.paused = False  # a pause may be in force (no unpause answered since): unpause, again after a resume
        self.over = threading.Event()  # the chaos is over
        self.halt = threading.Event()  # the soak is over
        self.thread = threading.Thread(target=self._loop, daemon=True, name="soak-commands")

    def _send(self, kind: str, call) -> CommandOutcome | None:
        self.counts[kind]["sent"] += 1
        try:
            outcome = call(framework.connect(self.run, source="soak"))
        except (NotRunningError, TimeoutError, FileNotFoundError) as e:
            self.counts[kind]["unanswered"] += 1
            self.unanswered.append(f"{time.strftime('%H:%M:%S')} {kind}: {type(e).__name__}: {e}")
            return None
        self.counts[kind]["applied" if outcome.applied else "rejected"] += 1
        return outcome

    def _configs(self) -> pd.DataFrame:
        rows = _query(self.run, "SELECT id, status, epochs, outcome FROM configs")
        return pd.DataFrame(rows, columns=["config_id", "status", "epochs", "outcome"])

    def _one(self) -> None:
        if self.paused:  # the last unpause did not reach the run
            if self._send("unpause", lambda h: h.unpause()) is not None:
                self.paused = False
            return
        configs = self._configs()
        if configs.empty:
            return
        active = configs[configs.status == "active"].config_id.tolist()
        stopped = configs[(configs.status == "stopped") & (configs.outcome == "stopped")].config_id.tolist()
        trained = configs[configs.epochs > 0].config_id.tolist()
        sampled = len(configs) - self.person_configs  # ASHA's own: those a person added do not count against it
        if time.time() < self.deadline and sampled >= self.sample_cap - 2 * self.cfg.workers:
            kind = "extend"  # ASHA would run out of configs before the duration is over
        else:
            kind = self.rng.choice([k for k in self.KINDS if k != "extend"])
        r = self.rng
        if kind == "stop" and active:
            self._send(kind, lambda h: h.stop(int(r.choice(active))))
        elif kind == "resume" and stopped:
            cid = int(r.choice(stopped))
            epochs = int(configs.set_index("config_id").epochs[cid]) + 1
            self._send(kind, lambda h: h.resume(cid, epochs=epochs))
        elif kind == "clone" and trained:
            outcome = self._send(kind, lambda h: h.clone(int(r.choice(trained)), warm=r.random() < 0.7,
                                                         epochs=r.randint(1, 2), lr=round(10 ** r.uniform(-3, -0.5), 5)))
            self.person_configs += bool(outcome and outcome.applied)
        elif kind == "add":
            config = {"hidden": r.choice([16, 32, 64]), "layers": r.choice([1, 2]),
                      "lr": round(10 ** r.uniform(-3, -0.5), 5), "batch_size": r.choice([32, 64]),
                      "optimizer": r.choice(["sgd", "adam"]), "device_s": self.cfg.device_s}
            outcome = self._send(kind, lambda h: h.add(config, epochs=r.randint(1, 2)))
            self.person_configs += bool(outcome and outcome.applied)
        elif kind == "pause":
            # paused until an unpause is answered: a pause with no answer may still be applied (from the inbox)
            self.paused = True
            self._send(kind, lambda h: h.pause())
            self.over.wait(r.uniform(0.5, 3.0))
            if self._send("unpause", lambda h: h.unpause()) is not None:
                self.paused = False
        elif kind == "add_workers" and self.cluster.node_pgid is not None and len(self.added_workers) < \
                self.cfg.node_cpus:
            outcome = self._send(kind, lambda h: h.add_workers(1))
            if outcome is not None and outcome.applied:
                self.added_workers += [int(w) for w in re.findall(r"\d+", outcome.outcome.split("[")[-1])]
        elif kind == "drain" and self.added_workers:
            worker = self.added_workers.pop(0)
            self._send(kind, lambda h: h.drain(worker))
        elif kind == "extend":
            outcome = self._send(kind, lambda h: h.extend(samples=4 * self.cfg.workers))
            if outcome is not None and outcome.applied:
                self.sample_cap += 4 * self.cfg.workers

    def _loop(self) -> None:
        while not self.over.wait(self.rng.expovariate(1.0 / self.cfg.command_every_s)):
            try:
                self._one()
            except Exception as e:  # noqa: BLE001 - a command that breaks the soak's own loop is a finding: print it
                print(f"  command failed in the soak: {e!r}", flush=True)
        while self.paused and not self.halt.wait(2.0):  # the chaos is over: a run left paused is unpaused
            if self._send("unpause", lambda h: h.unpause()) is not None:
                self.paused = False

    def end(self) -> None:
        """No more commands (returns at once; a run the last pause may have left paused is still unpaused)."""
        self.over.set()

    def stop(self) -> None:
        self.over.set()
        self.halt.set()
        self.thread.join(timeout=150)


class NodeCycler:
    """The second node joins, stays `node_up_s` seconds on average, leaves, stays away `node_down_s`, and again;
    it leaves for good once `end` is called."""

    def __init__(self, cfg: Defaults, cluster: SoakCluster, rng: random.Random) -> None:
        self.cfg, self.cluster, self.rng = cfg, cluster, rng
        self.joins = self.leaves = self.workers_taken = 0
        self.errors: list[str] = []
        self.over = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="soak-node")

    def _leave(self) -> None:
        taken = self.cluster.leave_node()
        if taken is not None:
            self.workers_taken += taken
            self.leaves += 1

    def _loop(self) -> None:
        while not self.over.wait(max(2.0, self.rng.expovariate(1.0 / self.cfg.node_down_s))):
            try:
                self.cluster.join_node()
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                self.errors.append(str(e))
                continue
            self.joins += 1
            self.over.wait(max(5.0, self.rng.expovariate(1.0 / self.cfg.node_up_s)))
            self._leave()

    def end(self) -> None:
        """The node leaves for good (returns at once)."""
        self.over.set()

    def stop(self) -> None:
        self.over.set()
        self.thread.join(timeout=240)
        self._leave()  # (it was joining when told to stop)


# ---- the audit ------------------------------------------------------------------------------------------------------
def audit_log(units: pd.DataFrame, configs: pd.DataFrame, partitions: int) -> dict[str, int]:
    """The soak's figures of a run from its schedule log (`units`: one row per unit attempt, as
    `SQLiteCatalog.units(status=None)` reads it: seq, config_id, epoch, partition, kind, status) and its configs
    (`SQLiteCatalog.configs()`: config_id, status, epochs committed, outcome). Pure: numbers in, numbers out.

    A first try that is not `done` (interrupted, lost, failed) was re-run when a `done` row of the same unit comes
    after it; else it is dropped with its config when the config failed or stopped (by a person) before finishing
    that epoch (the run never trains that epoch again: nothing counts from it), and lost otherwise. A committed epoch
    of a config that did not fail that misses a partition's training unit is lost too (a gap)."""
    key = ["config_id", "epoch", "partition", "kind"]
    done = units[units.status == "done"]
    train = done[done.kind == "train"]
    last_done = done.groupby(key).seq.max().to_dict()
    status = configs.set_index("config_id")
    rerun = dropped = lost_tries = 0
    for row in units[units.status != "done"].itertuples():
        again = last_done.get((row.config_id, row.epoch, row.partition, row.kind))
        c = status.loc[row.config_id]
        if again is not None and again > row.seq:
            rerun += 1
        elif c.status == "failed" or row.epoch >= c.epochs:
            dropped += 1
        else:
            lost_tries += 1
    trained = train.groupby(["config_id", "epoch"]).partition.agg(set).to_dict()
    gaps = sum(len(set(range(partitions)) - trained.get((c.config_id, e), set()))
               for c in configs.itertuples() if c.status != "failed" for e in range(int(c.epochs)))
    # a config's status as users read it (`framework.result.OUTCOMES`): a stopped one says why it stopped
    outcomes = [s if s in ("failed", "active") else (o or "completed") for s, o in zip(configs.status, configs.outcome)]
    counts = pd.Series(outcomes, dtype=object).value_counts()
    return {
        "units_run": len(done), "units_run_train": len(train), "attempts": len(units), "units_rerun": rerun,
        "units_dropped_with_config": dropped, "units_lost": lost_tries + gaps, "units_lost_tries": lost_tries,
        "units_lost_gaps": gaps, "units_twice": int(train.duplicated(key).sum()),
        "units_twice_eval": int(done[done.kind == "eval"].duplicated(key).sum()), "configs": len(configs),
        **{f"configs_{k}": int(counts.get(k, 0)) for k in ("completed", "pruned", "stopped", "failed", "active")},
    }


def audit(run: str) -> dict[str, int]:
    """`audit_log` of the run in directory `run`, with its worker failures and resumes as its events count them."""
    catalog = SQLiteCatalog(os.path.join(run, CATALOG_FILE), readonly=True)
    try:
        units, configs, events, meta = catalog.units(status=None), catalog.configs(), catalog.events(), catalog.meta()
    finally:
        catalog.close()
    kinds = events.kind.value_counts()
    return {**audit_log(units, configs, int(meta["dataset"]["num_partitions"])),
            "worker_failed_events": int(kinds.get("worker_failed", 0)), "resumed_events": int(kinds.get("resumed", 0))}


def completeness(result: framework.Result) -> tuple[int | None, str]:
    """`Result.check_completeness()` (the completeness proof of every config, checked), where this version has
    it: (problems, a line to print); (None, why not) where it does not."""
    check = getattr(result, "check_completeness", None)
    if check is None:
        # TODO(issue 33): call Result.check_completeness() here once it exists
        return None, "not checked: this version's Result has no check_completeness()"
    problems = check()
    if problems.empty:
        return 0, "holds"
    return len(problems), f"{len(problems)} problem(s): " + "; ".join(
        f"config {r.config_id} epoch {r.epoch} {r.rule}: {r.detail}" for r in problems.head(5).itertuples())


# ---- the soak -------------------------------------------------------------------------------------------------------
def check(cfg: Defaults) -> None:
    for name in ("minutes", "kill_every_s", "node_up_s", "node_down_s", "command_every_s", "grace_minutes"):
        if not getattr(cfg, name) > 0:
            raise ValueError(f"`--{name.replace('_', '-')}` is {getattr(cfg, name)!r}, but must be > 0")
    for name, least in (("workers", 1), ("replicas", 1), ("configs", 1), ("max_epochs", 1), ("eta", 2),
                        ("driver_kills", 0), ("node_cpus", 1)):
        if getattr(cfg, name) < least:
            raise ValueError(f"`--{name.replace('_', '-')}` is {getattr(cfg, name)!r}, but must be >= {least}")
    if cfg.replicas > cfg.workers:
        raise ValueError(f"`--replicas` is {cfg.replicas}, but must be <= `--workers` ({cfg.workers})")


def soak(cfg: Defaults, out: str, cluster: SoakCluster) -> dict:
    """The chaos for `cfg.minutes`, then the run finishes undisturbed (but for driver kills still due); returns
    what was done to it (the audit reads the run afterwards)."""
    rng = random.Random(cfg.seed)
    run = os.path.join(out, "run")
    duration = 60.0 * cfg.minutes
    t0 = time.time()
    chaos_until, give_up = t0 + duration, t0 + duration + 60.0 * cfg.grace_minutes
    # one driver kill in each of `driver_kills` equal slices of the duration, at a random point of it
    driver_kills_at = [t0 + duration * (k + rng.uniform(0.1, 0.9)) / cfg.driver_kills for k in range(cfg.driver_kills)]
    cluster.start_head()
    print(f"Ray head at {cluster.address} (Ray's folder {cluster.tmp}); the run is {run}", flush=True)
    driver = DriverProcess(cfg, run, cluster, cluster.log_dir)
    driver.start()
    commander = Commander(cfg, run, random.Random(rng.random()), cluster, chaos_until)
    nodes = NodeCycler(cfg, cluster, random.Random(rng.random()))
    commander.thread.start()
    nodes.thread.start()
    chaos = True
    worker_kills = worker_skips = driver_kills = resumes = 0
    unexpected: list[str] = []
    next_worker_kill = t0 + rng.expovariate(1.0 / cfg.kill_every_s)
    last_report = t0

    def say(line: str) -> None:
        print(f"  t={time.time() - t0:6.1f}s  {line}", flush=True)

    try:
        while True:
            now = time.time()
            rc = driver.poll()
            if rc is not None:
                if rc == 0 and not driver.killed_by_us:
                    break  # the run finished
                if not driver.killed_by_us:
                    unexpected.append(f"driver {driver.log} exited with {rc}:\n{driver.tail()}")
                    say(unexpected[-1])
                    if len(unexpected) > 3:
                        break
                driver.resume()
                resumes += 1
                continue
            if chaos and now >= chaos_until:
                chaos = False
                say("the duration is over: no more worker kills, commands or node changes; the run finishes")
                commander.end()
                nodes.end()
            if chaos and now >= next_worker_kill:
                victims = cluster.workers()
                if victims:
                    with contextlib.suppress(psutil.Error):
                        rng.choice(victims).kill()
                        worker_kills += 1
                else:
                    worker_skips += 1
                next_worker_kill = now + rng.expovariate(1.0 / cfg.kill_every_s)
            # a run that committed no round cannot be resumed, and a driver that committed none is still starting
            # (or rebuilding): it is killed once it committed a round of its own
            if driver_kills_at and now >= driver_kills_at[0] and _last_round(run) > max(driver.first_round, -1):
                driver.kill()
                driver_kills += 1
                driver_kills_at.pop(0)
                say(f"driver SIGKILLed ({driver_kills} of {cfg.driver_kills}); resuming")
                continue
            if now - last_report >= 30.0:
                last_report = now
                done = _query(run, "SELECT COUNT(*) FROM units WHERE status = 'done'")
                n = _query(run, "SELECT COUNT(*) FROM configs")
                say(f"units done {done[0][0] if done else 0}, configs {n[0][0] if n else 0}, worker kills "
                    f"{worker_kills}, driver kills {driver_kills}, node joins {nodes.joins}, commands "
                    f"{sum(c['sent'] for c in commander.counts.values())}")
            if now > give_up:
                unexpected.append(f"the run did not finish within {cfg.grace_minutes:g} minutes after the duration")
                driver.kill()
                break
            time.sleep(0.05)
    finally:
        commander.stop()
        nodes.stop()
    return {"wall_s": time.time() - t0, "worker_kills": worker_kills, "worker_kill_skips": worker_skips,
            "driver_kills": driver_kills, "resumes": resumes, "node_joins": nodes.joins, "node_leaves": nodes.leaves,
            "node_workers_taken": nodes.workers_taken, "node_errors": nodes.errors, "commands": commander.counts,
            "unanswered": commander.unanswered,
            "unexpected": unexpected}


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cfg, out = parse_config(Defaults, argv, __doc__, QUICK, check=check)
    run = os.path.join(out, "run")
    cluster = SoakCluster(cfg, os.path.join(out, "logs"))
    atexit.register(cluster.close)  # whatever happens below: nothing of the soak's Ray outlives it
    previous = signal.signal(signal.SIGTERM, _interrupted)
    try:
        chaos = soak(cfg, out, cluster)
    except BaseException:
        print(f"The soak stopped early; Ray's logs are in {cluster.tmp}, the drivers' in {cluster.log_dir}",
              flush=True)
        raise
    finally:
        cluster.close()  # the audit reads only files
        signal.signal(signal.SIGTERM, previous)
    figures = audit(run)
    result = framework.Result.open(run)
    problems, proof = completeness(result)
    commands = chaos.pop("commands")
    unanswered = chaos.pop("unanswered")
    sent = {k: sum(c[k] for c in commands.values()) for k in ("sent", "applied", "rejected", "unanswered")}
    passed = (figures["units_lost"] == 0 and figures["units_twice"] == 0 and result.verified and not problems
              and figures["configs_active"] == 0 and not chaos["unexpected"]
              and chaos["driver_kills"] >= cfg.driver_kills and chaos["wall_s"] >= 60.0 * cfg.minutes)
    f = figures
    table = [
        ("wall time, minutes", f"{chaos['wall_s'] / 60:.1f}", f">= {cfg.minutes:g}"),
        ("units run (done)", f"{f['units_run']} ({f['units_run_train']} train)", ""),
        ("first tries re-run", f["units_rerun"], ""),
        ("tries dropped with their config", f["units_dropped_with_config"], ""),
        ("units lost", f"{f['units_lost']} ({f['units_lost_tries']} tries, {f['units_lost_gaps']} gaps)", "0"),
        ("units counted twice (train)", f["units_twice"], "0"),
        ("eval units counted twice", f["units_twice_eval"], ""),
        ("configs finished", f"{f['configs'] - f['configs_active']} of {f['configs']}", "all"),
        ("  completed / pruned / stopped / failed",
         f"{f['configs_completed']} / {f['configs_pruned']} / {f['configs_stopped']} / {f['configs_failed']}", ""),
        ("driver kills / resumes", f"{chaos['driver_kills']} / {chaos['resumes']} ({f['resumed_events']} logged)",
         f">= {cfg.driver_kills}"),
        ("worker kills (logged failures)", f"{chaos['worker_kills']} ({f['worker_failed_events']})",
         f"~{60 * cfg.minutes / cfg.kill_every_s:.0f}"),
        ("kill times with no worker up", chaos["worker_kill_skips"], ""),
        ("node joins / leaves (workers on it)",
         f"{chaos['node_joins']} / {chaos['node_leaves']} ({chaos['node_workers_taken']})", ""),
        ("commands: applied / rejected / unanswered",
         f"{sent['applied']} / {sent['rejected']} / {sent['unanswered']}", ""),
        ("catalog verifies", "yes" if result.verified else "no", "yes"),
        ("completeness proof", proof if problems is None else ("holds" if not problems else f"{problems} problems"),
         "holds"),
    ]
    print(f"\nSoak of {cfg.minutes:g} minutes: {cfg.workers} workers (replicas {cfg.replicas}), ASHA over "
          f"{cfg.configs} configs (max {cfg.max_epochs} epochs, eta {cfg.eta}); a worker SIGKILLed every "
          f"{cfg.kill_every_s:g} s on average, {cfg.driver_kills} driver SIGKILLs, a {cfg.node_cpus}-CPU node "
          "joining and leaving, commands throughout")
    print(pd.DataFrame(table, columns=["figure", "value", "must be"]).to_string(index=False))
    print("commands sent (applied): " + ", ".join(f"{k} {c['sent']} ({c['applied']})" for k, c in commands.items()))
    if problems:
        print(f"completeness: {proof}")
    for line in result.unverified[:5] + chaos["unexpected"] + chaos["node_errors"]:
        print(f"UNEXPECTED: {line}")
    print(f"\nsoak {'PASSED' if passed else 'FAILED'}")
    row = {**figures, **chaos, **{f"commands_{k}": v for k, v in sent.items()}, "verified": result.verified,
           "completeness_problems": problems, "passed": passed}
    df = pd.DataFrame([row])
    df.to_json(os.path.join(out, "soak.json"), orient="records", indent=1, default_handler=str)
    with open(os.path.join(out, "commands.json"), "w") as fh:
        json.dump({"counts": commands, "unanswered": unanswered}, fh, indent=1)
    record_run(out, cfg, passed=passed, run=run)
    if passed:
        cluster.remove()
    else:
        print(f"Ray's logs are kept in {cluster.tmp}, the drivers' are in {cluster.log_dir}")
    return df


def _interrupted(signum: int, frame: object) -> None:
    """SIGTERM (a `timeout`, a CI cancel) unwinds like Ctrl-C, so the soak's `finally` stops its processes."""
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--driver":
        _driver(*sys.argv[2:4])
    else:
        try:
            sys.exit(0 if bool(main().passed.iloc[0]) else 1)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: everything it started is stopped by now
            sys.exit(130)
