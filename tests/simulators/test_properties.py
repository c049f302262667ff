"""Properties of every scheduler name on the simulators' public API (Hypothesis): `simulate(workload, name, ...)` and
`simulate_selection(procedure, workload, objective, scheduler=name, ...)` at the magnitudes and seeds users give
them: unit times from 1e-3 to 1e5 s (log-uniform, or one unit 1e4x longer than the rest), seeds 0-9 and up to
2**63 - 1, replicas, a validation partition, queue depth 1 and 2, 1-2 epochs, worker failures and returns, and
grid search, HyperBand and ASHA deciding.

Every run finishes, its schedule passes `validate_schedule` (availability, completeness, isolation, exclusivity,
barriers), holds every unit of the run exactly once (failures included) and its makespan is at least
`lower_bound`. No absolute times are asserted.

The examples are derandomized (the same on every run). `MODELHOPPER_FUZZ_EXAMPLES=N` runs N random examples per
property instead, to hunt for new counterexamples; one found that way goes into an `@example`.

The exact planners (cpsat, milp) keep their names (the driver rebuilds them from (seed, wave) every round, as a
user's `scheduler="cpsat"` would) but run under a 0.2 s limit per round in the properties: with unit times spread
over 1e-3..1e5 s CP-SAT often runs a 5x4 instance to its default 10 s per round (it scales the shortest unit to 1000
ticks, so the longest is ~1e11 ticks), and a properties run of the defaults would take minutes. A limited plan is only
"feasible", which every property here allows. The Taillard tests at the end run both with their defaults.
"""

from __future__ import annotations

import contextlib
import functools
import os

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import automl
from framework.scheduling import SCHEDULERS
from simulators import FAIL, RETURN, WorkerEvent, Workload, lower_bound, simulate, simulate_selection, validate_schedule
from tests.simulators.test_public_api import TA4X4_1

NAMES = sorted(SCHEDULERS)
EXACT = ("cpsat", "milp", "planner")
EXACT_LIMIT_S = 0.2
REL = 1e-9  # the lower bound's relative tolerance

_EXAMPLES = int(os.environ.get("MODELHOPPER_FUZZ_EXAMPLES", "8"))
PROPERTIES = settings(max_examples=_EXAMPLES, deadline=None, derandomize="MODELHOPPER_FUZZ_EXAMPLES" not in os.environ,
                      database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

SEEDS = st.one_of(st.integers(0, 9), st.integers(2**31, 2**63 - 1), st.sampled_from([2**32, 2**63 - 1]))


# ---- strategies ---------------------------------------------------------------------------------------------------
@st.composite
def unit_times(draw, n_configs: int, n_workers: int) -> np.ndarray:
    """(n_configs, n_workers) seconds in [1e-3, 1e5]: log-uniform over the whole range, or one unit 1e4x longer than
    every other (the others equal, or log-uniform over one decade)."""
    cells = n_configs * n_workers
    if draw(st.booleans()):
        exps = draw(st.lists(st.floats(-3.0, 5.0), min_size=cells, max_size=cells))
        return 10.0 ** np.array(exps).reshape(n_configs, n_workers)
    base = 10.0 ** draw(st.floats(-3.0, 0.0))
    spread = draw(st.lists(st.floats(0.0, 1.0), min_size=cells, max_size=cells)) if draw(st.booleans()) else [0.0] * cells
    times = base * 10.0 ** np.array(spread).reshape(n_configs, n_workers)
    long = times.max() * 1e4
    times[draw(st.integers(0, n_configs - 1)), draw(st.integers(0, n_workers - 1))] = long
    return times


@st.composite
def workloads(draw, n_configs: int | None = None) -> Workload:
    """1-5 configs x 1-4 workers; 1-4 training partitions (partition q at worker q mod p, maybe also on a second
    worker: a replica) and 0-1 validation partition (on one or two workers)."""
    n_configs = n_configs or draw(st.integers(1, 5))
    n_workers, n_train, n_eval = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(0, 1))
    times = draw(unit_times(n_configs, n_workers))
    availability = {}
    for q in range(n_train + n_eval):
        home = q % n_workers if q < n_train else draw(st.integers(0, n_workers - 1))
        holders = {home}
        if n_workers > 1 and draw(st.booleans()):
            holders.add(draw(st.sampled_from([w for w in range(n_workers) if w != home])))
        availability[q] = tuple(sorted(holders))
    return Workload(times, availability, tuple(range(n_train, n_train + n_eval)))


