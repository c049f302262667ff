"""Stoppers: rules that end a config, or the whole run, from the metrics it reported (Ray Tune's `tune.stopper`).

`ModelSelection(stop=...)` takes a `Stopper`, a list of them (any one stops: `CombinedStopper`), a dict of thresholds
(`{"epochs": 10, "valid_acc": 0.98}`: a config stops once any value reaches its threshold, Tune's dict rule) or a
function `fn(config_id, result) -> bool` (`FunctionStopper`); `make_stopper` turns each into one `Stopper`.

The engine works at epoch level, so a stopper does too. The driver calls, at every decision (an epoch barrier, or
one config's epoch end without one), before the procedure decides:

    for each config whose epoch ended, in id order:  reason = stopper.on_epoch(state)   # a str stops it
    then once:                                        reason = stopper.stop_all()        # a str ends the run

`state` is the config's `automl.ConfigState` (its `history` holds one metrics dict per finished epoch, the last one
just finished). A config a stopper stops is STOPPED with the outcome "stopped" and the reason logged (a
`config_stopped` event); `stop_all` stops every active config the same way (a `run_stopped` event) and the procedure
is not asked again. A stopper must be deterministic given the sequence of `on_epoch` calls: a resumed run rebuilds a
stopper's state by calling `on_epoch` again for every committed epoch, in the order they were committed, and ignores
what those calls return. The per-config stoppers here keep no state at all (they read the config's history).

A stopper that raises (a `FunctionStopper`'s function, a stopper class of the user's) ends the run as a run-wide
stop does: every active config stops, the reason names the stopper and its error in one line (a `run_stopped`
event), its traceback is a `stopper_failed` event, and the run records that its stopper failed (`failed_spec`), so
that a resume needs no `stop=` (it goes on without that stopper, or with the one `stop=` passes).

`TimeoutStopper` is the run's time budget (`ModelSelection(time_budget_s=...)`), as in Tune: when it is spent the
run ends cleanly and can be resumed with a larger one (see `docs/guides/stopping.md`).

Pure Python: no torch, no Ray.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from framework.registry import Registry

if TYPE_CHECKING:
    from automl import ConfigState

__all__ = [
    "CombinedStopper", "ExperimentPlateauStopper", "FunctionStopper", "MaximumIterationStopper",
    "MetricThresholdStopper", "Stopper", "StopperError", "TimeoutStopper", "TrialPlateauStopper", "ended_by",
    "failed_spec", "make_stopper", "stop_reasons", "stopper_from_spec", "stopper_spec",
]

#: the keys of a `stop` dict (and of a `FunctionStopper`'s result) that count a config's finished epochs
EPOCH_KEYS = ("epochs", "training_iteration")
_MODES = ("min", "max")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


#: the largest count (epochs, results) a stopper takes: an int64, what a run records
MAX_COUNT = 2**63 - 1


def _finite(value: Any) -> float | None:
    """`value` as a finite float (numpy's numbers too), or None: not a real number, or not finite as a float (nan,
    inf, 10**400). `automl._checks.finite_real`, imported here: reading a run's events needs neither numpy nor
    automl."""
    from automl._checks import finite_real

    return finite_real(value)


def _show(value: Any) -> str:
    from automl._checks import show

    return show(value)


def _check_count(owner: str, arg: str, value: Any, minimum: int) -> int:
    """`value` as an int in [`minimum`, `MAX_COUNT`], or the `ValueError` naming `owner`'s `arg`."""
    if not _is_int(value) or value < minimum:
        raise ValueError(f"{owner}: `{arg}` is {_show(value)}, but must be an int >= {minimum}")
    if value > MAX_COUNT:
        raise ValueError(f"{owner}: `{arg}` is {_show(value)}, but must be <= 2**63 - 1 (an int64, what a run "
                         "records)")
    return value


