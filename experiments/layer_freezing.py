"""Egeria layer freezing at laptop scale: time to accuracy with and without freezing, over several seeds.

A CNN is trained from scratch on CPU on sklearn's digits (upscaled, each image with its own fixed random shift and
pixel noise, so the task is not solved in two epochs), with SGD and a step LR decay. Per seed, a baseline arm (plain
training) and Egeria arms (`FreezingController`: plasticity against an int8 reference, freezing, unfreezing on the
LR drop, activation caching) share the initial weights and the per-epoch data order, and run interleaved epoch by
epoch, so background load on a shared machine hits all arms alike. Only training is timed (validation is excluded).

Models (`--model`): ``cnn``, a small ResNet-like ``nn.Sequential`` on 16x16 images (the default, feasible for many
seeds on 2 cores), or ``resnet18``, torchvision's ResNet-18 layout (`framework.architectures.resnet18`) on 32x32
3-channel images, cut for caching at its top-level children and residual blocks (about 4.5x slower per step: 5
seeds plus tuning take about half an hour on 2 cores, so run it with ``--quick`` or fewer seeds and say so).

Protocol (nothing is tuned on the reported seeds, and nothing that is chosen depends on the machine's load):
- the Egeria arms read plasticity with a fixed lag (`FreezingController`'s ``reading_lag``, `--reading-lag`; by
  default the evaluation interval T, the most time the reference gets without a lag before its next request would
  be dropped): a reading is used exactly that many steps after its batch, the training loop waiting for it if
  needed, so the steps at which layers freeze and unfreeze depend only on the data, the weights and the seed;
- compute is counted, not timed: `torch.utils.flop_counter.FlopCounterMode` measures once per seed, on one batch,
  the forward FLOPs of each layer module and the backward FLOPs of the model with its first k modules frozen (no
  gradient flows below the first trainable module). Per step, a frozen module costs its forward pass, or nothing
  when the batch's activations come from the cache (a batch does once all its sample ids were stored since the
  prefix froze, which each sample's first pass does; the cut check on a new prefix's first batch is counted as two
  forward passes of the model). `train_gflops` is the cumulative count per epoch, beside `train_seconds`; the
  reference model's work is counted apart (`reference_gflops`: per applied reading, a batch's float-equivalent
  forward FLOPs up to the read module, its rebuilds left out; and its thread's CPU seconds);
- the knobs are set by rule (`framework.freezing.scaled_defaults`: the evaluation interval is the paper's 300 of
  78k steps scaled to this run's length, W a count of evaluations) except W, which is chosen among `--windows` on
  the *tuning seeds*: the best median *compute* speedup at the middle target among the W whose median accuracy
  change is at least -0.5 points (the W that wall time would choose is printed beside it);
- the targets are fractions (`--target-fractions`) of the baseline's median final accuracy on the tuning seeds;
- the reported seeds (`--seeds`, at least 5 by default) run with that W and those targets; the split is recorded.

Prints, per reported seed and as median [min, max]: speedup to each target in compute (``compute@x``: 1 - the Egeria
arm's training GFLOPs when it first reached x / the baseline's) and in training wall time (``wall@x``), final
accuracy change, total training GFLOPs against the baseline's, total CPU time of all threads of the Egeria arm
against the baseline's (`time.process_time`, reference thread included), the reference thread's CPU time, and the
training thread's wall-time overhead (reference work and waits for readings). Goals: median speedup >= 20 % at W
chosen on other seeds, median accuracy change within 0.5 points; a miss is printed as MISSED. Two runs of the same
revision, one of them beside a CPU hog, choose the same W and give the same compute speedups; their wall speedups
differ by what the load does to the arms.

Results go to `--out` (or a new folder under the storage root). Every finished seed is saved there
(`seeds/<kind>_<seed>.json`); rerunning with the same `--out` and the same settings skips the seeds already done, so
a long run can be done in pieces. `--table FILE` also writes the reported part of what it prints (the reference line
and the reported seeds' section) to FILE, with its provenance (revision, machine, versions, date, command line).

    python experiments/layer_freezing.py --out DIR            # 2 tuning + 5 reported seeds, ~9 min on 2 cores
    python experiments/layer_freezing.py --quick              # about a minute
    python experiments/layer_freezing.py --model resnet18 --quick

Pure PyTorch: nothing here needs Ray (the freezing package is algorithm code and never imports it).
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pandas as pd  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from experiments._common import parse_config, provenance, record_run  # noqa: E402
from framework.architectures import resnet18  # noqa: E402
from framework.freezing import (  # noqa: E402
    FreezingController,
    LayerModule,
    make_reference,
    scaled_defaults,
    split_by_size,
    time_forward,
)

MODELS = ("cnn", "resnet18")


@dataclass
class Config:
    model: str = "cnn"  # "cnn" (small ResNet-like Sequential, 16x16) or "resnet18" (torchvision layout, 32x32 RGB)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)  # reported seeds: data, shifts, noise, weights, batch order
    tuning_seeds: tuple[int, ...] = (100, 101)  # seeds that choose W and the targets; never reported
    windows: tuple[int, ...] = (3, 5, 10)  # Egeria's W candidates, chosen on the tuning seeds (10 is the paper's)
    eval_interval: int = 0  # Egeria's T in steps; 0: the paper's 300 of 78k steps scaled to this run (scaled_defaults)
    reference_refresh: int = 10  # evaluations between reference rebuilds
    reading_lag: int = 0  # steps from a read batch to the use of its plasticity reading; 0: the evaluation interval T
    target_fractions: tuple[float, ...] = (0.95, 0.98, 0.99)  # targets: these x the tuning baselines' final accuracy
    image_size: int = 0  # pixels a side; 0: 16 for cnn, 32 for resnet18
    noise: float = 1.0  # std of the fixed per-image Gaussian pixel noise (images are standardised)
    max_shift: int = 3  # fixed per-image random shift, in pixels (at 16 pixels; scaled with the image)
    width: int = 16  # cnn: channels of the first stage, doubled per stage
    num_modules: int = 5  # layer modules for split_by_size (cnn)
    epochs: int = 24  # epochs of each arm
    batch_size: int = 64  # mini-batch size of every arm
    lr: float = 0.1  # SGD's initial learning rate
    momentum: float = 0.9  # SGD's (Nesterov) momentum
    weight_decay: float = 5e-4  # SGD's weight decay
    lr_milestones: tuple[int, ...] = (12, 20)  # epochs at which the LR is multiplied by `lr_gamma`
    lr_gamma: float = 0.1  # the LR's factor at each milestone
    reference_mode: str = "static"  # the reference model: "static" (int8 convs too), "dynamic" (int8 Linear) or "float"
    torch_threads: int = 1  # threads of the training loop (torch.set_num_threads)
    reference_threads: int = 1  # threads of the reference model's background thread
    table: str = ""  # also write the reported results as printed, with their provenance, to this file ("": don't)
    quick: bool = False


QUICK = {"epochs": 6, "lr_milestones": (4, 6), "seeds": (0,), "tuning_seeds": (100,), "windows": (10,)}


def check(cfg: Config) -> None:
    if cfg.model not in MODELS:
        raise ValueError(f"`--model` is {cfg.model!r}, but must be one of {MODELS}")
    if set(cfg.seeds) & set(cfg.tuning_seeds):
        raise ValueError(f"`--seeds` {cfg.seeds} and `--tuning-seeds` {cfg.tuning_seeds} overlap, but must not")
    if not cfg.seeds or not cfg.tuning_seeds or not cfg.windows or not cfg.target_fractions:
        raise ValueError("`--seeds`, `--tuning-seeds`, `--windows` and `--target-fractions` must not be empty")
    if any(not 0 < f <= 1 for f in cfg.target_fractions):
        raise ValueError(f"`--target-fractions` is {cfg.target_fractions}, but each must be in (0, 1]")
    if cfg.reading_lag < 0:
        raise ValueError(f"`--reading-lag` is {cfg.reading_lag}, but must be >= 0 (0: the evaluation interval)")
    if cfg.table and (os.path.isdir(cfg.table) or not os.path.isdir(os.path.dirname(os.path.abspath(cfg.table)))):
        raise ValueError(f"`--table` is {cfg.table!r}, but must be a file in an existing folder")


# --------------------------------------------------------------------------------------------------------- data
def load_digits_tensors(cfg: Config, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    size = cfg.image_size or (32 if cfg.model == "resnet18" else 16)
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8)
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)  # (N, 1, S, S)
    x = (x - x.mean()) / x.std()
    # a harder, still fixed data set: every image gets its own random shift and pixel noise, drawn once
    g = torch.Generator().manual_seed(seed + 2)
    shift = round(cfg.max_shift * size / 16)
    if shift > 0:
        shifts = torch.randint(-shift, shift + 1, (len(x), 2), generator=g)
        x = torch.stack(
            [torch.roll(img, (int(dy), int(dx)), dims=(1, 2)) for img, (dy, dx) in zip(x, shifts, strict=True)]
        )
    x = x + cfg.noise * torch.randn(x.shape, generator=g)
    if cfg.model == "resnet18":
        x = x.expand(-1, 3, -1, -1)  # (N, 3, S, S): the RGB stem
    y = torch.tensor(digits.target, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_val = len(y) // 5
    val, train = perm[:n_val], perm[n_val:]
    return x[train].contiguous(), y[train], x[val].contiguous(), y[val]


# -------------------------------------------------------------------------------------------------------- model
class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


def resnet(width: int, num_classes: int = 10) -> nn.Sequential:
    """A small ResNet as an nn.Sequential of stem, three stages of two basic blocks, and head."""
    w = width
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(1, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU()),  # stem (B, w, H, W)
        nn.Sequential(BasicBlock(w, w, 1), BasicBlock(w, w, 1)),  # (B, w, H, W)
        nn.Sequential(BasicBlock(w, 2 * w, 2), BasicBlock(2 * w, 2 * w, 1)),  # (B, 2w, H/2, W/2)
        nn.Sequential(BasicBlock(2 * w, 4 * w, 2), BasicBlock(4 * w, 4 * w, 1)),  # (B, 4w, H/4, W/4)
        nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * w, num_classes)),  # (B, classes)
    )


def build_model(cfg: Config) -> nn.Module:
    if cfg.model == "resnet18":
        return resnet18(10, prefer_torchvision=False)  # the same layout as torchvision's, which may not import here
    return resnet(cfg.width)


# ------------------------------------------------------------------------------------------------------ compute
@dataclass(frozen=True)
class LayerFlops:
    """FLOPs per sample of one training step, by layer module, as `FlopCounterMode` counts them (convolutions and
    matrix products; element-wise work such as batch norm is not counted)."""

    forward: tuple[float, ...]  # forward FLOPs of each layer module
    other_forward: float  # forward FLOPs outside every member (code between the members)
    backward: tuple[float, ...]  # backward FLOPs of the model with its first k modules frozen, k = 0..len(forward)

    @property
    def forward_total(self) -> float:
        return sum(self.forward) + self.other_forward

    def step(self, frozen: int, cached: bool) -> float:
        """One step with the first `frozen` modules frozen, their output read from the cache or not."""
        skipped = sum(self.forward[:frozen]) if cached else 0.0
        return self.forward_total - skipped + self.backward[frozen]

    def reading(self, module: int) -> float:
        """The reference's forward pass up to and including `module` (float-equivalent FLOPs)."""
        return sum(self.forward[: module + 1])


