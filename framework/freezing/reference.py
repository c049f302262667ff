"""The reference model: an int8 snapshot of the training model run asynchronously on CPU (Egeria section 4.1).

`make_reference` copies the training model to CPU and quantizes it to int8 with PyTorch's eager-mode
post-training quantization (``torch.ao.quantization``), module by module, so that the copy keeps the training
model's module names and the plasticity hook on a member's output works as on the training model:

- ``"static"`` (Egeria's choice for CNNs, plus its NLP choice for linear layers): every convolution is fused with
  the batch norm registered right after it in the same parent (the fused copy's output is checked against the
  unfused one on the calibration batch, else nothing is fused), wrapped in ``QuantStub -> conv -> DeQuantStub``,
  calibrated with min/max observers on one training batch and converted, so the convolution runs in int8
  (per-channel int8 weights, per-tensor uint8 activations); then every ``nn.Linear`` / LSTM / GRU is dynamically
  quantized (int8 weights, activations quantized on the fly).
- ``"dynamic"``: only the dynamic quantization of linear and recurrent layers (convolutions stay float32).
- ``"float"``: a float32 snapshot.

Modules with parameters that stay float32 (an unfused batch norm, layer norm, embeddings) are listed with the reason
in `ReferenceInfo.fallbacks`; `ReferenceInfo.int8_modules` names those that really compute in int8. FX graph mode
(``prepare_fx``) was tried and left out: its symbolic tracer patches ``nn.Module.__call__`` process-wide, which
breaks the training thread's forward passes while the background thread traces, and a rebuild took 1 s for a small
CNN. ``torch.ao.quantization`` is deprecated in favour of torchao (whose CPU int8 path covers linear layers only) but
imports and runs with torch 2.13 on CPU (backend ``x86``); on one thread an int8 ResNet-18 forward on 32x32 images
is about 3-5x faster than the float32 one (`time_forward`; ``experiments/layer_freezing.py`` prints the ratio).

`AsyncReferenceRunner` runs the reference forward pass on a background thread with its own (small) number of torch
intra-op threads, compares the activation of one layer module with the training activation of the same mini-batch
(SP loss), and hands back readings that the training loop polls. Submitting never waits: if the runner is still
busy, the request is dropped and counted, so results may lag or skip evaluations but training never blocks on it.
With ``queue=True`` a request is queued behind the work in hand instead (never dropped), and the thread does the
work in the order it was asked for, so each reading is taken against the reference of the latest build queued
before it, however fast the thread runs. It counts the CPU time of its thread (`cpu_seconds`), which is what the
reference costs the machine.
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

QUANTIZE_MODES = ("static", "dynamic", "float")
_CONV_BN = ((nn.Conv1d, nn.BatchNorm1d), (nn.Conv2d, nn.BatchNorm2d), (nn.Conv3d, nn.BatchNorm3d))


@dataclass(frozen=True)
class ReferenceInfo:
    """What `make_reference` produced.

    Attributes:
        mode: the mode asked for.
        quantized: whether any module computes in int8.
        int8_modules: modules with int8 computation, as ``(name, "static" | "dynamic")``; a name is the module's
            name in the training model (a fused convolution carries its batch norm).
        fallbacks: ``(name, reason)`` for every module with parameters left float32, and ``("*", reason)`` when a
            whole step fell back.
        seconds: wall time of the build.
    """

    mode: str
    quantized: bool
    int8_modules: tuple[tuple[str, str], ...]
    fallbacks: tuple[tuple[str, str], ...]
    seconds: float

    @property
    def float_modules(self) -> tuple[str, ...]:
        """Names of the modules with parameters that compute in float32."""
        return tuple(name for name, _ in self.fallbacks if name != "*")


def _is_quantized(module: nn.Module) -> bool:
    return "quantized" in type(module).__module__


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160] if text else ''}"


def _snapshot(model: nn.Module) -> nn.Module:
    snapshot = copy.deepcopy(model).to("cpu").eval()
    for p in snapshot.parameters():
        p.requires_grad_(False)
        p.grad = None
    return snapshot


def _fuse_conv_bn(model: nn.Module) -> list[str]:
    """Fuse each convolution with the batch norm registered right after it in the same parent; returns the bns."""
    from torch.ao.quantization import fuse_modules

    fused = []
    for parent_name, parent in list(model.named_modules()):
        kids = list(parent.named_children())
        groups = [
            [a, b]
            for (a, ma), (b, mb) in zip(kids, kids[1:], strict=False)
            if any(type(ma) is conv and type(mb) is bn for conv, bn in _CONV_BN)
        ]
        if groups:
            fuse_modules(parent, groups, inplace=True)
            fused.extend(f"{parent_name}.{b}" if parent_name else b for _, b in groups)
    return fused


def _static_convs(model: nn.Module, calibration: torch.Tensor) -> tuple[nn.Module, list[str], str | None]:
    """Convolutions of `model` (a snapshot) to static int8; returns the model, the int8 convs and a fusion note."""
    from torch.ao.quantization import (
        MinMaxObserver,
        QConfig,
        QuantWrapper,
        convert,
        default_per_channel_weight_observer,
    )
    from torch.ao.quantization import prepare as prepare_eager

    with torch.no_grad():
        expected = model(calibration)
        unfused = copy.deepcopy(model)
        fused_bns = _fuse_conv_bn(model)
        note = None
        if fused_bns and not _close(model(calibration), expected):
            model, fused_bns = unfused, []
            note = "conv+bn fusion by registration order changed the output (a bn is not applied right after its conv)"
        qconfig = QConfig(
            activation=MinMaxObserver.with_args(dtype=torch.quint8, reduce_range=True),
            weight=default_per_channel_weight_observer,
        )
        convs = [name for name, m in model.named_modules() if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d))]
        for name in convs:
            wrapper = QuantWrapper(model.get_submodule(name))
            wrapper.qconfig = qconfig
            model.set_submodule(name, wrapper)
        prepare_eager(model, inplace=True)
        model(calibration)  # observers see one real batch
        convert(model, inplace=True)
    return model, convs, note


def _close(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and torch.allclose(a, b, rtol=1e-3, atol=1e-4 * float(b.abs().max() + 1))
    return False


def make_reference(
    model: nn.Module, mode: str = "static", *, calibration: torch.Tensor | None = None, backend: str = "x86"
) -> tuple[nn.Module, ReferenceInfo]:
    """An eval-mode CPU snapshot of `model`, int8 where possible (see the module docstring).

    Args:
        model: a model whose weights will not change while this runs (e.g. a deep copy).
        mode: one of `QUANTIZE_MODES`.
        calibration: one input batch for ``model(calibration)``; without it ``"static"`` does what ``"dynamic"``
            does (recorded in `fallbacks`).
        backend: the quantized engine (``torch.backends.quantized.supported_engines``).
    """
    if mode not in QUANTIZE_MODES:
        raise ValueError(f"`mode` is {mode!r}, but must be one of {QUANTIZE_MODES}")
    start = time.perf_counter()
    reference = _snapshot(model)
    int8: dict[str, str] = {}
    notes: list[tuple[str, str]] = []
    fused: set[str] = set()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # torch.ao.quantization announces its deprecation on every call
        if mode == "static" and calibration is None:
            notes.append(("*", "static: no calibration batch, so convolutions stay float32"))
        elif mode == "static" and backend not in torch.backends.quantized.supported_engines:
            notes.append(("*", f"static: backend {backend!r} not in {torch.backends.quantized.supported_engines}"))
        elif mode == "static":
            if torch.backends.quantized.engine != backend:
                torch.backends.quantized.engine = backend
            try:
                candidate, convs, note = _static_convs(reference, calibration.to("cpu"))  # type: ignore[union-attr]
                reference = candidate
                int8.update({c: "static" for c in convs})
                fused = {n for n, m in reference.named_modules() if isinstance(m, nn.Identity)}
                if note:
                    notes.append(("*", note))
            except Exception as exc:  # noqa: BLE001 - any failure of the (deprecated) static path: keep float convs
                reference = _snapshot(model)
                notes.append(("*", f"static: {_first_line(exc)}; convolutions stay float32"))
        if mode in ("static", "dynamic"):
            try:
                from torch.ao.quantization import quantize_dynamic

                before = {n for n, m in reference.named_modules() if _is_quantized(m)}
                reference = quantize_dynamic(reference, {nn.Linear, nn.LSTM, nn.GRU}, dtype=torch.qint8)
                int8.update(
                    {
                        n: "dynamic"
                        for n, m in reference.named_modules()
                        if _is_quantized(m) and n not in before and not n.endswith("._packed_params")
                    }
                )
            except Exception as exc:  # noqa: BLE001
                notes.append(("*", f"dynamic: {_first_line(exc)}; linear layers stay float32"))
    fallbacks = list(notes)
    for name, m in reference.named_modules():
        if _is_quantized(m) or name in fused or not any(True for _ in m.parameters(recurse=False)):
            continue
        if mode == "float":
            reason = "float mode"
        elif isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            reason = "static int8 convolutions were not built (see '*')"
        elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)):
            reason = "batch norm not registered right after a convolution: not fused, float32"
        else:
            reason = f"{type(m).__name__}: no int8 kernel used for it, float32"
        fallbacks.append((name, reason))
    # names as in the training model: a QuantWrapper adds ".module" and a dynamic module keeps its name
    names = tuple((n.removesuffix(".module"), kind) for n, kind in int8.items())
    info = ReferenceInfo(mode, bool(names), names, tuple(fallbacks), time.perf_counter() - start)
    return reference, info


def time_forward(model: nn.Module, inputs: torch.Tensor, repeats: int = 5, threads: int = 1) -> float:
    """Median seconds of ``model(inputs)`` under ``torch.no_grad()`` with `threads` intra-op threads (one warm-up)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    times = []
    try:
        with torch.no_grad():
            model(inputs)
            for _ in range(repeats):
                start = time.perf_counter()
                model(inputs)
                times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(previous)
    return sorted(times)[len(times) // 2]


def _first_tensor(output: object) -> torch.Tensor:
    """A module's output tensor: the output itself, or the first item of a tuple/list (e.g. older HF layers)."""
    return output[0] if isinstance(output, (tuple, list)) else output  # type: ignore[return-value]


class _StopForward(Exception):
    """Raised by a hook to cut a forward pass short once the wanted activation exists."""


def capture_activation(model: nn.Module, member: str, inputs: torch.Tensor) -> torch.Tensor:
    """Run `model` on `inputs` until `member` has produced its output, and return that output (detached).

    The rest of the forward pass is skipped (a hook raises once the activation is there), so monitoring a front
    module costs only the forward pass up to it.
    """
    captured: list[torch.Tensor] = []

    def hook(_module: nn.Module, _inputs: object, output: object) -> None:
        captured.append(_first_tensor(output).detach())
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
        build: called on the background thread as ``build(snapshot, calibration)``; returns the reference model or
            ``(model, ReferenceInfo)``. Defaults to ``make_reference(snapshot, "static", calibration=calibration)``.
    """

    def __init__(
        self,
        num_threads: int = 1,
        build: Callable[[nn.Module, torch.Tensor | None], nn.Module | tuple[nn.Module, ReferenceInfo]] | None = None,
    ) -> None:
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"`num_threads` is {num_threads!r}, but must be an int >= 1")
        self.num_threads = num_threads
        self._build = build or (lambda snapshot, calibration: make_reference(snapshot, calibration=calibration))
        self._inbox: queue.Queue[tuple[str, object] | None] = queue.Queue()
        self._outbox: queue.Queue[PlasticityReading] = queue.Queue()
        self._lock = threading.Lock()
        self._finished = threading.Condition(self._lock)  # notified as each request is done
        self._outstanding = 0  # requests queued or in work
        self._build_queued = False
        self._reference: nn.Module | None = None
        self.dropped = 0  # requests refused because the runner was busy
        self.busy_seconds = 0.0  # wall time the background thread spent on forward passes and rebuilds
        self.cpu_seconds = 0.0  # CPU time of the background thread (all of its work, by time.thread_time)
        self.builds = 0
        self.info: ReferenceInfo | None = None  # of the latest build, when `build` returns one
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="egeria-reference", daemon=True)
        self._thread.start()

    @property
    def ready(self) -> bool:
        """True once a reference model has been built (a rebuild keeps the old one usable until it is done)."""
        return self._reference is not None

    @property
    def busy(self) -> bool:
        """True while a request is queued or in work."""
        return self._outstanding > 0

    def refresh(self, snapshot: nn.Module, calibration: torch.Tensor | None = None, *, queue: bool = False) -> bool:
        """Queue a rebuild of the reference from `snapshot` (a copy the caller will not modify); never waits.

        `calibration` is one input batch for static quantization. Returns False (and drops the request) while the
        runner is busy, unless `queue`, which queues it behind the work in hand.
        """
        if self.busy and not queue:
            self.dropped += 1
            return False
        self._build_queued = True
        self._put(("build", (snapshot, calibration)))
        return True

    def submit(
        self,
        step: int,
        module: int,
        member: str,
        inputs: torch.Tensor,
        train_activation: torch.Tensor,
        *,
        queue: bool = False,
    ) -> bool:
        """Queue one plasticity evaluation; never waits. Returns False (dropped) if busy or no reference yet; with
        `queue`, it is queued behind the work in hand and dropped only if no build was ever queued.

        `inputs` and `train_activation` must not be modified afterwards (pass detached copies).
        """
        if (self.busy and not queue) or (self._reference is None and not (queue and self._build_queued)):
            self.dropped += 1
            return False
        self._put(("eval", _Request(step, module, member, inputs, train_activation)))
        return True

    def _put(self, item: tuple[str, object]) -> None:
        with self._lock:
            self._outstanding += 1
        self._inbox.put(item)

    def poll(self) -> list[PlasticityReading]:
        """Every reading finished since the last poll, oldest first; never waits."""
        out = []
        while True:
            try:
                out.append(self._outbox.get_nowait())
            except queue.Empty:
                return out

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every request queued so far is done (its reading, if any, is then in `poll`); True if it is."""
        with self._finished:
            return self._finished.wait_for(lambda: self._outstanding == 0, timeout)

    def wait_one(self, timeout: float) -> None:
        """Block until the next request in work is done, at most `timeout` seconds (at once when none is)."""
        with self._finished:
            if self._outstanding:
                self._finished.wait(timeout)

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
            start, cpu_start = time.perf_counter(), time.thread_time()
            try:
                if kind == "build":
                    built = self._build(*payload)  # type: ignore[misc]
                    if isinstance(built, tuple):
                        built, self.info = built
                    self._reference = built
                    self.builds += 1
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
                self.cpu_seconds += time.thread_time() - cpu_start
                with self._lock:
                    self._outstanding -= 1
                    self._finished.notify_all()