def _check_positive(owner: str, arg: str, value: Any) -> float:
    f = _finite(value)
    if f is None or f <= 0:
        raise ValueError(f"{owner}: `{arg}` is {_show(value)}, but must be a finite number > 0")
    return f


def _check_metric(owner: str, metric: Any) -> str:
    if not isinstance(metric, str) or not metric.startswith(("train_", "valid_")):
        raise ValueError(f"{owner}: `metric` is {metric!r}, but must name a reported metric as 'valid_<name>' or "
                         "'train_<name>'")
    return metric


def _check_mode(owner: str, mode: Any) -> str:
    if mode not in _MODES:
        raise ValueError(f"{owner}: `mode` is {mode!r}, but must be one of {list(_MODES)}")
    return mode


def result_of(state: ConfigState) -> dict[str, Any]:
    """What a `FunctionStopper` is given: the config's last epoch's metrics, with `epochs` and Tune's
    `training_iteration` (both: its finished epochs) and `config_id`."""
    last = dict(state.history[-1]) if state.history else {}
    return {**last, "epochs": state.epochs, "training_iteration": state.epochs, "config_id": state.id}


class Stopper:
    """Base class of stoppers (Ray Tune's `Stopper`, at epoch level: see the module docstring).

    Subclasses override `on_epoch` (a per-config rule), `stop_all` (a run-wide rule) or both; each returns a reason
    (one line, logged and shown) to stop, or None. They are called from the driver's thread only, never at the same
    time. `spec` says how the run records the stopper so that a resume rebuilds it (None: it cannot be recorded,
    and a resume asks for `stop=` again). A stopper pickles (it goes with the run's options)."""

    #: the run's time budget this stopper sets, in seconds (`TimeoutStopper`); None: none
    timeout_s: float | None = None

    def on_epoch(self, state: ConfigState) -> str | None:
        """Config `state` has just finished an epoch: a reason to stop it, or None to let it go on."""
        return None

    def stop_all(self) -> str | None:
        """After the epochs of a decision were shown to `on_epoch`: a reason to end the whole run, or None."""
        return None

    def spec(self) -> dict[str, Any] | None:
        """The keyword arguments that rebuild this stopper (JSON-able), or None when it cannot be recorded."""
        return None

    def __eq__(self, other: object) -> bool:
        spec = self.spec()
        return type(self) is type(other) and (spec is not None and spec == other.spec() or self is other)

    def __hash__(self) -> int:
        return hash(type(self).__name__)

    def __repr__(self) -> str:
        spec = self.spec()
        args = ", ".join(f"{k}={v!r}" for k, v in spec.items()) if spec is not None else "..."
        return f"{type(self).__name__}({args})"


class StopperError(Exception):
    """`stopper` (one of a `CombinedStopper`'s) raised `error`: what `CombinedStopper` raises, so the run names the
    stopper that failed, not the combination."""

    def __init__(self, stopper: Stopper, error: Exception) -> None:
        super().__init__(f"{_show(stopper)} raised {type(error).__name__}")
        self.stopper, self.error = stopper, error


def _each(stoppers: tuple[Stopper, ...], call: Callable[[Stopper], str | None]) -> list[str | None]:
    """`call(s)` for every stopper, in order; one that raises raises `StopperError` naming it."""
    out = []
    for s in stoppers:
        try:
            out.append(call(s))
        except StopperError:
            raise
        except Exception as e:
            raise StopperError(s, e) from e
    return out


class MaximumIterationStopper(Stopper):
    """Stop a config once it has finished `max_iter` epochs (Tune's `MaximumIterationStopper`)."""

    def __init__(self, max_iter: int) -> None:
        self.max_iter = _check_count("MaximumIterationStopper", "max_iter", max_iter, 1)

    def on_epoch(self, state: ConfigState) -> str | None:
        if state.epochs >= self.max_iter:
            return f"finished {state.epochs} epochs (max_iter={self.max_iter})"
        return None

    def spec(self) -> dict[str, Any]:
        return {"max_iter": self.max_iter}