@st.composite
def fail_return_events(draw, w: Workload, epochs: int = 1) -> list[WorkerEvent]:
    """Per worker 0-2 FAIL/RETURN pairs (at least one FAIL in all), every worker back in the end, so nothing stalls.

    A gap is a fraction of the run's lower bound, or exactly one of the worker's unit times, so that a failure often
    coincides with a unit's end."""
    span = lower_bound(w, epochs=epochs)

    def gap(worker: int, least: float) -> float:
        if draw(st.booleans()):
            return float(w.times[draw(st.integers(0, w.n_configs - 1)), worker])
        return span * draw(st.floats(least, 1.0))

    events = []
    for worker in range(w.n_workers):
        t = 0.0
        for _ in range(draw(st.integers(1 if worker == 0 else 0, 2))):
            t += gap(worker, 0.0)
            events.append(WorkerEvent(t, worker, FAIL))
            t += gap(worker, 1e-3)
            events.append(WorkerEvent(t, worker, RETURN))
    return events


@st.composite
def failure_runs(draw) -> tuple[Workload, list[WorkerEvent], int]:
    w, epochs = draw(workloads()), draw(st.integers(1, 2))
    return w, draw(fail_return_events(w, epochs)), epochs


#: what a selection runs: ("grid", values, epochs), ("hyperband", max_epochs, eta) or ("asha", max_configs)
PROCEDURES = st.one_of(
    st.tuples(st.just("grid"), st.integers(1, 5), st.integers(1, 2)),
    st.sampled_from([("hyperband", 3, 3), ("hyperband", 2, 2)]),  # 5 and 4 configs
    st.tuples(st.just("asha"), st.integers(1, 5)),
)


def _n_configs(what: tuple) -> int:
    if what[0] == "hyperband":
        return sum(b.rungs[0].n for b in automl.hyperband_brackets(what[1], what[2]))
    return what[1]


def _procedure(what: tuple, seed: int) -> automl.Procedure:
    """A new procedure object (one runs only once); `seed` seeds its sampler."""
    space = {"x": automl.uniform(0.0, 1.0)}
    if what[0] == "grid":
        return automl.GridSearch({"x": list(range(what[1]))}, epochs=what[2])
    if what[0] == "hyperband":
        return automl.HyperBand(space, max_epochs=what[1], eta=what[2], seed=seed)
    return automl.ASHA(space, max_epochs=3, eta=3, max_configs=what[1], seed=seed)


@st.composite
def selections(draw) -> tuple[tuple, Workload, list[WorkerEvent]]:
    what = draw(PROCEDURES)
    w = draw(workloads(n_configs=_n_configs(what)))
    return what, w, draw(fail_return_events(w)) if draw(st.booleans()) else []


def _objective(config: dict, epoch: int) -> dict[str, float]:
    x = float(config["x"])
    return {"valid_loss": (1.0 + x) / (1.0 + epoch), "train_loss": (0.5 + x) / (1.0 + epoch)}


# ---- checks -------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _named(name: str):
    """`name` as `simulate` builds it by name, the exact planners with a short time limit (module docstring)."""
    with pytest.MonkeyPatch.context() as mp:
        if name in EXACT:
            mp.setitem(SCHEDULERS, name, functools.partial(SCHEDULERS[name], time_limit_s=EXACT_LIMIT_S))
        yield name


def _units(df) -> list[tuple]:
    return sorted(df[["config_id", "epoch", "partition", "kind"]].itertuples(index=False, name=None))


