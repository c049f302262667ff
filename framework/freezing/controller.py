"""`FreezingController`: Egeria's layer freezing driven from a user's training loop (Egeria sections 3-4).

The loop replaces ``model(x)`` by ``controller.forward(x, sample_ids)`` and calls ``controller.after_step(loss, lr)``
after each optimizer step::

    controller = FreezingController(model, split_by_size(model, 4), eval_interval=20, cache_dir=tmp)
    for epoch in range(epochs):
        batches = list(loader)                                  # (x, y, ids) batches in this epoch's order
        controller.set_upcoming([ids for _, _, ids in batches])  # optional: lets the cache prefetch
        for x, y, ids in batches:
            loss = F.cross_entropy(controller.forward(x, ids), y)
            optimizer.zero_grad(); loss.backward(); optimizer.step()
            controller.after_step(loss, optimizer.param_groups[0]["lr"])
    controller.close()

What happens inside: a bootstrapping stage until the mean training loss of a window of W intervals differs by less
than 10% from the window before; then an int8 reference snapshot (convolutions static int8, linear layers dynamic
int8) is built on a background thread, calibrated on a recent batch, and, every `eval_interval` steps, the activation
of the frontmost active layer module is compared with the reference's for the same batch (SP loss). The policy
freezes that module when its plasticity is flat (parameters get ``requires_grad=False``, the module runs in eval mode
so batch norm uses its running statistics), and unfreezes everything when the LR has dropped 10x since the first
freeze. By default a reading is used at the first step after it comes back and a request that meets a busy reference
is dropped, so where freezing happens depends on the machine's load; with ``reading_lag=L`` every reading is used
exactly L steps after its batch and nothing is dropped (the training loop waits instead), so the freeze and unfreeze
steps depend only on the data, the weights and the seed.

With a `cache_dir`, the output of the last frozen member is stored per sample id and read back (prefetched when the
upcoming id order is known), and the model runs from it: the frozen members' forward passes are replaced for that
call (a module-boundary cut, `framework.freezing.cut`), so any model whose structure can be cut there works, a
torchvision ResNet or a HuggingFace BERT as well as an ``nn.Sequential``. A batch runs from the cache once all its
sample ids were stored since the prefix froze (each sample's first pass stores it). `scaled_defaults` gives
`eval_interval` and W for a run of a given length, by the paper's ratios.

Caching assumes a sample id always stands for the same input tensor (no random augmentation, or ids that encode
the augmentation). The controller is not picklable (it owns threads); its `state_dict()` is, and is what travels.
Validation passes should call the model directly (``model.eval(); model(x)``), not `forward`, which counts steps.

On the MOP engine (one controller per training unit, on the worker that runs it)::

    model.load_state_dict(weights)                             # the config's weights arrive first
    controller = FreezingController(model, modules, cache_dir=worker_dir / f"config{config_id}", **options)
    if "freezing" in config_state:
        controller.load_state_dict(config_state["freezing"])   # re-applies requires_grad, rebuilds the reference
    train_fn(model, partition, hparams, freezing=controller)   # the user's loop calls forward / after_step
    config_state["freezing"] = controller.state_dict()         # plain JSON-able dict; flushes the cache index
    controller.close()

A hop may leave out ``frozen_parameter_names(model, config_state["freezing"], include_buffers=True)`` when the
destination worker still holds this config's weights from a visit with the same ``state["generation"]`` (frozen
weights do not change within a generation; every freeze or unfreeze starts a new one).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .cache import ActivationPrefetcher, ActivationStore, MemmapActivationStore
from .cut import PrefixCut
from .modules import LayerModule, split_children
from .policy import FreezingPolicy, FreezingPolicyConfig
from .reference import QUANTIZE_MODES, AsyncReferenceRunner, _first_tensor, make_reference

STATE_VERSION = 1


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` is {value!r}, but must be an int")
    if value < 1:
        raise ValueError(f"`{name}` is {value}, but must be >= 1")


def frozen_parameter_names(model: nn.Module, state: Mapping[str, Any], *, include_buffers: bool = False) -> list[str]:
    """Names of the parameters of `model` frozen according to a `FreezingController.state_dict()`.

    With ``include_buffers=True`` the names are ``model.state_dict()`` keys and include the frozen modules' buffers
    (batch-norm running statistics do not change while frozen either). A model hop can leave these entries out when
    the destination already holds the config's weights of the same ``state["generation"]``.
    """
    modules = [
        LayerModule(name, tuple(members)) for name, members in zip(state["module_names"], state["modules"], strict=True)
    ]
    names: list[str] = []
    for lm in modules[: state["policy"]["frozen"]]:
        names.extend(lm.state_keys(model) if include_buffers else lm.parameter_names(model))
    return names


class FreezingController:
    """Freezes converged front layer modules of `model` while it trains (Egeria, EuroSys 2023).

    Args:
        model: the model being trained (modified in place: ``requires_grad`` and train/eval mode of frozen modules).
        modules: layer modules in forward order (`split_children`, `split_regex`, `split_by_size`); default: one per
            top-level child.
        eval_interval: steps between evaluations (bootstrapping check, plasticity reading, LR check); Egeria's T.
        policy: `FreezingPolicyConfig` (window W, tolerance, bootstrapping rate, LR drop factor).
        reference_refresh: evaluations between rebuilds of the reference model from the latest weights.
        reference_mode: ``"static"`` (int8 convolutions calibrated on a recent training batch, plus dynamic int8
            linear layers), ``"dynamic"`` (int8 linear layers only) or ``"float"``; see `make_reference`.
        reference_threads: torch intra-op threads of the reference's background thread.
        cache_dir: if set, cache the frozen prefix's activations under this directory; the model is then run from
            the cached output of the last frozen member (a module-boundary cut, see `framework.freezing.cut`; the
            rules are checked on the first batch of every new frozen prefix and `CutError` names a violation). The
            directory should be private to this config on this worker.
        prefetch_depth: batches of cached activations read ahead.
        store_factory: builds the `ActivationStore` for a directory (default `MemmapActivationStore`).
        reading_lag: None (asynchronous readings: a reading is used at the first step after it comes back, and a
            request or rebuild that meets a busy reference is dropped) or L >= 1 (deterministic readings: requests
            and rebuilds are queued, never dropped, and done in order; the reading of the batch captured at step s is
            used exactly at step s + L, the training loop waiting for it then if it is not back). The training
            thread's waiting counts in `overhead_seconds`. With L = `eval_interval` the reference has the time to
            answer that it has without a lag before its next request would be dropped.
    """

    def __init__(
        self,
        model: nn.Module,
        modules: Sequence[LayerModule] | None = None,
        *,
        eval_interval: int = 50,
        policy: FreezingPolicyConfig | None = None,
        reference_refresh: int = 10,
        reference_mode: str = "static",
        reference_threads: int = 1,
        cache_dir: str | Path | None = None,
        prefetch_depth: int = 4,
        store_factory: type[ActivationStore] | None = None,
        reading_lag: int | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"`model` is {type(model).__name__}, but must be a torch.nn.Module")
        _check_positive_int("eval_interval", eval_interval)
        _check_positive_int("reference_refresh", reference_refresh)
        _check_positive_int("reference_threads", reference_threads)
        _check_positive_int("prefetch_depth", prefetch_depth)
        if reading_lag is not None:
            if isinstance(reading_lag, bool) or not isinstance(reading_lag, int):
                raise TypeError(f"`reading_lag` is {reading_lag!r}, but must be an int or None")
            if reading_lag < 1:
                raise ValueError(f"`reading_lag` is {reading_lag}, but must be >= 1 (or None)")
        if reference_mode not in QUANTIZE_MODES:
            raise ValueError(f"`reference_mode` is {reference_mode!r}, but must be one of {QUANTIZE_MODES}")
        if policy is not None and not isinstance(policy, FreezingPolicyConfig):
            raise TypeError(f"`policy` is {type(policy).__name__}, but must be a FreezingPolicyConfig or None")
        modules = list(split_children(model) if modules is None else modules)
        if not modules:
            raise ValueError("`modules` is empty, but must hold at least one LayerModule")
        known = dict(model.named_modules())
        for lm in modules:
            for m in lm.members:
                if m not in known:
                    raise ValueError(f"`modules` names member {m!r} of {lm.name!r}, but it must be a module of `model`")
        members = [m for lm in modules for m in lm.members]
        # static rules of a cut (distinct, non-nested members) at construction; the rest on the first cached batch
        self._cut = PrefixCut(model, members) if cache_dir is not None else None
        self.model = model
        self.modules = modules
        self.eval_interval = eval_interval
        self.reference_refresh = reference_refresh
        self.reference_mode = reference_mode
        self.reading_lag = reading_lag
        self.policy = FreezingPolicy(len(modules), policy)
        self.cache_dir = None if cache_dir is None else Path(cache_dir)
        self._store_factory = store_factory or MemmapActivationStore
        self._prefetch_depth = prefetch_depth
        self._members = members
        self._chain_start = [0]  # index into _members of each layer module's first member
        for lm in modules:
            self._chain_start.append(self._chain_start[-1] + len(lm.members))

        self.step = 0
        self._loss_sum = 0.0
        self._loss_count = 0
        self._evals_since_refresh = 0
        self.events: list[tuple[int, str, int]] = []  # (step, "bootstrap_end" | "freeze" | "unfreeze", module)
        self.overhead_seconds = 0.0  # training-thread time on reference work (snapshot, capture, submit, poll, waits)
        self.readings: list[tuple[int, int, float]] = []  # (step submitted, module, plasticity), as applied
        self._pending: list[tuple[int, int, float]] = []  # readings back from the runner, not applied yet
        self._awaited: list[int] = []  # steps of the accepted requests whose readings are not back yet, oldest first

        self._runner: AsyncReferenceRunner | None = None
        self._reference_threads = reference_threads
        self._store: ActivationStore | None = None
        self._prefetcher: ActivationPrefetcher | None = None
        self._upcoming: list[torch.Tensor | Sequence[int]] = []
        self._upcoming_cursor = 0
        self._verified = False  # the cut of the current frozen prefix passed `PrefixCut.verify`
        self._last_inputs: torch.Tensor | None = None  # calibration batch of the next reference build
        self._refresh_pending = False  # a reference build waits for a first batch to calibrate on

    # ----------------------------------------------------------------------------------------------- properties
    @property
    def frozen(self) -> int:
        """Number of frozen front layer modules."""
        return self.policy.frozen

    def reference_stats(self) -> dict[str, Any]:
        """What the reference model cost so far: ``builds``, ``cpu_seconds`` of its background thread (all of its
        work), ``busy_seconds`` (wall), ``dropped`` requests, ``info`` (the latest build's `ReferenceInfo` or None),
        ``overhead_seconds`` (wall time the training thread spent on it) and the cache's prefetch ``hits`` and
        ``misses``."""
        runner, prefetcher = self._runner, self._prefetcher
        return {
            "builds": runner.builds if runner else 0,
            "cpu_seconds": runner.cpu_seconds if runner else 0.0,
            "busy_seconds": runner.busy_seconds if runner else 0.0,
            "dropped": runner.dropped if runner else 0,
            "info": runner.info if runner else None,
            "overhead_seconds": self.overhead_seconds,
            "hits": prefetcher.hits if prefetcher else 0,
            "misses": prefetcher.misses if prefetcher else 0,
        }

    def wait_reference(self, timeout: float | None = None) -> bool:
        """Block until the reference's background thread is idle (for accounting and tests); True if it is."""
        return self._runner is None or self._runner.wait_idle(timeout)

    def frozen_parameter_names(self) -> list[str]:
        """Qualified names of the parameters that are frozen now."""
        return [n for lm in self.modules[: self.frozen] for n in lm.parameter_names(self.model)]

    def freeze(self, num_modules: int, lr: float | None = None) -> None:
        """Freeze exactly the first `num_modules` layer modules now (a manual override of the policy).

        `lr` is the current LR, remembered for the unfreeze-on-LR-drop rule (None: never unfreeze by LR).
        """
        self.policy.force(num_modules, lr)
        self._apply_frozen()

    # ------------------------------------------------------------------------------------------ training loop API
    def set_upcoming(self, id_batches: Iterable[torch.Tensor | Sequence[int]]) -> None:
        """Announce the sample-id batches of the coming forward calls, in order (e.g. one epoch's worth).

        Lets the activation cache prefetch; without it cached activations are read synchronously.
        """
        self._upcoming = list(id_batches)
        self._upcoming_cursor = 0
        self._restart_prefetch()

    def forward(self, inputs: torch.Tensor, sample_ids: torch.Tensor | Sequence[int] | None = None) -> torch.Tensor:
        """The model's output for `inputs`, skipping the frozen prefix's forward pass where it is cached.

        `sample_ids` (one per row of `inputs`) key the activation cache; without them the whole model runs.
        """
        for lm in self.modules[: self.frozen]:
            for m in lm.members:
                self.model.get_submodule(m).eval()
        self._last_inputs = inputs
        if self._refresh_pending:
            self._refresh_reference()
        use_cache = self._store is not None and sample_ids is not None
        if use_cache and not self._verified:
            self._verify_cut(inputs, sample_ids)  # before the capture hook below, which must see one pass only
        evaluate = self._is_eval_step()
        capture: list[torch.Tensor] = []
        handle = None
        if evaluate:
            member = self.modules[self.policy.active].members[-1]  # type: ignore[index]
            handle = self.model.get_submodule(member).register_forward_hook(
                lambda _m, _i, out: capture.append(_first_tensor(out).detach().clone())
            )
        try:
            if use_cache:
                out = self._forward_cached(inputs, sample_ids)
            else:
                out = self.model(inputs)
        finally:
            if handle is not None:
                handle.remove()
        if self._upcoming:
            self._upcoming_cursor += 1
        if evaluate and capture:
            start = time.perf_counter()
            active = self.policy.active
            if self._runner.submit(  # type: ignore[union-attr]
                self.step,
                active,
                self.modules[active].members[-1],
                inputs.detach().cpu().clone(),
                capture[0].cpu(),
                queue=self.reading_lag is not None,
            ):
                self._awaited.append(self.step)
            self.overhead_seconds += time.perf_counter() - start
        return out

    def after_step(self, loss: float | torch.Tensor, lr: float) -> list[tuple[int, str, int]]:
        """Record one finished optimizer step; returns the events it triggered as ``(step, kind, module)``.

        Without a `reading_lag` it never waits for the reference model: readings that are not back yet are used at a
        later step. With one, the reading of the batch captured at step s is used here when `step` reaches s + L,
        after waiting for it if it is not back.
        """
        self.step += 1
        self._loss_sum += float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
        self._loss_count += 1
        events: list[tuple[int, str, int]] = []
        if self.step % self.eval_interval == 0:
            mean_loss = self._loss_sum / self._loss_count
            self._loss_sum, self._loss_count = 0.0, 0
            if self.policy.on_lr(lr):
                events.append((self.step, "unfreeze", 0))
            if self.policy.bootstrapping:
                if self.policy.on_loss(mean_loss):
                    events.append((self.step, "bootstrap_end", 0))
                    self._refresh_reference()
            else:
                self._evals_since_refresh += 1
                if self._runner is None or self._evals_since_refresh >= self.reference_refresh:
                    self._refresh_reference()
        if self._runner is not None:
            start = time.perf_counter()
            self._collect_readings()
            lag = self.reading_lag
            while lag is not None and self._awaited and self._awaited[0] + lag <= self.step:
                idle = not self._runner.busy  # read first: an idle runner has put out every reading it will
                if not idle:
                    self._runner.wait_one(0.01)  # a reading due now is not back: wait for it
                self._collect_readings()
                if idle:
                    break
            self.overhead_seconds += time.perf_counter() - start
        due = [r for r in self._pending if self.reading_lag is None or r[0] + self.reading_lag <= self.step]
        if due:
            self._pending = self._pending[len(due) :]  # oldest first, so the due ones lead
            for step, module, value in due:
                self.readings.append((step, module, value))
                if self.policy.on_plasticity(module, value, lr):
                    events.append((self.step, "freeze", module))
        if events:
            self.events.extend(events)
            self._apply_frozen()
        return events

    # ------------------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Plain numbers, strings and lists (no tensors, no threads): what travels with a config between workers.

        With a `reading_lag`, a reading still in flight is waited for, and the readings not yet due travel in
        ``pending_readings``.
        """
        if self._store is not None:
            self._store.flush()
        if self.reading_lag is not None and self._awaited:
            start = time.perf_counter()
            self._runner.wait_idle()  # type: ignore[union-attr]
            self._collect_readings()
            self.overhead_seconds += time.perf_counter() - start
        return {
            "version": STATE_VERSION,
            "step": self.step,
            "loss_sum": self._loss_sum,
            "loss_count": self._loss_count,
            "evals_since_refresh": self._evals_since_refresh,
            "module_names": [lm.name for lm in self.modules],
            "modules": [list(lm.members) for lm in self.modules],
            "policy": self.policy.state_dict(),
            "generation": self.policy.generation,
            "events": [list(e) for e in self.events],
            "pending_readings": [list(r) for r in self._pending],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a `state_dict()` (possibly from another worker) and re-apply the frozen prefix to the model.

        The reference model is rebuilt from the current weights in the background; the activation cache is reopened
        from this controller's `cache_dir` (rows flushed there by an earlier visit with the same frozen weights are
        reused).
        """
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"`state['version']` is {state.get('version')!r}, but must be {STATE_VERSION}")
        members = [list(lm.members) for lm in self.modules]
        if [list(m) for m in state["modules"]] != members:
            raise ValueError(f"`state['modules']` is {state['modules']}, but must equal this controller's {members}")
        self.policy.load_state_dict(dict(state["policy"]))
        self._apply_frozen()
        if not self.policy.bootstrapping:
            self._refresh_reference()  # the reference never travels; rebuild it here from the arriving weights
        self.step = int(state["step"])
        self._loss_sum, self._loss_count = float(state["loss_sum"]), int(state["loss_count"])
        self._evals_since_refresh = int(state["evals_since_refresh"])
        self.events = [(int(s), str(k), int(m)) for s, k, m in state["events"]]
        self._pending = [(int(s), int(m), float(v)) for s, m, v in state.get("pending_readings", [])]

    def close(self) -> None:
        """Stop background threads and flush the cache; the controller should not be used afterwards."""
        if self._prefetcher is not None:
            self._prefetcher.stop()
        if self._runner is not None:
            self._runner.close()
        if self._store is not None:
            self._store.flush()

    def __enter__(self) -> FreezingController:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------------------------- internals
    def _is_eval_step(self) -> bool:
        """Capture activations on the last step of each interval, once a reference exists and a module is active."""
        if (
            self.step % self.eval_interval != self.eval_interval - 1
            or self.policy.active is None
            or self._runner is None
        ):
            return False
        # with a reading lag a build is queued before any request, so whether this batch is read never depends on
        # how fast the background thread ran
        return self.reading_lag is not None or self._runner.ready

    def _collect_readings(self) -> None:
        """Move the readings that are back into `_pending`; raise the background thread's error, if any."""
        readings = self._runner.poll()  # type: ignore[union-attr]
        if self._runner.error is not None:  # type: ignore[union-attr]
            error, self._runner.error = self._runner.error, None  # type: ignore[union-attr]
            self._awaited = []  # a failed request never answers
            raise RuntimeError("the reference model failed on its background thread") from error
        for r in readings:
            self._pending.append((r.step, r.module, r.value))
            if self._awaited and self._awaited[0] == r.step:
                self._awaited.pop(0)

    def _refresh_reference(self) -> None:
        if self._last_inputs is None:  # static quantization calibrates on a real batch: wait for the next one
            self._refresh_pending = True
            return
        self._refresh_pending = False
        start = time.perf_counter()
        if self._runner is None:
            mode = self.reference_mode

            def build(snapshot: nn.Module, calibration: torch.Tensor | None) -> tuple[nn.Module, object]:
                return make_reference(snapshot, mode, calibration=calibration)

            self._runner = AsyncReferenceRunner(self._reference_threads, build)
        snapshot = copy.deepcopy(self.model)  # on the training thread: consistent weights; quantized in background
        calibration = self._last_inputs.detach().to("cpu", copy=True)
        if self._runner.refresh(snapshot, calibration, queue=self.reading_lag is not None):
            self._evals_since_refresh = 0
        self.overhead_seconds += time.perf_counter() - start

    def _apply_frozen(self) -> None:
        """Make requires_grad and train/eval mode match the policy, and switch the activation cache."""
        for i, lm in enumerate(self.modules):
            frozen = i < self.frozen
            for m in lm.members:
                sub = self.model.get_submodule(m)
                for p in sub.parameters():
                    p.requires_grad_(not frozen)
                    if frozen:
                        p.grad = None
                sub.train(not frozen and self.model.training)
        if self.cache_dir is not None:
            self._switch_store()

    def _switch_store(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.stop()
            self._prefetcher = None
        if self._store is not None:
            self._store.flush()
        self._store = None
        self._verified = False
        if self.frozen == 0:
            return
        directory = self.cache_dir / f"gen{self.policy.generation}_prefix{self.frozen}"  # type: ignore[operator]
        self._store = self._store_factory(directory)
        self._prefetcher = ActivationPrefetcher(self._store, self._prefetch_depth)
        self._restart_prefetch()

    def _restart_prefetch(self) -> None:
        if self._prefetcher is not None and self._upcoming:
            self._prefetcher.schedule(self._upcoming[self._upcoming_cursor :])

    def _verify_cut(self, inputs: torch.Tensor, sample_ids: torch.Tensor | Sequence[int]) -> None:
        """Check that the model can run from the new prefix's cache (raises `CutError`) and cache this batch."""
        k = self._chain_start[self.frozen]
        activation = self._cut.verify(inputs, k)  # type: ignore[union-attr]
        self._store.put(sample_ids, activation)  # type: ignore[union-attr]
        self._verified = True

    def _forward_cached(self, inputs: torch.Tensor, sample_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
        k = self._chain_start[self.frozen]  # members in the frozen prefix
        cached = self._prefetcher.take(sample_ids)  # type: ignore[union-attr]
        if cached is None:  # run the whole model once; the boundary's output goes to the store on the way
            return self._cut.forward_capture(  # type: ignore[union-attr]
                inputs,
                k,
                lambda activation: self._store.put(sample_ids, activation),  # type: ignore[union-attr]
            )
        return self._cut.forward_cached(inputs, k, cached.to(inputs.device))  # type: ignore[union-attr]