def measure_layer_flops(model: nn.Module, modules: list[LayerModule], x: torch.Tensor, y: torch.Tensor) -> LayerFlops:
    """Count one training step of `model` on the batch (`x`, `y`) with `FlopCounterMode`, per sample."""
    model = copy.deepcopy(model).train()
    rows = len(x)
    with FlopCounterMode(display=False) as counter:
        model(x)
    by_module = counter.get_flop_counts()  # keys: the root's class name, then the module's qualified name
    root = type(model).__name__
    forward = tuple(
        float(sum(sum(by_module.get(f"{root}.{m}", {}).values()) for m in lm.members)) / rows for lm in modules
    )
    other = counter.get_total_flops() / rows - sum(forward)
    assert other >= -1e-6 * max(1.0, sum(forward)), "members counted more than the whole model: members must not nest"
    backward = []
    for k in range(len(modules) + 1):
        trial = copy.deepcopy(model)
        for lm in modules[:k]:  # as the controller freezes: no gradients, eval mode
            for m in lm.members:
                trial.get_submodule(m).requires_grad_(False).eval()
        loss = F.cross_entropy(trial(x), y)
        if not loss.requires_grad:  # every module frozen: no backward pass at all
            backward.append(0.0)
            continue
        with FlopCounterMode(display=False) as counter:
            loss.backward()
        backward.append(counter.get_total_flops() / rows)
    return LayerFlops(forward, max(other, 0.0), tuple(backward))


