"""Fused packs: what training k configs at once as one fused pack (`framework.engine.packs.FusedPack`) buys against
training them one after another (`framework.engine.steps.StepLoop`), per model and pack size, side by side.

For each model and pack size k, k configs of one architecture (different learning rates) train one pass over the
same rows, three ways, in one process: one after another (the engine's step loop, member by member: what a pack runs
as today); as a pack on the generic path (the step under `torch.func.vmap`, the model a `functional_call` of each
member's slice of the stacked parameters); and as a pack as it runs by default (the fused path where the model
allows: a fused copy of the model on the members' folded batch, else the generic path). Each way is timed over
`--passes` passes after a warm-up pass, rotating which goes first. It prints a markdown table:

    alone_s          seconds of one pass of the k configs one after another
    generic_s        seconds of one pack pass on the generic path
    fused_s          seconds of one pack pass as it runs by default (on `path`)
    path             the path the default pack took: fused or generic
    speedup          alone_s / fused_s: samples/s per config of the pack against one config at a time
    generic_speedup  alone_s / generic_s
    state_mb         the pack's stacked parameters and optimizer state
    peak_mb          the device's peak memory during the passes (CUDA only)
    why_generic      why the default pack went generic, where the pack says (`FusedPack.why_generic`), else empty
    error            each way that raised, as `way: ExceptionType: first line of its message` (its times are nan)

A cell (a model and pack size) or one of its ways that raises does not end the run: its error goes in its row and the
next cells run. Each row is printed, and the CSV rewritten, as soon as its cell finishes, so a run that is killed
keeps the rows done so far.

Models (small on purpose: what model selection is full of, bound by per-step overhead on a CPU):

    mlp        `mlp_model_fn`: 64 -> `--width` -> 10, SGD with momentum
    cnn        two 3x3 convolutions (16, 32 channels) on 1x8x8 inputs, global average pooling, a linear head; Adam
    transformer  one `nn.TransformerEncoderLayer` (d_model 32, 4 heads, no dropout) over 8 tokens, mean-pooled; Adam

    python experiments/fused_packs.py --quick
    python experiments/fused_packs.py --device cuda --packs 1 2 4 8 16

The MLP and the CNN take the fused path; the transformer (`nn.MultiheadAttention`) the generic one. This measures the
mechanism only; `experiments/packed_grid.py` measures whole runs with `ModelSelection(pack=...)`.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pandas as pd  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from experiments._common import markdown, parse_config, record_run  # noqa: E402
from framework.engine.packs import FusedPack  # noqa: E402
from framework.engine.steps import StepLoop  # noqa: E402
from framework.examples import classifier_step_fn, mlp_model_fn  # noqa: E402

MODELS = ("mlp", "cnn", "transformer")
WAYS = ("alone", "generic", "fused")
COLUMNS = ("model", "pack", "alone_s", "generic_s", "fused_s", "path", "speedup", "generic_speedup", "state_mb",
           "peak_mb", "why_generic", "error")


@dataclass(frozen=True)
class Defaults:
    models: tuple[str, ...] = MODELS  # which models (mlp, cnn, transformer)
    packs: tuple[int, ...] = (1, 2, 4, 8, 16)  # pack sizes k
    width: int = 32  # the MLP's hidden width
    rows: int = 2048  # rows per pass
    batch_size: int = 32  # rows per step
    passes: int = 5  # timed passes per way (after one warm-up pass)
    threads: int = 1  # torch threads (one per worker, as a MOP worker on a core)
    device: str = "cpu"  # cpu or cuda
    seed: int = 0  # seed of the data and the models


QUICK = {"models": ("mlp",), "packs": (1, 4), "rows": 256, "passes": 1}


class _Cnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1),
                                  nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (B, 64): an 8x8 image, flattened
        return self.body(x.view(-1, 1, 8, 8))


class _Transformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 32)
        self.layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (B, 64): 8 tokens of 8 features
        return self.head(self.layer(self.embed(x.view(-1, 8, 8))).mean(1))


def build(model: str, width: int, lr: float) -> tuple[nn.Module, torch.optim.Optimizer]:
    if model == "mlp":
        return mlp_model_fn({"in_features": 64, "hidden": width, "classes": 10, "lr": lr})
    net = _Cnn() if model == "cnn" else _Transformer()
    return net, torch.optim.Adam(net.parameters(), lr=lr / 10)


def check(cfg: Defaults) -> None:
    if not cfg.models or any(m not in MODELS for m in cfg.models):
        raise ValueError(f"`--models` is {cfg.models}, but each must be one of {list(MODELS)}")
    if not cfg.packs or any(k < 1 for k in cfg.packs):
        raise ValueError(f"`--packs` is {cfg.packs}, but each must be >= 1")
    if not 1 <= cfg.batch_size <= cfg.rows:
        raise ValueError(f"`--batch-size` is {cfg.batch_size}, but must be in 1..--rows ({cfg.rows})")
    if cfg.device not in ("cpu", "cuda") or (cfg.device == "cuda" and not torch.cuda.is_available()):
        raise ValueError(f"`--device` is {cfg.device!r}, but must be cpu, or cuda on a machine with a GPU")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def error_text(where: str, e: BaseException) -> str:
    """`where: ExceptionType: first line of the message` (a CUDA error's message runs to many lines)."""
    lines = str(e).strip().splitlines()
    return f"{where}: {type(e).__name__}" + (f": {lines[0]}" if lines else "")


def cell(cfg: Defaults, model: str, k: int, data: tuple[torch.Tensor, torch.Tensor]) -> dict:
    """One row: the k configs' pass timed each way. A way that raises (in its warm-up or a timed pass) is timed no
    more: its times are nan and its error is in the row's `error`; the other ways go on."""
    device = torch.device(cfg.device)
    config = {"batch_size": cfg.batch_size}
    members = []
    for i in range(k):
        torch.manual_seed(cfg.seed + i)
        net, opt = build(model, cfg.width, 0.01 * (i + 1))
        members.append((net.to(device), opt))  # (`to` moves the parameters the optimizer holds, as on a worker)
    loop, n = StepLoop(classifier_step_fn), len(data[0])
    orders = [torch.randperm(n) for _ in range(k)]

    def alone() -> None:
        for net, opt in members:
            loop.train(net, opt, data, config)

    default: dict[str, FusedPack] = {}  # the last pack that ran as it runs by default: its path and why

    def pack(generic: bool) -> None:
        fused = FusedPack([m for m, _ in members], [o for _, o in members], generic=generic)
        fused.train(classifier_step_fn, data, [config] * k, orders)
        fused.write_back()
        if not generic:
            default["pack"] = fused

    ways = {"alone": alone, "generic": lambda: pack(True), "fused": lambda: pack(False)}
    times: dict[str, list[float]] = {way: [] for way in ways}
    errors: dict[str, str] = {}

    def timed(way: str) -> float | None:
        """Seconds of one run of `way`; None when it raised (its error kept in `errors`)."""
        try:
            _sync(device)
            t0 = time.perf_counter()
            ways[way]()
            _sync(device)
            return time.perf_counter() - t0
        except Exception as e:  # one way's error is its result, not the run's end
            errors[way] = error_text(way, e)
            return None

    for way in WAYS:  # warm-up
        timed(way)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for p in range(cfg.passes):
        for way in WAYS[p % 3:] + WAYS[:p % 3]:
            if way not in errors:
                seconds = timed(way)
                if seconds is not None:
                    times[way].append(seconds)
    a, g, f = (sorted(times[way])[len(times[way]) // 2] if times[way] else float("nan") for way in WAYS)
    state = sum(p.numel() * p.element_size() for net, _ in members for p in net.parameters())
    state *= 3 if isinstance(members[0][1], torch.optim.Adam) else 2  # weights and the optimizer's state
    fused = default.get("pack")
    why = getattr(fused, "why_generic", None) if fused is not None and fused.path == "generic" else None
    return {"model": model, "pack": k, "alone_s": a, "generic_s": g, "fused_s": f,
            "path": fused.path if fused is not None else "", "speedup": a / f, "generic_speedup": a / g,
            "state_mb": state / 2**20,
            "peak_mb": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else float("nan"),
            "why_generic": why if isinstance(why, str) else "",
            "error": "; ".join(errors[way] for way in WAYS if way in errors)}


def failed_cell(model: str, k: int, e: BaseException) -> dict:
    """The row of a cell that raised outside its ways (building its members): nan times, its error."""
    return {**dict.fromkeys(COLUMNS, float("nan")), "model": model, "pack": k, "path": "", "why_generic": "",
            "error": error_text("cell", e)}


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cfg, out = parse_config(Defaults, argv, __doc__, QUICK, check)
    torch.set_num_threads(cfg.threads)
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.rows, 64, generator=g)
    data = (x.to(cfg.device), (x[:, :10].argmax(1)).to(cfg.device))
    where = torch.cuda.get_device_name() if cfg.device == "cuda" else f"{os.cpu_count()} CPU cores"
    print(f"\nfused pack vs one config at a time on {cfg.device} ({where}, {cfg.threads} torch thread(s)), "
          f"{cfg.rows} rows per pass, batch {cfg.batch_size}, median of {cfg.passes} passes:\n")
    table = pd.DataFrame(columns=list(COLUMNS))
    print("\n".join(markdown(table).splitlines()[:2]), flush=True)  # the header; each row as its cell finishes
    rows = []
    for m in cfg.models:
        for k in cfg.packs:
            try:
                row = cell(cfg, m, k, data)
            except Exception as e:  # a cell that raises is a row with its error; the next cells run
                row = failed_cell(m, k, e)
            rows.append(row)
            table = pd.DataFrame(rows, columns=list(COLUMNS))
            table.to_csv(os.path.join(out, "fused_packs.csv"), index=False)  # rewritten: a killed run keeps its rows
            print(markdown(table.tail(1)).splitlines()[-1], flush=True)
    record_run(out, cfg, torch=torch.__version__)
    return table


if __name__ == "__main__":
    main()