class MetricThresholdStopper(Stopper):
    """Stop a config once its `metric` reaches `threshold`: at or above it (`mode="max"`, the rule of Tune's `stop`
    dict) or at or below it (`mode="min"`, e.g. a loss)."""

    def __init__(self, metric: str, threshold: float, mode: str = "max") -> None:
        self.metric = _check_metric("MetricThresholdStopper", metric)
        if _finite(threshold) is None:
            raise ValueError(f"MetricThresholdStopper: `threshold` is {_show(threshold)}, but must be a finite number")
        threshold = int(threshold) if _is_int(threshold) else float(threshold)  # (recorded as JSON: no numpy)
        self.threshold, self.mode = threshold, _check_mode("MetricThresholdStopper", mode)

    def on_epoch(self, state: ConfigState) -> str | None:
        value = state.last(self.metric)
        if math.isnan(value):
            return None
        if value >= self.threshold if self.mode == "max" else value <= self.threshold:
            return f"{self.metric}={value:.6g} reached {self.threshold:g} ({self.mode})"
        return None

    def spec(self) -> dict[str, Any]:
        return {"metric": self.metric, "threshold": self.threshold, "mode": self.mode}


class TrialPlateauStopper(Stopper):
    """Stop a config whose `metric` plateaued (Tune's `TrialPlateauStopper`): once it has finished `grace_period`
    epochs and reported `num_results` values, the (population) standard deviation of its last `num_results` values
    is below `std`. With `metric_threshold`, only a config whose latest value is at least as good (`mode` "min": at
    or below it; "max": at or above it) stops."""

    def __init__(self, metric: str, std: float = 0.01, num_results: int = 4, grace_period: int = 4,
                 metric_threshold: float | None = None, mode: str | None = None) -> None:
        self.metric = _check_metric("TrialPlateauStopper", metric)
        std = _check_positive("TrialPlateauStopper", "std", std)
        num_results = _check_count("TrialPlateauStopper", "num_results", num_results, 1)
        grace_period = _check_count("TrialPlateauStopper", "grace_period", grace_period, 1)
        if metric_threshold is not None:
            if _finite(metric_threshold) is None:
                raise ValueError(f"TrialPlateauStopper: `metric_threshold` is {_show(metric_threshold)}, but must be a "
                                 "finite number or None")
            metric_threshold = float(metric_threshold)
            _check_mode("TrialPlateauStopper", mode)
        elif mode is not None:
            _check_mode("TrialPlateauStopper", mode)
        self.std, self.num_results, self.grace_period = std, num_results, grace_period
        self.metric_threshold, self.mode = metric_threshold, mode

    def on_epoch(self, state: ConfigState) -> str | None:
        if state.epochs < self.grace_period:
            return None
        values = [float(h[self.metric]) for h in state.history if self.metric in h][-self.num_results:]
        if len(values) < self.num_results:
            return None
        if self.metric_threshold is not None:
            last = values[-1]
            if last > self.metric_threshold if self.mode == "min" else last < self.metric_threshold:
                return None
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        if std < self.std:
            return f"{self.metric} plateaued: std {std:.3g} < {self.std:g} over its last {len(values)} epochs"
        return None

    def spec(self) -> dict[str, Any]:
        return {"metric": self.metric, "std": self.std, "num_results": self.num_results,
                "grace_period": self.grace_period, "metric_threshold": self.metric_threshold, "mode": self.mode}