class ComputeCounter:
    """Cumulative training FLOPs of one arm, step by step, from `LayerFlops` and what the controller skips.

    Mirrors the controller's cache (with a `cache_dir`): a frozen prefix of a generation has its own store, a batch
    is stored when it runs the frozen modules and runs from the store once every one of its ids is there, and the
    first batch of a new prefix is checked (`PrefixCut.verify`: two forward passes of the model) and stored.
    """

    def __init__(self, flops: LayerFlops, cached: bool) -> None:
        self.flops = flops
        self.cached = cached
        self.total = 0.0
        self._stored: dict[tuple[int, int], set[int]] = {}  # (generation, frozen) -> sample ids in that store

    def step(self, ids: torch.Tensor, frozen: int = 0, generation: int = 0) -> None:
        rows = len(ids)
        if frozen == 0 or not self.cached:
            self.total += rows * self.flops.step(frozen, cached=False)
            return
        stored = self._stored.setdefault((generation, frozen), set())
        batch = ids.tolist()
        if not stored:
            self.total += rows * 2 * self.flops.forward_total  # the cut check, which stores this batch
            stored.update(batch)
        hit = stored.issuperset(batch)
        stored.update(batch)
        self.total += rows * self.flops.step(frozen, cached=hit)


# -------------------------------------------------------------------------------------------------------- arms
@dataclass
class Arm:
    name: str
    window: int  # 0 for the baseline
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    compute: ComputeCounter
    controller: FreezingController | None = None
    train_seconds: float = 0.0  # wall time of the training loop (training thread)
    thread_cpu_seconds: float = 0.0  # CPU time of the training thread
    cpu_seconds: float = 0.0  # CPU time of every thread of the process while this arm trained (reference included)
    steps: int = 0


