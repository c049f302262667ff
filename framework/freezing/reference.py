"""The reference model: an int8 snapshot of the training model run asynchronously on CPU (Egeria section 4.1).

`make_reference` copies the training model to CPU and quantizes it with PyTorch's dynamic int8 quantization
(``torch.ao.quantization.quantize_dynamic``), which covers ``nn.Linear`` and recurrent layers (transformers, MLPs,
LSTMs). Layers that dynamic quantization does not support stay float32 in the copy: for a CNN the convolutions and
batch norms are a float32 snapshot and only the Linear head is int8 (Egeria uses static quantization for CNNs; that
needs calibration data and QuantStub placement and is left out here). If quantization fails or is unavailable the
whole reference falls back to a float32 snapshot, and `ReferenceInfo.quantized` says so.

`AsyncReferenceRunner` runs the reference forward pass on a background thread with its own (small) number of torch
intra-op threads, compares the activation of one layer module with the training activation of the same mini-batch
(SP loss), and hands back readings that the training loop polls. Submitting never waits: if the runner is still
busy, the request is dropped and counted, so results may lag or skip evaluations but training never blocks on it.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .plasticity import sp_loss

QUANTIZE_MODES = ("dynamic", "float")


@dataclass(frozen=True)
class ReferenceInfo:
    """What `make_reference` produced: the mode asked for, whether any layer is int8, and the layers left float."""

    mode: str
    quantized: bool
    float_modules: tuple[str, ...]
    seconds: float


def _is_quantized(module: nn.Module) -> bool:
    return "quantized" in type(module).__module__


def make_reference(model: nn.Module, mode: str = "dynamic") -> tuple[nn.Module, ReferenceInfo]:
    """An eval-mode CPU snapshot of `model`, int8 dynamically quantized where supported (see module docstring).

    The caller must pass a model whose weights will not change while this runs (e.g. a deep copy).
    """
    if mode not in QUANTIZE_MODES:
        raise ValueError(f"`mode` is {mode!r}, but must be one of {QUANTIZE_MODES}")
    start = time.perf_counter()
    snapshot = copy.deepcopy(model).to("cpu").eval()
    for p in snapshot.parameters():
        p.requires_grad_(False)
        p.grad = None
    reference, quantized = snapshot, False
    if mode == "dynamic":
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                from torch.ao.quantization import quantize_dynamic

                candidate = quantize_dynamic(snapshot, {nn.Linear, nn.LSTM, nn.GRU}, dtype=torch.qint8)
            quantized = any(_is_quantized(m) for m in candidate.modules())
            reference = candidate
        except Exception:  # noqa: BLE001 - any failure of the (deprecated) quantization path falls back to float
            reference, quantized = snapshot, False
    float_modules = tuple(
        name
        for name, m in reference.named_modules()
        if any(True for _ in m.parameters(recurse=False)) and not _is_quantized(m)
    )
    return reference, ReferenceInfo(mode, quantized, float_modules, time.perf_counter() - start)


class _StopForward(Exception):
    """Raised by a hook to cut a forward pass short once the wanted activation exists."""


def capture_activation(model: nn.Module, member: str, inputs: torch.Tensor) -> torch.Tensor:
    """Run `model` on `inputs` until `member` has produced its output, and return that output (detached).

    The rest of the forward pass is skipped (a hook raises once the activation is there), so monitoring a front
    module costs only the forward pass up to it.
    """
    captured: list[torch.Tensor] = []

    def hook(_module: nn.Module, _inputs: object, output: torch.Tensor) -> None:
        captured.append(output.detach())
        raise _StopForward

    handle = model.get_submodule(member).register_forward_hook(hook)
    try:
        with torch.no_grad():
            model(inputs)
    except _StopForward:
        pass
    finally:
        handle.remove()
    if not captured:
        raise RuntimeError(f"module {member!r} did not run in the forward pass of {type(model).__name__}")
    out = captured[0]
    return out.dequantize() if out.is_quantized else out


@dataclass(frozen=True)
class PlasticityReading:
    """One finished evaluation: SP loss of `module` for the batch submitted at training `step`."""

    step: int
    module: int
    value: float
    reference_seconds: float


@dataclass
class _Request:
    step: int
    module: int
    member: str
    inputs: torch.Tensor
    train_activation: torch.Tensor


class AsyncReferenceRunner:
    """A background thread that owns the reference model and turns submitted batches into plasticity readings.

    Args:
        num_threads: torch intra-op threads of the background thread (per-thread in PyTorch, so the training
            thread keeps its own setting).
        build: called on the background thread with a model snapshot; returns the reference model. Defaults to
            ``make_reference(snapshot, "dynamic")[0]``.
    """

    def __init__(self, num_threads: int = 1, build: Callable[[nn.Module], nn.Module] | None = None) -> None:
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"`num_threads` is {num_threads!r}, but must be an int >= 1")
        self.num_threads = num_threads
        self._build = build or (lambda snapshot: make_reference(snapshot, "dynamic")[0])
        self._inbox: queue.Queue[tuple[str, object] | None] = queue.Queue()
        self._outbox: queue.Queue[PlasticityReading] = queue.Queue()
        self._busy = threading.Event()
        self._reference: nn.Module | None = None
        self.dropped = 0  # requests refused because the runner was busy
        self.busy_seconds = 0.0  # wall time the background thread spent on forward passes and rebuilds
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="egeria-reference", daemon=True)
        self._thread.start()

    @property
    def ready(self) -> bool:
        """True once a reference model has been built (a rebuild keeps the old one usable until it is done)."""
        return self._reference is not None

    def refresh(self, snapshot: nn.Module) -> bool:
        """Queue a rebuild of the reference from `snapshot` (a copy the caller will not modify); never waits.

        Returns False (and drops the request) while the runner is busy.
        """
        if self._busy.is_set():
            self.dropped += 1
            return False
        self._busy.set()
        self._inbox.put(("build", snapshot))
        return True

    def submit(self, step: int, module: int, member: str, inputs: torch.Tensor, train_activation: torch.Tensor) -> bool:
        """Queue one plasticity evaluation; never waits. Returns False (dropped) if busy or no reference yet.

        `inputs` and `train_activation` must not be modified afterwards (pass detached copies).
        """
        if self._busy.is_set() or self._reference is None:
            self.dropped += 1
            return False
        self._busy.set()
        self._inbox.put(("eval", _Request(step, module, member, inputs, train_activation)))
        return True

    def poll(self) -> list[PlasticityReading]:
        """Every reading finished since the last poll, oldest first; never waits."""
        out = []
        while True:
            try:
                out.append(self._outbox.get_nowait())
            except queue.Empty:
                return out

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until the background thread is idle (for tests and shutdown only); True if it is."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._busy.is_set():
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        return True

    def close(self) -> None:
        """Stop the background thread after the work in hand."""
        if self._thread.is_alive():
            self._inbox.put(None)
            self._thread.join()

    def _loop(self) -> None:
        torch.set_num_threads(self.num_threads)
        while True:
            item = self._inbox.get()
            if item is None:
                return
            kind, payload = item
            start = time.perf_counter()
            try:
                if kind == "build":
                    self._reference = self._build(payload)  # type: ignore[arg-type]
                else:
                    req: _Request = payload  # type: ignore[assignment]
                    ref = capture_activation(self._reference, req.member, req.inputs)  # type: ignore[arg-type]
                    value = float(sp_loss(req.train_activation, ref))
                    elapsed = time.perf_counter() - start
                    self._outbox.put(PlasticityReading(req.step, req.module, value, elapsed))
            except Exception as exc:  # noqa: BLE001 - surfaced to the training loop through `error`
                self.error = exc
            finally:
                self.busy_seconds += time.perf_counter() - start
                self._busy.clear()