def _expected(w: Workload, epochs_of: dict[int, int]) -> list[tuple]:
    units = (u for c, n in epochs_of.items() for e in range(n) for u in w.units(e, [c]))
    return sorted((u.config_id, u.epoch, u.partition, u.kind) for u in units)


def _dead_intervals(events: list[WorkerEvent]) -> list[tuple[int, float, float]]:
    """(worker, from, to) while a worker is down: from a FAIL to its RETURN."""
    down, out = {}, []
    for e in sorted(events, key=lambda e: e.time):
        if e.kind == FAIL and e.worker not in down:
            down[e.worker] = e.time
        elif e.kind == RETURN and e.worker in down:
            out.append((e.worker, down.pop(e.worker), e.time))
    return out + [(w, t, float("inf")) for w, t in down.items()]


def _visits(df):
    """One row per visit: a gang's rows (one per member worker, sharing a `group`) count once."""
    grouped = df[df["group"].notna()].drop_duplicates(["config_id", "epoch", "partition", "kind", "group"])
    return pd.concat([df[df["group"].isna()], grouped])


def _check(w: Workload, r, epochs_of: dict[int, int], bound: float, events: list[WorkerEvent] = ()) -> None:
    """Valid, every unit of the run exactly once, nothing on a worker while it is down, above the lower bound."""
    validate_schedule(r.schedule, w.availability, w.train_partitions, w.eval_partitions, raise_on_error=True)
    expected = _expected(w, epochs_of)
    visits = _visits(r.schedule)
    assert len(visits) == len(expected)
    assert _units(visits) == expected
    for worker, down, up in _dead_intervals(list(events)):
        rows = r.schedule[r.schedule["worker"] == worker]
        assert not ((rows["start"] < up) & (rows["end"] > down)).any(), (worker, down, up)
    assert len(r.failed) == len(r.requeued)
    if not events:
        assert len(r.failed) == 0
    assert r.makespan == pytest.approx(float(r.schedule["end"].max()), rel=REL)
    if r.schedule["group"].isna().all():  # the bound is one worker per unit's; a gang shares a unit's pass
        assert r.makespan >= bound * (1 - REL), (r.makespan, bound)


def _sub(w: Workload, ids: list[int]) -> Workload:
    return Workload(w.times[ids], w.availability, w.eval_partitions, w.eval_fraction)


def _selection_bound(w: Workload, epochs_of: dict[int, int], synchronous: bool) -> float:
    """With the epoch barrier, round e holds epoch e of every config that got that far: the sum of their bounds.
    Without it, every config's own bound and all configs' bound for the epochs each of them trained at least."""
    ran = [c for c, n in epochs_of.items() if n > 0]
    if synchronous:
        return sum(lower_bound(_sub(w, [c for c in ran if epochs_of[c] > e])) for e in range(max(epochs_of.values())))
    own = [lower_bound(_sub(w, [c]), epochs=epochs_of[c]) for c in ran]
    return max([lower_bound(_sub(w, ran), epochs=min(epochs_of[c] for c in ran)), *own])


# explicit cases every run covers, whatever Hypothesis draws: replicas, a validation partition, both queue depths,
# the largest seed, one unit 1e4x longer than the rest, and the whole 1e-3..1e5 range
_REPLICAS = Workload(np.array([[1e-3, 2e-3, 5e-3], [1e5, 3e4, 2.0], [0.5, 7.0, 1e2]]),
                     {0: (0, 1), 1: (1, 2), 2: (2,), 3: (0, 2)}, eval_partitions=(3,))
_LONG_ONE = Workload(np.where(np.arange(16).reshape(4, 4) == 15, 1e4, 1.0) * 1e-3, {q: (q,) for q in range(4)})