def make_arm(
    name: str, window: int, model: nn.Module, cfg: Config, flops: LayerFlops, controller: FreezingController | None
) -> Arm:
    optimizer = torch.optim.SGD(
        model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, nesterov=True
    )
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, list(cfg.lr_milestones), cfg.lr_gamma)
    cached = controller is not None and controller.cache_dir is not None
    return Arm(name, window, model, optimizer, scheduler, ComputeCounter(flops, cached), controller)


def train_epoch(arm: Arm, x: torch.Tensor, y: torch.Tensor, batches: list[torch.Tensor]) -> float:
    """One timed pass over `batches` (sample-id tensors); returns the mean training loss."""
    arm.model.train()
    if arm.controller is not None:
        arm.controller.set_upcoming(batches)
    losses = []
    cpu0, thread0, wall0 = time.process_time(), time.thread_time(), time.perf_counter()
    for ids in batches:
        xb, yb = x[ids], y[ids]
        if arm.controller is not None:
            arm.compute.step(ids, arm.controller.frozen, arm.controller.policy.generation)
        else:
            arm.compute.step(ids)
        logits = arm.controller.forward(xb, ids) if arm.controller is not None else arm.model(xb)
        loss = F.cross_entropy(logits, yb)
        arm.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        arm.optimizer.step()
        if arm.controller is not None:
            arm.controller.after_step(loss, arm.optimizer.param_groups[0]["lr"])
        losses.append(loss.detach())
        arm.steps += 1
    arm.train_seconds += time.perf_counter() - wall0
    arm.thread_cpu_seconds += time.thread_time() - thread0
    if arm.controller is not None:
        arm.controller.wait_reference()  # untimed, but its CPU time is this arm's, not the next arm's
    arm.cpu_seconds += time.process_time() - cpu0
    arm.scheduler.step()
    return float(torch.stack(losses).mean())


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    return float((model(x).argmax(1) == y).float().mean())


def total_steps(cfg: Config, n_train: int) -> int:
    return cfg.epochs * math.ceil(n_train / cfg.batch_size)