class ExperimentPlateauStopper(Stopper):
    """End the run when the best `top` values of `metric`, over every epoch of every config so far, have a standard
    deviation at most `std`, for more than `patience` epoch ends in a row (Tune's `ExperimentPlateauStopper`; its
    "results" are our epoch ends, seen in the order the run committed them)."""

    def __init__(self, metric: str, std: float = 0.001, top: int = 10, mode: str = "min", patience: int = 0) -> None:
        self.metric = _check_metric("ExperimentPlateauStopper", metric)
        self.mode = _check_mode("ExperimentPlateauStopper", mode)
        top = _check_count("ExperimentPlateauStopper", "top", top, 2)
        std = _check_positive("ExperimentPlateauStopper", "std", std)
        patience = _check_count("ExperimentPlateauStopper", "patience", patience, 0)
        self.std, self.top, self.patience = std, top, patience
        self._top_values: list[float] = []  # the best `top` values so far, best first
        self._iterations = 0  # epoch ends in a row that found the top values plateaued

    def _plateaued(self) -> float | None:
        """The top values' standard deviation when there are `top` of them and it is at most `std`, else None."""
        values = self._top_values
        if len(values) < self.top:
            return None
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        return std if std <= self.std else None

    def on_epoch(self, state: ConfigState) -> str | None:
        value = state.last(self.metric)
        if math.isnan(value):
            return None
        self._top_values = sorted([*self._top_values, value], reverse=self.mode == "max")[:self.top]
        self._iterations = self._iterations + 1 if self._plateaued() is not None else 0
        return None

    def stop_all(self) -> str | None:
        std = self._plateaued()
        if std is not None and self._iterations > self.patience:
            return (f"the best {self.top} values of {self.metric} plateaued: std {std:.3g} <= {self.std:g} for "
                    f"{self._iterations} epoch ends (patience={self.patience})")
        return None

    def spec(self) -> dict[str, Any]:
        return {"metric": self.metric, "std": self.std, "top": self.top, "mode": self.mode, "patience": self.patience}


class TimeoutStopper(Stopper):
    """The run's time budget (Tune's `TimeoutStopper`; `ModelSelection(time_budget_s=...)` is the same): `timeout`
    seconds (or a `datetime.timedelta`) of the run's driver loop, summed over the run and its resumes. When it is
    spent, nothing new starts, the units in flight finish, and the run ends, resumable with a larger budget."""

    def __init__(self, timeout: float | datetime.timedelta) -> None:
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
        f = _finite(seconds)
        if f is None or f <= 0:
            raise ValueError(f"TimeoutStopper: `timeout` is {_show(timeout)}, but must be a finite number of seconds "
                             "> 0 or a datetime.timedelta")
        self.timeout_s = f

    def spec(self) -> dict[str, Any]:
        return {"timeout": self.timeout_s}


class FunctionStopper(Stopper):
    """Stop a config when `function(config_id, result) -> bool` says so (Tune's `FunctionStopper`); `result` is its
    last epoch's metrics with `epochs` (and Tune's `training_iteration`): its finished epochs. Not recorded with the
    run: a resume takes `stop=` again."""

    def __init__(self, function: Callable[[int, dict[str, Any]], bool]) -> None:
        if not callable(function):
            raise TypeError(f"FunctionStopper: `function` is {function!r}, but must be callable as "
                            "function(config_id, result) -> bool")
        self.function = function

    def on_epoch(self, state: ConfigState) -> str | None:
        if self.function(state.id, result_of(state)):
            return f"{self._name} returned True after {state.epochs} epochs"
        return None

    @property
    def _name(self) -> str:
        return getattr(self.function, "__qualname__", type(self.function).__name__)

    def __repr__(self) -> str:
        return f"FunctionStopper({self._name})"


