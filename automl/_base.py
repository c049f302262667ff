"""The procedure contract: the extension point for model-selection procedures (no Ray, no torch).

The engine trains in *rounds*. It calls `procedure.step([])` once at the start, then after every round (epoch
barrier) `procedure.step(states)` with the state of every config it has ever seen. Every config that is active and
not stopped trains one more epoch in the next round; new configs (`add`, `clone`) join the next round. The run ends
when no config is active and the procedure adds nothing.

Ids: the engine numbers configs from 0 in the order they appear: a decision's new configs get the ids `len(states)`,
`len(states) + 1`, ... (every `add` entry in order, then every `clone` entry), where `states` is what that `step`
was given. Procedures may rely on this to know the id of a config they asked for (`check_states` verifies the
numbering). Predict ids from `len(states)`, not from a count of your own: a person may add configs between steps.

Configs a person steers (`framework.connect`: add, clone, stop, resume): a config a person added, cloned or resumed
is the person's (`ConfigState.owner == PERSON`). The procedure sees it in `states` (its `origin` says who added it)
but does not decide about it: it trains until the person stops it or it reaches its own epoch budget (the command's
`epochs`, by default the procedure's `epochs_per_config()`), and a procedure's `stop` of it is ignored. A config a
person stopped is STOPPED with `outcome` "stopped"; the procedure sees it so and treats it as any stopped config.
Every procedure here says in its docstring how configs a person added or stopped count towards its own rules.

Clones (PBT): `Decision.clone=[(source_id, config)]` starts a new config, with a new id and `parent=source_id`, from
the source's latest weights (after the source's last completed epoch). Its `epochs` and `history` count only what
the clone itself trained, so they restart at 0; a procedure that needs the lineage's epoch count keeps the offset
(see `automl.pbt.PBT`). The source is not stopped by cloning; stop it explicitly if it should stop.

`simulators.run_procedure_offline` runs a procedure by exactly this contract, on the engine's own driver loop.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field
from typing import Any

from automl._checks import check_int, json_exact

ACTIVE = "active"  # will train in the next round
STOPPED = "stopped"  # stopped by the procedure (early stopping or end of its budget); keeps weights and metrics
FAILED = "failed"  # user code raised or returned a NaN loss
STATUSES = (ACTIVE, STOPPED, FAILED)
PROCEDURE = "procedure"  # who added or steers a config: the procedure ...
PERSON = "person"  # ... or a person, through a command (`framework.connect`, the CLI, the dashboard)
OWNERS = (PROCEDURE, PERSON)


@dataclass(frozen=True)
class ConfigState:
    """What a procedure sees of one config.

    Attributes:
        id: the engine's id of the config (stable for the whole run).
        config: the user's hyper-parameter dict.
        epochs: epochs completed so far.
        history: one metrics dict per completed epoch (`train_*` and `valid_*` keys, example-weighted means).
        status: one of `ACTIVE`, `STOPPED`, `FAILED`.
        parent: id of the config it was cloned from (PBT), else None.
        origin: who added it: `PROCEDURE` (a decision of this procedure) or `PERSON` (a command).
        owner: who decides about it now: `PROCEDURE`, or `PERSON` for a config a person added, cloned or resumed
            (the procedure leaves it alone: see the module docstring).
    """

    id: int
    config: dict[str, Any]
    epochs: int = 0
    history: tuple[dict[str, float], ...] = ()
    status: str = ACTIVE
    parent: int | None = None
    origin: str = PROCEDURE
    owner: str = PROCEDURE

    def __post_init__(self) -> None:
        if self.origin not in OWNERS or self.owner not in OWNERS:
            raise ValueError(f"`origin` and `owner` are {self.origin!r} and {self.owner!r}, but each must be one of "
                             f"{OWNERS}")
        if self.status not in STATUSES:
            raise ValueError(f"`status` is {self.status!r}, but must be one of {STATUSES}")
        if self.epochs != len(self.history):
            raise ValueError(f"`epochs` is {self.epochs}, but `history` has {len(self.history)} entries")

    def last(self, metric: str, default: float = math.nan) -> float:
        """The latest value of `metric`, or `default` when the config has not reported it."""
        return float(self.history[-1].get(metric, default)) if self.history else default


@dataclass(frozen=True)
class Decision:
    """What a procedure asks of the engine after a round.

    Every config of `add` and `clone` is checked and converted by `automl.json_exact` (what a run can record and
    read back exactly): a config that holds anything else raises here, naming it.

    Attributes:
        add: new configs to start from scratch.
        stop: ids of active configs to stop (they keep their weights and metrics).
        clone: `(source_id, new_config)` pairs; each starts a new config from the source's latest weights (PBT).
        pruned: the ids in `stop` that are stopped early for their results (a lost rung of ASHA or HyperBand, PBT's
            bottom quantile); the rest of `stop` completed their budget. `Result.status` says `pruned` or
            `completed` accordingly.
        resume: ids of STOPPED configs to train again, from their latest weights, continuing their epoch count
            (a procedure whose budget grew, `Procedure.extend`). A resumed config that stopped in the middle of an
            epoch (a person's stop) finishes that epoch first.
    """

    add: list[dict[str, Any]] = field(default_factory=list)
    stop: list[int] = field(default_factory=list)
    clone: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    pruned: list[int] = field(default_factory=list)
    resume: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        for c in self.add:
            if not isinstance(c, dict):
                raise TypeError(f"`add` holds {c!r}, but every entry must be a config dict")
        for pair in self.clone:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[1], dict)):
                raise TypeError(f"`clone` holds {pair!r}, but every entry must be (source_id, config dict)")
        # a config holds JSON values only, as the run records them (numpy numbers become Python ones; the rest is
        # refused here, before anything is written): what model_fn gets in the run is what it gets on replay
        object.__setattr__(self, "add", [json_exact(f"add[{i}]", c) for i, c in enumerate(self.add)])
        object.__setattr__(self, "clone", [(s, json_exact(f"clone[{i}] config", c))
                                           for i, (s, c) in enumerate(self.clone)])
        extra = sorted(set(self.pruned) - set(self.stop))
        if extra:
            raise ValueError(f"`pruned` holds {extra}, but every pruned id must also be in `stop` ({self.stop})")


class Procedure(abc.ABC):
    """Base class of model-selection procedures.

    Subclasses implement `step`. The engine guarantees:

        * `step([])` is the first call; later calls get every config ever added, in id order;
        * a config listed as ACTIVE trained exactly `epochs` epochs, one per round it was active (with
          `synchronous = False`: `epochs` finished epochs, and it may be training its next one);
        * `step` is called from one thread, never concurrently: between rounds, or after each epoch end when the
          procedure is not `synchronous`;
        * `bind(metric, mode, storage_path, num_workers=...)` is called once before the first `step` (again, with
          the same arguments, after a resume);
        * `workers_changed(n)` is called, between steps, whenever the number of live workers changes (a worker
          joined, was lost for good, or drained).

    A procedure must not return ids it has not seen, nor re-activate stopped configs other than through
    `Decision.resume`, and should be deterministic given its seed and the sequence of states (so runs replay and
    resume). It must pickle (it is saved with the run).
    """

    #: Whether the procedure needs the epoch barrier. True (the default, and what grid search, HyperBand and PBT
    #: need): `step` is called once every active config has finished its epoch of the round. False (ASHA, TPE):
    #: `step` is called each time one config finishes an epoch (or fails), with every config's current state, so a
    #: config's next epoch starts as soon as the procedure has decided about it; configs listed as ACTIVE may then
    #: be in the middle of an epoch, and `epochs` counts only their finished ones. A stop of a config that is in the
    #: middle of an epoch takes effect when that epoch ends.
    synchronous: bool = True

    #: The metric the procedure ranks by and its direction; the engine fills them from `ModelSelection(metric, mode)`
    #: unless the procedure was constructed with its own.
    metric: str = "valid_loss"
    mode: str = "min"

    @abc.abstractmethod
    def step(self, states: list[ConfigState]) -> Decision:
        """Decide which configs to add, stop or clone after a round (see the class docstring)."""

    def epochs_per_config(self) -> int | None:
        """The epochs one config trains at most under this procedure (its per-config budget), or None when it has
        none. A config a person adds or resumes without saying how long trains this many epochs."""
        return None

    def completes_budget(self, state: ConfigState) -> bool:
        """Whether `state`'s latest epoch completed the config's budget under this procedure (what it would stop
        as completed now). The engine asks it when the run's stopper stops a config at an epoch end: one that
        completed its budget there reads `completed`, not `stopped` (the budget wins). The default: it trained
        `epochs_per_config()` epochs (never, when the procedure has no per-config budget)."""
        budget = self.epochs_per_config()
        return budget is not None and state.epochs >= budget

    def extend(self, epochs: int | None = None, samples: int | None = None) -> str:
        """A person grows the budget while the run goes on: `epochs` more epochs per config, `samples` more configs.
        Returns what changed (one line); raises `ValueError` naming what this procedure cannot extend. The new
        budget acts at the next `step` (configs that completed the old budget come back through
        `Decision.resume`). The default extends nothing."""
        raise ValueError(f"{type(self).__name__} cannot extend its budget (epochs={epochs!r}, samples={samples!r})")

    def planned_epochs(self) -> int | None:
        """Config-epochs the procedure will train when nothing fails (the progress bar's total), or None when it
        depends on results or time (ASHA). Only a hint: nothing relies on it being exact."""
        return None

    #: Set by `claim` when a run takes the procedure: a procedure holds the state of one run (its configs, its
    #: rungs, its study), so another run of the same object is refused (a resume continues the run it belongs to).
    _engine_started: bool = False

    def claim(self) -> None:
        """Called by the engine once, when a new run takes the procedure (before its first `step`; a resume of the
        run does not call it). Raises `ValueError` when a run took it before: the procedure holds that run's state."""
        if self._engine_started:
            raise ValueError(f"`procedure` ({type(self).__name__}) has already run: it holds the state of that run; "
                             "pass a new one (or resume that run)")
        self._engine_started = True

    #: The run's storage directory (Optuna studies live there) and the engine's concurrency hint, set by `bind`.
    storage_path: str | None = None
    num_workers: int | None = None

    def bind(self, metric: str, mode: str, storage_path: str | None = None, *, num_workers: int | None = None) -> None:
        """Called once by the engine before the first `step` (and again with the same arguments on resume).

        Args:
            metric: the run's metric (a `train_*`/`valid_*` key of the history dicts). Ignored when the procedure
                set its own `metric` in its constructor (an instance attribute wins over the run's).
            mode: "min" or "max"; same rule as `metric`.
            storage_path: the run's storage directory; procedures that keep an Optuna study put `optuna.db` there.
                None keeps everything in memory.
            num_workers: how many configs the engine can train at once (its workers); a hint that procedures that
                keep a fixed number of configs running (ASHA, TPE) use as their concurrency. None when unknown.

        Subclasses that override `bind` must call `super().bind(...)`.
        """
        if mode not in ("min", "max"):
            raise ValueError(f"`mode` is {mode!r}, but must be 'min' or 'max'")
        if num_workers is not None and (
            isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1
        ):
            raise ValueError(f"`num_workers` is {num_workers!r}, but must be None or an int >= 1")
        own = vars(self)
        if "metric" not in own or own.get("_metric_from_bind", False):
            self.metric, self.mode = metric, mode
            self._metric_from_bind = True
        self.storage_path = storage_path
        self.num_workers = num_workers

    def workers_changed(self, num_workers: int) -> None:
        """The engine now has `num_workers` live workers (after a scale event or the loss of a worker).

        The default updates `self.num_workers`, the concurrency hint ASHA and TPE read at every `step`. Subclasses
        that override it must call `super().workers_changed(num_workers)`.
        """
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"`num_workers` is {num_workers!r}, but must be an int >= 0")
        self.num_workers = num_workers or None

    def score(self, state: ConfigState, epochs: int | None = None) -> float:
        """The state's metric as a value to maximise (NaN-safe: missing or NaN ranks last).

        The latest value by default; with `epochs`, the value after that many epochs (-inf if it has not got there).
        """
        if epochs is None:
            v = state.last(self.metric)
        elif 1 <= epochs <= state.epochs:
            v = float(state.history[epochs - 1].get(self.metric, math.nan))
        else:
            v = math.nan
        if math.isnan(v):
            return -math.inf
        return -v if self.mode == "min" else v

    def rank(self, states: list[ConfigState], epochs: int | None = None) -> list[int]:
        """Ids of `states`, best first by `score(state, epochs)`; ties (and missing values) go to the smaller id."""
        return [s.id for s in sorted(states, key=lambda s: (-self.score(s, epochs), s.id))]


class FixedEpochsProcedure(Procedure):
    """Helper base for procedures that add configs once and train each for a fixed number of epochs."""

    def __init__(self, epochs: int) -> None:
        if not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"`epochs` is {epochs!r}, but must be an int >= 1")
        self.epochs = check_int("epochs", epochs, 1)  # (and at most an int64)
        self._started = False
        self._done: set[int] = set()

    @abc.abstractmethod
    def configs(self) -> list[dict[str, Any]]:
        """Every config to train."""

    def planned_epochs(self) -> int:
        return len(self.configs()) * self.epochs

    def epochs_per_config(self) -> int:
        return self.epochs

    def extend(self, epochs: int | None = None, samples: int | None = None) -> str:
        """`epochs` more per config: configs that completed the old budget train on (configs a person added keep
        their own budget). A fixed set of configs takes no more samples."""
        if samples is not None:
            raise ValueError(f"`samples` is {samples!r}, but {type(self).__name__} trains a fixed set of configs: it "
                             "can only extend `epochs`")
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"`epochs` is {epochs!r}, but must be an int >= 1")
        self.epochs = check_int("epochs", self.epochs + epochs, 1)  # (the budget, extended, fits an int64)
        return f"every config now trains {self.epochs} epochs"

    def step(self, states: list[ConfigState]) -> Decision:
        configs = self.configs()
        if not self._started:
            self._started, self._issued = True, len(configs)
            return Decision(add=configs)
        add = configs[vars(self).get("_issued", len(configs)):]  # more samples (`extend`)
        self._issued = len(configs)
        mine = [s for s in states if s.owner == PROCEDURE]
        stop = [s.id for s in mine if s.status == ACTIVE and s.epochs >= self.epochs]
        done = vars(self).setdefault("_done", set())  # ids it stopped at its budget: what an extension resumes
        resume = [s.id for s in mine if s.status == STOPPED and s.id in done and s.epochs < self.epochs]
        done.difference_update(resume)
        done.update(stop)
        return Decision(add=add, stop=stop, resume=resume)


def check_states(states: list[ConfigState], issued: int) -> None:
    """Raise when `states` is not what the engine promised: ids 0..len(states)-1 in order, `issued` of them added by
    the procedure (the rest a person added).

    Procedures that predict ids (a decision's new configs get ids from `len(states)` on, `add` entries first) call
    this at the top of `step` so a mismatch fails loudly instead of misattributing results.
    """
    own = sum(s.origin == PROCEDURE for s in states)
    if own != issued or any(s.id != i for i, s in enumerate(states)):
        ids = [s.id for s in states]
        raise RuntimeError(f"`states` has ids {ids} ({own} added by the procedure), but the procedure issued {issued} "
                           "configs and ids must be 0, 1, ... in order")


def own_active(states: list[ConfigState]) -> list[ConfigState]:
    """The ACTIVE configs the procedure decides about (those a person steers are left out)."""
    return [s for s in states if s.status == ACTIVE and s.owner == PROCEDURE]