def run_seed(cfg: Config, seed: int, windows: tuple[int, ...], cache_root: Path) -> dict:
    """Baseline and one Egeria arm per W on one seed, interleaved epoch by epoch; JSON-able curves and stats."""
    torch.manual_seed(seed)
    x, y, x_val, y_val = load_digits_tensors(cfg, seed)
    steps = total_steps(cfg, len(y))
    initial = build_model(cfg)
    modules = split_by_size(initial, cfg.num_modules)
    flops = measure_layer_flops(initial, modules, x[: cfg.batch_size], y[: cfg.batch_size])
    arms = [make_arm("baseline", 0, copy.deepcopy(initial), cfg, flops, None)]
    for w in windows:
        defaults = scaled_defaults(steps, window=w, reference_refresh=cfg.reference_refresh)
        model = copy.deepcopy(initial)
        interval = cfg.eval_interval or defaults.eval_interval
        controller = FreezingController(
            model,
            modules,
            eval_interval=interval,
            policy=defaults.policy(),
            reference_refresh=defaults.reference_refresh,
            reference_mode=cfg.reference_mode,
            reference_threads=cfg.reference_threads,
            cache_dir=cache_root / f"seed{seed}_w{w}",
            reading_lag=cfg.reading_lag or interval,
        )
        arms.append(make_arm(f"egeria_w{w}", w, model, cfg, flops, controller))
    rows = []
    order = torch.Generator().manual_seed(seed + 1)
    for epoch in range(cfg.epochs):
        perm = torch.randperm(len(y), generator=order)
        batches = list(perm.split(cfg.batch_size))  # the same data order for every arm
        for arm in arms:  # interleaved: background load on a shared machine hits every arm alike
            loss = train_epoch(arm, x, y, batches)
            stats = arm.controller.reference_stats() if arm.controller is not None else {}
            rows.append(
                {
                    "seed": seed,
                    "arm": arm.name,
                    "window": arm.window,
                    "epoch": epoch + 1,
                    "train_seconds": arm.train_seconds,
                    "train_gflops": arm.compute.total / 1e9,
                    "reference_gflops": reference_gflops(arm, cfg.batch_size),
                    "thread_cpu_seconds": arm.thread_cpu_seconds,
                    "cpu_seconds": arm.cpu_seconds,
                    "reference_cpu_seconds": stats.get("cpu_seconds", 0.0),
                    "overhead_seconds": stats.get("overhead_seconds", 0.0),
                    "steps": arm.steps,
                    "train_loss": loss,
                    "val_accuracy": accuracy(arm.model, x_val, y_val),
                    "frozen_modules": arm.controller.frozen if arm.controller is not None else 0,
                    "lr": arm.optimizer.param_groups[0]["lr"],
                }
            )
        print(
            f"seed {seed:3d} epoch {epoch + 1:3d}  "
            + " | ".join(
                f"{r['arm']} acc {r['val_accuracy']:.3f} t {r['train_seconds']:5.1f}s f{r['frozen_modules']}"
                for r in rows[-len(arms) :]
            ),
            flush=True,
        )
    extra = {}
    for arm in arms[1:]:
        stats = arm.controller.reference_stats()
        info = stats.pop("info")
        arm.controller.close()
        extra[arm.name] = {
            **stats,
            "events": arm.controller.events,
            "eval_interval": arm.controller.eval_interval,
            "reading_lag": arm.controller.reading_lag,
            "modules": [lm.name for lm in arm.controller.modules],
            "int8_modules": [list(m) for m in info.int8_modules] if info else [],
            "fallbacks": [list(f) for f in info.fallbacks] if info else [],
        }
    return {"seed": seed, "total_steps": steps, "curves": rows, "arms": extra, "layer_flops": asdict(flops)}


def reference_gflops(arm: Arm, batch_size: int) -> float:
    """GFLOPs (float-equivalent) of the readings the arm's reference model has made so far, a full batch each."""
    if arm.controller is None:
        return 0.0
    return sum(batch_size * arm.compute.flops.reading(module) for _, module, _ in arm.controller.readings) / 1e9


