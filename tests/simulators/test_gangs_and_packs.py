"""Gangs (one unit on several workers) and packs (several configs hopping as one) through the real driver, on the
simulator's backend, with hand-written assignments: the schedule keeps one row per (config, worker) naming its
group, the validator and the driver's completeness check pass. Today's live backends refuse them clearly."""

from __future__ import annotations

import numpy as np
import pytest

import automl
from framework.driver import Driver, MemoryRunLog
from framework.engine.local import LocalBackend
from framework.options import RunOptions
from framework.scheduling import TRAIN, Assignment, DispatchState, Scheduler, Unit, UnitTask
from simulators import Workload, validate_schedule
from simulators.backend import CostModel, SimulatedBackend

PACK = (0, 1, 2)  # configs that hop together
GANGED = (3, 4)  # configs trained by gangs of two


class GangsAndPacks(Scheduler):
    """Configs 0-2 as one pack on any holder; configs 3 and 4 each on both holders of a partition."""

    name = "gangs-and-packs"

    def select(self, state: DispatchState) -> list[Assignment]:
        out: list[Assignment] = []
        taken: set[int] = set()
        for w in state.idle_workers():
            pack = next((Assignment(u, (w,), PACK) for u in state.eligible(w) if u.config_id == PACK[0]), None)
            if pack is not None and state.can_start(pack):
                out.append(pack)
                taken.add(w)
                break
        for c in GANGED:
            for u in state.remaining(c):
                holders = sorted(state.availability[u.partition] - taken - state.busy_workers)
                gang = Assignment(u, tuple(holders[:2])) if len(holders) >= 2 else None
                if gang is not None and state.can_start(gang):
                    out.append(gang)
                    taken.update(gang.workers)
                    break
        return out


def _workload() -> Workload:
    times = np.random.default_rng(0).uniform(1, 10, size=(5, 6))
    availability = {q: (q, q + 3) for q in range(3)} | {3: (0, 1, 2, 3, 4, 5)}  # 3 train partitions x 2, 1 eval
    return Workload(times, availability, eval_partitions=(3,))


def _run(cost: CostModel) -> tuple[MemoryRunLog, Workload]:
    w = _workload()
    log = MemoryRunLog()
    options = RunOptions(scheduler=GangsAndPacks(), queue_depth=1)
    backend = SimulatedBackend(w, cost=cost, objective=lambda config, epoch: {"valid_loss": 1.0 / (1 + epoch)})
    driver = Driver(backend, automl.GridSearch({"x": list(range(5))}, epochs=2), log,
                    {k: [q for q, ws in w.availability.items() if k in ws] for k in range(6)}, [0, 1, 2], options,
                    eval_partitions=[3], estimate=w.duration)
    driver.run()  # ends with the driver's completeness check
    return log, w


def test_gangs_of_two_and_packs_of_three_pass_the_validator_through_the_real_driver():
    log, w = _run(CostModel(comm_s=0.5, pack_overhead=0.5))
    s = log.schedule()
    assert validate_schedule(s, w.availability, partitions=[0, 1, 2], eval_partitions=[3], raise_on_error=True).ok
    packs = s[s.config_id.isin(PACK)]
    gangs = s[s.config_id.isin(GANGED)]
    # every pack unit is three rows (one per member) on one worker; every gang unit two rows (one per worker)
    assert (packs.groupby("group").config_id.apply(sorted).map(tuple) == PACK).all()
    assert (packs.groupby("group").worker.nunique() == 1).all()
    assert (gangs.groupby("group").worker.nunique() == 2).all() and (gangs.groupby("group").config_id.nunique() == 1).all()
    # each config trained 2 epochs x 3 partitions and evaluated once per epoch, as one visit per unit of work
    visits = s.drop_duplicates(["config_id", "group"])
    assert visits.groupby("config_id").size().to_dict() == {c: 8 for c in range(5)}
    # the cost model: a gang's pass is split in two plus the all-reduce
    u = gangs[gangs.kind == TRAIN].iloc[0]
    workers = tuple(gangs[gangs.group == u.group].worker)
    expected = max(w.duration(Unit(int(u.config_id), 0, int(u.partition)), k) for k in workers) / 2 + 0.5
    assert u.end - u.start == pytest.approx(expected)


def test_a_pack_costs_its_longest_member_plus_the_overhead_share_of_the_rest():
    cost = CostModel(pack_overhead=0.25)
    t = {0: 4.0, 1: 2.0, 2: 1.0}
    units = tuple(Unit(c, 0, 0) for c in t)
    assert cost.seconds(lambda u, w: t[u.config_id], units, (0,)) == pytest.approx(4.0 + 0.25 * 3.0)


def test_the_validator_catches_a_gang_that_overlaps_a_pack_on_its_worker():
    log, w = _run(CostModel())
    s = log.schedule()
    pack = s[s.config_id.isin(PACK)].iloc[0]
    gang = s[(s.config_id == GANGED[0]) & (s.kind == TRAIN)].group.iloc[-1]
    rows = s.index[s.group == gang]
    s.loc[rows, ["start", "end"]] = [pack.start, pack.end]
    s.loc[rows[:1], "worker"] = pack.worker  # still a consistent gang, now on the pack's worker at the same time
    report = validate_schedule(s)
    assert not report.ok and any(f"worker {pack.worker}:" in v for v in report.violations)


def test_the_local_backend_takes_packs_and_refuses_gangs_with_a_clear_error():
    pack = UnitTask(Unit(0, 0, 0), {}, 0, members=(0, 1, 2))
    assert isinstance(LocalBackend().submit((0,), pack, (None, None, None)), int)  # run member by member
    with pytest.raises(NotImplementedError, match=r"LocalBackend runs workers in one process, so not a gang of "
                                                  r"workers \(0, 1\): RayBackend runs gangs"):
        LocalBackend().submit((0, 1), UnitTask(Unit(0, 0, 0), {}, 0), (None,))