class CombinedStopper(Stopper):
    """Several stoppers as one (Tune's `CombinedStopper`): a config stops, or the run ends, when any of them says so
    (every one is shown every epoch, so stateful ones stay up to date; the first reason is given). Its
    `timeout_s` is the smallest of theirs."""

    def __init__(self, *stoppers: Stopper) -> None:
        if not stoppers:
            raise ValueError("CombinedStopper: `stoppers` is empty, but must hold at least one Stopper")
        for s in stoppers:
            if not isinstance(s, Stopper):
                raise TypeError(f"CombinedStopper: `stoppers` holds {s!r}, but every entry must be a "
                                "framework.stoppers.Stopper")
        self.stoppers = tuple(stoppers)
        timeouts = [s.timeout_s for s in stoppers if s.timeout_s is not None]
        self.timeout_s = min(timeouts) if timeouts else None

    def on_epoch(self, state: ConfigState) -> str | None:
        reasons = _each(self.stoppers, lambda s: s.on_epoch(state))
        return next((r for r in reasons if r), None)

    def stop_all(self) -> str | None:
        reasons = _each(self.stoppers, lambda s: s.stop_all())
        return next((r for r in reasons if r), None)

    def __repr__(self) -> str:
        return f"CombinedStopper({', '.join(map(repr, self.stoppers))})"

    def spec(self) -> dict[str, Any] | None:
        specs = [stopper_spec(s) for s in self.stoppers]
        return None if any(s is None for s in specs) else {"stoppers": specs}


#: the stoppers a run records by name (`stopper_spec`) and a resume rebuilds (`stopper_from_spec`)
STOPPERS: Registry[type[Stopper]] = Registry("stopper", ((cls.__name__, cls) for cls in (
    MaximumIterationStopper, MetricThresholdStopper, TrialPlateauStopper, ExperimentPlateauStopper, TimeoutStopper,
    CombinedStopper)))


def stopper_spec(stopper: Stopper | None) -> dict[str, Any] | None:
    """What a run records of `stopper` (JSON-able): `{"type": name, "args": ...}`, `args` None for a stopper that
    cannot be rebuilt (a `FunctionStopper`, one of the user's own classes)."""
    if stopper is None:
        return None
    spec = stopper.spec() if type(stopper).__name__ in STOPPERS else None
    return {"type": type(stopper).__name__, "args": spec}


def failed_spec(stopper: Stopper | None, failure: str) -> dict[str, Any]:
    """What a run records of a stopper that raised (`failure`: the one line that says so): `stopper_spec` with
    `failed`; `stopper_from_spec` rebuilds no stopper from it (a resume needs no `stop=`)."""
    return {**(stopper_spec(stopper) or {"type": None, "args": None}), "failed": failure}


def stopper_from_spec(spec: Mapping[str, Any]) -> Stopper | None:
    """The stopper `stopper_spec` recorded (None for one that failed in the run: `failed_spec`); raises `ValueError`
    for one that cannot be rebuilt."""
    if spec.get("failed"):
        return None
    name, args = spec.get("type"), spec.get("args")
    if name not in STOPPERS or not isinstance(args, Mapping):
        raise ValueError(f"the run used the stopper {name!r}, which resume() cannot rebuild; pass `stop=` (the same "
                         "stopper, or another)")
    if name == "CombinedStopper":
        return CombinedStopper(*(stopper_from_spec(s) for s in args["stoppers"]))
    return STOPPERS[name](**args)


def _from_dict(stop: Mapping[Any, Any], metric: str, mode: str) -> list[Stopper]:
    if not stop:
        raise ValueError("`stop` is {}, but a dict must hold at least one threshold, e.g. {'epochs': 10}")
    out: list[Stopper] = []
    for key, value in stop.items():
        if key in EPOCH_KEYS:
            if not _is_int(value) or not 1 <= value <= MAX_COUNT:
                raise ValueError(f"`stop[{key!r}]` is {_show(value)}, but must be an int >= 1 and <= 2**63 - 1 (the "
                                 "epochs a config trains at most)")
            out.append(MaximumIterationStopper(value))
            continue
        if key == "epoch":
            raise ValueError("`stop` has the key 'epoch', but epochs are numbered from 0, so its meaning would be "
                             f"ambiguous: use one of {list(EPOCH_KEYS)} (the epochs a config has finished)")
        if not isinstance(key, str) or not key.startswith(("train_", "valid_")):
            raise ValueError(f"`stop` has the key {key!r}, but its keys must be one of {list(EPOCH_KEYS)} or a "
                             "reported metric as 'valid_<name>' or 'train_<name>'")
        if _finite(value) is None:
            raise ValueError(f"`stop[{key!r}]` is {_show(value)}, but must be a finite number (the threshold)")
        if key == metric and mode == "min":
            raise ValueError(f"`stop[{key!r}]` is {value!r}, but a `stop` dict stops a config once a value is >= its "
                             f"threshold (Ray Tune's rule) and the run minimises {metric!r}: use "
                             f"MetricThresholdStopper({key!r}, {value!r}, mode='min')")
        out.append(MetricThresholdStopper(key, value, mode="max"))
    return out