def load_or_run(cfg: Config, run_dir: Path, kind: str, seed: int, windows: tuple[int, ...], cache_root: Path) -> dict:
    """A seed's results from `run_dir/seeds` when an identical run saved them, else run it now and save them."""
    path = run_dir / "seeds" / f"{kind}_{seed}.json"
    settings = {k: v for k, v in asdict(cfg).items() if k not in ("seeds", "tuning_seeds", "windows", "quick", "table")}
    settings["windows"] = list(windows)
    if path.exists():
        saved = json.loads(path.read_text())
        if saved.get("settings") == json.loads(json.dumps(settings)):
            print(f"{kind} seed {seed}: loaded from {path}", flush=True)
            return saved
    result = {"settings": settings, **run_seed(cfg, seed, windows, cache_root)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, default=float))
    tmp.replace(path)
    return result


# ----------------------------------------------------------------------------------------------------- figures
def time_to(curve: pd.DataFrame, target: float, column: str = "train_seconds") -> float:
    """Cumulative `column` at the end of the first epoch whose validation accuracy reaches `target` (inf: never)."""
    hit = curve[curve.val_accuracy >= target]
    return float(hit[column].iloc[0]) if len(hit) else math.inf


def speedup(base: pd.DataFrame, egeria: pd.DataFrame, target: float, column: str) -> float:
    """1 - Egeria's `column` at `target` / the baseline's; -inf: only the baseline reached the target (a miss, never
    dropped); +inf: only Egeria; NaN: neither."""
    tb, te = time_to(base, target, column), time_to(egeria, target, column)
    if math.isinf(tb):
        return float("nan") if math.isinf(te) else math.inf
    return 1 - te / tb


def seed_figures(result: dict, targets: list[float]) -> list[dict]:
    """One row per Egeria arm of a seed: speedups per target (compute, wall), accuracy change, CPU and overhead."""
    curves = pd.DataFrame(result["curves"])
    base = curves[curves.arm == "baseline"]
    out = []
    for name, stats in result["arms"].items():
        eg = curves[curves.arm == name]
        row = {"seed": result["seed"], "W": int(eg.window.iloc[0]), "T": stats["eval_interval"]}
        for t in targets:
            row[f"compute@{t:.3f}"] = speedup(base, eg, t, "train_gflops")
        for t in targets:
            row[f"wall@{t:.3f}"] = speedup(base, eg, t, "train_seconds")
        row["acc_change_pts"] = 100 * (eg.val_accuracy.iloc[-1] - base.val_accuracy.iloc[-1])
        row["gflops_vs_baseline"] = eg.train_gflops.iloc[-1] / base.train_gflops.iloc[-1] - 1
        row["cpu_vs_baseline"] = eg.cpu_seconds.iloc[-1] / base.cpu_seconds.iloc[-1] - 1
        row["ref_cpu_share"] = eg.reference_cpu_seconds.iloc[-1] / eg.cpu_seconds.iloc[-1]
        row["train_thread_overhead"] = eg.overhead_seconds.iloc[-1] / eg.train_seconds.iloc[-1]
        row["step_time_vs_baseline"] = (eg.train_seconds.iloc[-1] / eg.steps.iloc[-1]) / (
            base.train_seconds.iloc[-1] / base.steps.iloc[-1]
        ) - 1
        freezes = [e for e in stats["events"] if e[1] == "freeze"]
        boot = [e[0] for e in stats["events"] if e[1] == "bootstrap_end"]
        row["bootstrap_end_step"] = boot[0] if boot else -1
        row["first_freeze_step"] = freezes[0][0] if freezes else -1
        row["freezes"] = len(freezes)
        out.append(row)
    return out


def choose_window(tuning: pd.DataFrame, key: str) -> int:
    """W with the best median speedup at `key` among those whose median accuracy change is >= -0.5 points."""
    by_w = tuning.groupby("W").agg(speedup=(key, "median"), change=("acc_change_pts", "median")).reset_index()
    ok = by_w[by_w.change >= -0.5]
    pool = ok if len(ok) else by_w.assign(speedup=by_w.change)
    best = pool.speedup.max()
    return int(pool[pool.speedup >= best - 1e-12].W.max())  # ties: the larger W (the paper's side)