# ---- simulate ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
@PROPERTIES
@given(w=workloads(), seed=SEEDS, epochs=st.integers(1, 2), queue_depth=st.integers(1, 2))
@example(w=_REPLICAS, seed=2**63 - 1, epochs=2, queue_depth=2)
@example(w=_LONG_ONE, seed=0, epochs=1, queue_depth=1)
def test_simulate_finishes_valid_complete_and_above_the_bound(name, w, seed, epochs, queue_depth):
    with _named(name):
        r = simulate(w, name, seed=seed, epochs=epochs, queue_depth=queue_depth)
    _check(w, r, dict.fromkeys(range(w.n_configs), epochs), lower_bound(w, epochs=epochs))


@pytest.mark.parametrize("name", NAMES)
@PROPERTIES
@given(run=failure_runs(), seed=SEEDS, queue_depth=st.integers(1, 2))
@example(run=(_REPLICAS, [WorkerEvent(0.0, 1, FAIL), WorkerEvent(2.0, 1, RETURN), WorkerEvent(1e-3, 0, FAIL),
                          WorkerEvent(3e4, 0, RETURN)], 2), seed=2**63 - 1, queue_depth=2)
def test_simulate_with_worker_failures_runs_every_unit_exactly_once(name, run, seed, queue_depth):
    w, events, epochs = run
    with _named(name):
        r = simulate(w, name, seed=seed, epochs=epochs, queue_depth=queue_depth, events=events)
    _check(w, r, dict.fromkeys(range(w.n_configs), epochs), lower_bound(w, epochs=epochs), events)


# ---- simulate_selection -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
@PROPERTIES
@given(case=selections(), seed=SEEDS, queue_depth=st.integers(1, 2))
def test_simulate_selection_finishes_valid_complete_and_above_the_bound(name, case, seed, queue_depth):
    what, w, events = case
    procedure = _procedure(what, seed)
    with _named(name):
        r = simulate_selection(procedure, w, _objective, scheduler=name, seed=seed, events=events,
                               queue_depth=queue_depth)
    epochs_of = {int(c.config_id): int(c.epochs) for c in r.configs.itertuples()}
    assert sorted(epochs_of) == list(range(_n_configs(what)))
    assert set(r.configs["status"]) == {automl.STOPPED}
    if what[0] == "grid":
        assert set(epochs_of.values()) == {what[2]}
    _check(w, r, epochs_of, _selection_bound(w, epochs_of, procedure.synchronous), events)


# ---- Taillard ta4x4_1os at 1e5 s per time unit, each scheduler with its defaults ---------------------------------
# ten seeds each; three for the exact solvers (a seed only reorders their search, and a solve costs a second or two)
@pytest.mark.parametrize(("name", "seed"), [(n, s) for n in NAMES for s in range(3 if n in EXACT else 10)])
def test_every_scheduler_on_a_taillard_instance_in_days(name, seed):
    w = Workload(TA4X4_1 * 1e5, {q: (q,) for q in range(4)})
    r = simulate(w, name, seed=seed)
    _check(w, r, dict.fromkeys(range(4), 1), lower_bound(w))


# ---- known bugs ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_every_worker_failing_at_time_zero_waits_for_its_return(name):
    w = Workload(np.array([[1.0]]), {0: (0,)})
    events = [WorkerEvent(0.0, 0, FAIL), WorkerEvent(1.0, 0, RETURN)]
    with _named(name):
        r = simulate(w, name, events=events)
    _check(w, r, {0: 1}, lower_bound(w), events)


@pytest.mark.parametrize("seed", [2**32, 2**63 - 1])
def test_asha_takes_every_seed_the_others_take(seed):
    w = Workload(np.array([[1.0]]), {0: (0,)})
    r = simulate_selection(_procedure(("hyperband", 2, 2), seed), _sub(w, [0] * 4), _objective, seed=seed)
    assert len(r.schedule)  # HyperBand takes the seed
    procedure = automl.ASHA({"x": automl.uniform(0.0, 1.0)}, max_epochs=3, eta=3, max_configs=1, seed=seed)
    r = simulate_selection(procedure, w, _objective, seed=seed)
    _check(w, r, {0: int(r.configs["epochs"].iloc[0])}, lower_bound(w))
