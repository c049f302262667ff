"""Latency of a command from another process to its effect in a running selection (`framework.connect`).

A real run (Ray workers whose units sleep `unit_s`) goes on in this process's driver while a second process sends
`commands` commands through the run's inbox, one at a time, cycling through `pause`, `unpause`, `stop_config` (a
config of the run), `resume_config` (the same config), `add_config` and `clone_config` (warm, from the config just
resumed). For each it measures:

    applied_s    from the request written to the driver's `command` event (the driver's clock: when it applied it)
    answered_s   from the request written to the sender reading the outcome back from run.db (what a caller waits)

and prints the median and the maximum of each, per command and over all. A pause is applied while units run; an
unpause, sent as soon as the pause is answered, while the last of them finish. The target: applied at the next unit
boundary, under 1 s (the loop looks at its inbox at least every `framework.driver.loop.COMMAND_WAIT_S` = 0.25 s while
it waits for units).

    python experiments/command_latency.py --quick
    python experiments/command_latency.py --commands 100
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

import automl  # noqa: E402
import framework  # noqa: E402
from experiments._common import parse_config, record_run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Defaults:
    commands: int = 102  # commands sent (17 of each of the six kinds)
    workers: int = 2  # workers of the run (one partition each)
    unit_s: float = 0.2  # seconds each training unit sleeps
    seed: int = 0  # seeds the run


QUICK = dict(commands=12)


class UntilFile(automl.Procedure):
    """Trains `configs` epoch after epoch until the file `stop_file` exists, then stops them all."""

    def __init__(self, configs: list[dict], stop_file: str) -> None:
        self.configs, self.stop_file = configs, stop_file

    def step(self, states):
        if not states:
            return automl.Decision(add=list(self.configs))
        active = [s.id for s in states if s.status == automl.ACTIVE]
        return automl.Decision(stop=active if os.path.exists(self.stop_file) else [])


def model_fn(config: dict):
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.0)


def train_fn(model, optimizer, data, config):
    time.sleep(config["unit_s"])
    return {"loss": 1.0}


def eval_fn(model, data, config):
    return {"loss": 1.0}


SENDER = """
import json, sys, time
import framework
handle = framework.connect(sys.argv[1])
n, unit_s = int(sys.argv[3]), float(sys.argv[4])
rows, added = [], []
for i in range(int(sys.argv[2])):
    cid = (i // 6) % n  # one of the run's own configs
    name, args = [("pause", {}), ("unpause", {}), ("stop_config", {"config_id": cid}),
                  ("resume_config", {"config_id": cid, "epochs": 10**6}),
                  ("add_config", {"config": {"unit_s": unit_s, "i": 1000 + i}, "epochs": 2}),
                  ("clone_config", {"config_id": cid, "overrides": {"i": 2000 + i}, "epochs": 2})][i % 6]
    t0 = time.time()
    outcome = handle.send(name, timeout=60, **args)
    rows.append({"i": i, "name": name, "sent": t0, "answered": time.time(), "applied": outcome.applied,
                 "outcome": outcome.outcome})
for cid in range(n):  # the configs resumed by a person train until a person stops them (not measured)
    handle.send("stop_config", timeout=60, config_id=cid)
print(json.dumps(rows))
"""


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cfg, out = parse_config(Defaults, argv, __doc__, QUICK)
    x = np.zeros((cfg.workers * 8, 4), dtype=np.float32)
    ds = framework.PartitionedDataset.from_arrays(x, np.zeros(len(x), dtype=np.int64), num_partitions=cfg.workers,
                                                  seed=cfg.seed)
    configs = [{"unit_s": cfg.unit_s, "i": i} for i in range(2 * cfg.workers)]
    path, stop_file = os.path.join(out, "run"), os.path.join(out, "stop")
    sel = framework.ModelSelection(model_fn, train_fn, eval_fn, ds, UntilFile(configs, stop_file),
                                   num_workers=cfg.workers, storage_path=path, progress=False, metric="valid_loss",
                                   mode="min", checkpoint="off", seed=cfg.seed)
    done: dict = {}
    runner = threading.Thread(target=lambda: done.setdefault("result", sel.run()), daemon=True)
    runner.start()
    while not sel.rounds_completed:
        time.sleep(0.1)
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", SENDER, path, str(cfg.commands), str(len(configs)), str(cfg.unit_s)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"the sender failed:\n{proc.stderr[-2000:]}")
    sent = pd.DataFrame(json.loads(proc.stdout.strip().splitlines()[-1]))
    open(stop_file, "w").close()  # the run ends after the epoch it is in
    runner.join(timeout=300)
    result = done["result"]
    events = result.events[result.events.kind == "command"]
    applied_at = [json.loads(d) for d in events.detail]
    sent["applied_at"] = list(events.time)[: len(sent)]
    assert [a["name"] for a in applied_at][: len(sent)] == sent.name.tolist()
    if not sent.applied.all():
        raise RuntimeError(f"commands were rejected:\n{sent[~sent.applied].to_string()}")
    sent["applied_s"] = sent.applied_at - sent.sent
    sent["answered_s"] = sent.answered - sent.sent
    table = sent.groupby("name")[["applied_s", "answered_s"]].agg(["median", "max"])
    table.loc["all"] = sent[["applied_s", "answered_s"]].agg(["median", "max"]).T.stack()
    sent.to_csv(os.path.join(out, "command_latency.csv"), index=False)
    print(f"{len(sent)} commands from another process through the inbox ({cfg.workers} workers, {cfg.unit_s:g} s "
          "units); seconds:")
    print(table.to_string(float_format=lambda v: f"{v:.3f}"))
    record_run(out, cfg)
    return sent


if __name__ == "__main__":
    main()