def reference_speed(cfg: Config) -> dict:
    """Float32 vs int8 (static) reference forward time of the chosen model on one batch, one thread."""
    torch.manual_seed(0)
    x, _, _, _ = load_digits_tensors(cfg, 0)
    model = build_model(cfg).eval()
    batch = x[: cfg.batch_size]
    reference, info = make_reference(model, "static", calibration=batch)
    t_float, t_int8 = time_forward(model, batch, repeats=7), time_forward(reference, batch, repeats=7)
    return {
        "float_ms": 1000 * t_float,
        "int8_ms": 1000 * t_int8,
        "ratio": t_float / t_int8,
        "build_seconds": info.seconds,
        "int8_modules": [list(m) for m in info.int8_modules],
        "fallbacks": [list(f) for f in info.fallbacks],
    }


def summarise(table: pd.DataFrame) -> pd.DataFrame:
    numeric = table.drop(columns=["seed"])
    return pd.DataFrame({"median": numeric.median(), "min": numeric.min(), "max": numeric.max()}).T


def fmt(table: pd.DataFrame) -> str:
    shown = table.copy()
    for c in shown.columns:
        if c.startswith(("compute@", "wall@")) or c in (
            "gflops_vs_baseline",
            "cpu_vs_baseline",
            "ref_cpu_share",
            "train_thread_overhead",
            "step_time_vs_baseline",
        ):
            shown[c] = shown[c].map(
                lambda v: (
                    "neither"
                    if v != v
                    else "not reached"
                    if v == -math.inf
                    else "only Egeria"
                    if v == math.inf
                    else f"{100 * v:+.1f}%"
                )
            )
        elif c == "acc_change_pts":
            shown[c] = shown[c].map(lambda v: f"{v:+.2f}")
    return shown.to_string()