def make_stopper(stop: Any, metric: str = "valid_loss", mode: str = "min") -> Stopper | None:
    """`ModelSelection(stop=...)` as one `Stopper` (None: no stopper): a `Stopper`; a dict of thresholds (keys
    `epochs`/`training_iteration`: epochs finished; `train_*`/`valid_*` metrics: stop once a value is >= the
    threshold, Tune's rule; the run's own `metric` when `mode` is "min" is refused, as it would stop at once); a
    function `fn(config_id, result) -> bool`; or a list of these (any one stops). Raises `TypeError`/`ValueError`
    naming what is wrong."""
    if stop is None or isinstance(stop, Stopper):
        return stop
    if isinstance(stop, Mapping):
        parts = _from_dict(stop, metric, mode)
        return parts[0] if len(parts) == 1 else CombinedStopper(*parts)
    if isinstance(stop, Sequence) and not isinstance(stop, (str, bytes)):
        if not stop:
            raise ValueError("`stop` is an empty list, but must hold at least one stopper (or be None)")
        parts = [make_stopper(s, metric, mode) for s in stop]
        return parts[0] if len(parts) == 1 else CombinedStopper(*parts)
    if callable(stop):
        return FunctionStopper(stop)
    raise TypeError(f"`stop` is {stop!r}, but must be a framework.stoppers.Stopper, a dict of thresholds (e.g. "
                    "{'epochs': 10, 'valid_acc': 0.98}), a function fn(config_id, result) -> bool, a list of these, "
                    "or None")


# ---- reading what a run's stoppers did (from its events; `Result` and `modelhopper status` read them) -------------
def event_detail(text: Any) -> dict[str, Any]:
    """An event's detail as a dict; {} for text that is not a JSON object (a run directory may be hostile)."""
    try:
        d = json.loads(text)
    except (TypeError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}


def ended_by(events: Sequence[tuple[str, str]]) -> str | None:
    """Why a run's last session ended before the run finished: its time budget (e.g. `"time_budget_s=60"`), from a
    `time_budget_spent` event, or the local service it was attached to going down (`"service_stopping"`, from that
    event), that no `resumed` event follows; else None. `events`: (kind, detail JSON) in log order."""
    last = None
    for kind, detail in events:
        if kind == "service_stopping":
            last = "service_stopping"
        elif kind == "time_budget_spent":
            last = detail
        elif kind == "resumed":
            last = None
    if last is None or last == "service_stopping":
        return last
    d = event_detail(last)
    budget, by = d.get("budget_s"), str(d.get("by", "time_budget_s"))
    return f"{by}={budget:g}" if _is_number(budget) else by


def stop_reasons(events: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """What the run's stopper stopped, in log order: `{"config_id", "epochs", "reason"}` per config
    (`config_stopped` events), and `config_id` None for a run-wide stop (`run_stopped`)."""
    out = []
    for kind, detail in events:
        if kind in ("config_stopped", "run_stopped"):
            d = event_detail(detail)
            out.append({"config_id": d.get("config_id"), "epochs": d.get("epochs"), "reason": d.get("reason")})
    return out