def main(argv: list[str] | None = None) -> None:
    cfg, out = parse_config(Config, argv, __doc__, QUICK, check)
    run_dir = Path(out)
    torch.set_num_threads(cfg.torch_threads)
    cache_root = Path(tempfile.mkdtemp(prefix="egeria-cache-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` or a job stop: still remove the cache
    try:
        run(cfg, out, run_dir, cache_root)
    finally:
        shutil.rmtree(cache_root, ignore_errors=True)


def run(cfg: Config, out: str, run_dir: Path, cache_root: Path) -> None:
    start = time.perf_counter()
    report: list[str] = []  # what `--table` keeps: the reference line and the reported seeds' section

    def say(text: str) -> None:
        print(text, flush=True)
        report.append(text)

    speed = reference_speed(cfg)
    say(
        f"reference ({cfg.model}, batch {cfg.batch_size}, 1 thread): float32 {speed['float_ms']:.1f} ms, "
        f"int8 {speed['int8_ms']:.1f} ms, float/int8 {speed['ratio']:.2f}x; int8 modules "
        f"{[m for m, _ in speed['int8_modules']]}; float32 modules {speed['fallbacks'] or 'none'}"
    )

    tuning = [load_or_run(cfg, run_dir, "tuning", s, cfg.windows, cache_root) for s in cfg.tuning_seeds]
    finals = [
        round(float(pd.DataFrame(r["curves"]).query("arm == 'baseline'").val_accuracy.iloc[-1]), 4) for r in tuning
    ]
    targets = [round(f * float(pd.Series(finals).median()), 4) for f in cfg.target_fractions]
    tuning_table = pd.DataFrame([row for r in tuning for row in seed_figures(r, targets)])
    middle = f"{targets[len(targets) // 2]:.3f}"
    window = choose_window(tuning_table, f"compute@{middle}")
    window_by_wall = choose_window(tuning_table, f"wall@{middle}")
    print(
        f"\ntuning seeds {list(cfg.tuning_seeds)} (not reported): baseline final accuracy {finals}; "
        f"targets {targets}; W chosen by median compute@{middle}: {window} (by wall@{middle} it would be "
        f"{window_by_wall})"
    )
    print(fmt(tuning_table.set_index(["seed", "W"])))

    reported = [load_or_run(cfg, run_dir, "reported", s, (window,), cache_root) for s in cfg.seeds]
    table = pd.DataFrame([row for r in reported for row in seed_figures(r, targets)])
    how = "chosen on tuning seeds" if len(cfg.windows) > 1 else "the only candidate in --windows, not tuned"
    summary = summarise(table)
    lag = reported[0]["arms"][f"egeria_w{window}"]["reading_lag"]
    say(
        f"\nreported seeds {list(cfg.seeds)}: model {cfg.model}, W = {window} ({how}), "
        f"T = {int(table['T'].iloc[0])} steps of {reported[0]['total_steps']}, reading lag {lag} steps, "
        f"targets {targets}"
    )
    say(fmt(table.set_index("seed")))
    say(fmt(summary))
    say("")
    goals = {}
    for t in targets:
        shown, verdicts = [], []
        for kind in ("compute", "wall"):
            column = table[f"{kind}@{t:.3f}"]
            med = float(column.median())  # a seed where only the baseline got there counts as -inf, not as absent
            goals[f"{kind}@{t:.3f}"] = med
            shown.append(f"{kind} " + ("not reached" if med == -math.inf else f"{100 * med:+6.1f} %"))
            verdicts.append(f"{kind} {'met' if med >= 0.2 else 'MISSED'}")
        say(
            f"median speedup to {t:.3f}: {', '.join(shown)}  (goal >= 20 %: {', '.join(verdicts)}; only the "
            f"baseline reached it on {int((column == -math.inf).sum())} of {len(column)} seeds (counted as misses), "
            f"neither arm on {int(column.isna().sum())} (left out))"
        )
    change = float(table.acc_change_pts.median())
    say(
        f"median final accuracy change: {change:+.2f} pts (goal within 0.5: {'met' if abs(change) <= 0.5 else 'MISSED'})"
    )
    say(
        f"training GFLOPs vs baseline median {100 * table.gflops_vs_baseline.median():+.1f} %; reference GFLOPs "
        f"(readings, float-equivalent) median {median_reference_share(reported, window):.1f} % of the arm's training "
        f"GFLOPs"
    )
    say(
        f"reference CPU (its thread) median {100 * table.ref_cpu_share.median():.1f} % of the Egeria arm's CPU; "
        f"total CPU of all threads vs baseline median {100 * table.cpu_vs_baseline.median():+.1f} %; "
        f"training-thread wall overhead median {100 * table.train_thread_overhead.median():.2f} %"
    )
    elapsed = time.perf_counter() - start
    say(f"wall time of this call: {elapsed:.0f} s")
    if cfg.table:
        Path(cfg.table).write_text("\n".join([*report, "", provenance(), ""]))

    curves = pd.DataFrame([row for r in [*tuning, *reported] for row in r["curves"]])
    curves["split"] = curves.seed.map(lambda s: "tuning" if s in cfg.tuning_seeds else "reported")
    curves.to_csv(run_dir / "curves.csv", index=False)
    tuning_table.to_csv(run_dir / "tuning.csv", index=False)
    table.to_csv(run_dir / "reported.csv", index=False)
    figures = {
        "split": {"tuning_seeds": list(cfg.tuning_seeds), "reported_seeds": list(cfg.seeds)},
        "window_candidates": list(cfg.windows),
        "window_chosen": window,
        "window_by_wall": window_by_wall,
        "choice_key": f"compute@{middle}",
        "targets": targets,
        "tuning_baseline_final_accuracy": finals,
        "reference_speed": speed,
        "goals": {**goals, "median_acc_change_pts": change},
        "summary": json.loads(summary.to_json()),
        "arms": {
            f"{kind}_{r['seed']}": r["arms"] for kind, rs in (("tuning", tuning), ("reported", reported)) for r in rs
        },
    }
    (run_dir / "figures.json").write_text(json.dumps(figures, indent=1, default=float))
    record_run(out, cfg, split=figures["split"], window_chosen=window, targets=targets)


def median_reference_share(results: list[dict], window: int) -> float:
    """Median over seeds of the reference's GFLOPs as a percentage of the W arm's training GFLOPs, at the end."""
    shares = []
    for r in results:
        curves = pd.DataFrame(r["curves"])
        last = curves[curves.arm == f"egeria_w{window}"].iloc[-1]
        shares.append(100 * last.reference_gflops / last.train_gflops)
    return float(pd.Series(shares).median())


if __name__ == "__main__":
    main()
