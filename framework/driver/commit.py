"""Epoch ends, decisions and commits: where the procedure is asked and the run's progress becomes durable.

With a barrier (`Procedure.synchronous`, or `deterministic=True`), the procedure decides once every active
config has finished its epoch of the round; without one, each time one config finishes an epoch (or fails). Each
decision is applied by the config table's rules and committed in one transaction with the epochs that ended, every
config's status, the new configs and the procedure's state: the point a resume restarts from. Then the next units
open: every active config's next epoch (a barrier), or the finished config's next epoch and the new configs'.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import Any

from automl import ACTIVE, FAILED, Decision
from framework.driver import stopping
from framework.driver._state import RunState
from framework.driver.configs import ConfigRecord
from framework.driver.control import grow_into_free_resources
from framework.engine.recovery import resume_units
from framework.scheduling import EVAL, TRAIN, Unit
from framework.scheduling.units import UnitReport
from framework.store.catalog import parent_id
from framework.store.checkpoint import CorruptCheckpointError


def epoch_units(run: RunState, c: ConfigRecord) -> list[Unit]:
    """A config's units of its next epoch: one train unit per partition, then one eval unit per eval partition;
    those it has not done yet, when it stopped in the middle of the epoch and now trains again."""
    trained = set(c.visited.get(c.epoch, ()))
    evaluated = {r.unit.partition for r in c.reports if r.unit.kind != TRAIN and r.unit.epoch == c.epoch}
    return ([Unit(c.id, c.epoch, p, TRAIN) for p in run.workers.partitions if p not in trained]
            + [Unit(c.id, c.epoch, p, EVAL) for p in run.workers.eval_partitions if p not in evaluated])


def open_epochs(run: RunState, configs: list[ConfigRecord], units: list[Unit] | None = None) -> None:
    """Open the next epoch of `configs` (or just `units`, after a resume) as one wave of the dispatcher."""
    state = run.dispatch.state
    running = state.running if state is not None else {}
    if units is None:  # (a unit in flight, of a config a person stopped and resumed meanwhile, is not opened again)
        units = [u for c in configs for u in epoch_units(run, c) if u not in running]
    per_config: dict[int, int] = defaultdict(int)
    for u in [*units, *running]:
        per_config[u.config_id] += 1
    if state is not None:
        state.dropped.difference_update(c.id for c in configs)  # a unit in flight that must run again, runs again
    for c in configs:
        if c.open_epoch(per_config.get(c.id, 0)):  # nothing left to run (a resume after its last unit): it ends at once
            run.mark_ended(c.id)
    run.dispatch.open(units, run.workers.availability(), wave=run.round)
    run.observers.call("on_units_opened", len(units))


def settle(run: RunState) -> bool:
    """Close what has ended since the last call and decide about it. Returns True when it committed."""
    if run.synchronous:
        if not run.round_open or run.dispatch.flights or not run.dispatch.idle:
            return False
        ended = [run.configs[cid] for cid in run.take_ended() if run.configs[cid].status == ACTIVE]
        for c in ended:
            c.close_epoch()
        run.close_round()
        run.observers.call("on_round_end", run.round)
        decide(run, ended)
        open_epochs(run, run.configs.active())
        if run.configs.active():
            run.open_round()
        return True
    committed = False
    while run.ended:
        c = run.configs[run.pop_ended()]
        ended = []
        if c.status == ACTIVE and c.open == 0:
            c.close_epoch()
            ended.append(c)
        elif c.status != FAILED:
            continue
        new = decide(run, ended)
        opening = [c] if c.status == ACTIVE and c.open == 0 and c in ended else []
        opening += [n for n in new if n.status == ACTIVE]
        if opening:
            open_epochs(run, opening)
        committed = True
    return committed


def refill(run: RunState) -> bool:
    """An asynchronous run with nothing open, whose procedure has not decided since a person stopped configs (a stop
    frees a slot, but ends no epoch, so nothing asked the procedure to fill it): ask it now. True when it started
    or resumed configs (their units are open)."""
    opening = [c for c in decide(run, []) if c.status == ACTIVE]
    if opening:
        open_epochs(run, opening)
    return bool(opening)


def decide(run: RunState, ended: list[ConfigRecord]) -> list[ConfigRecord]:
    """Ask the procedure, apply its decision, commit it with the epochs that `ended`; returns the configs whose
    units the caller opens besides those that ended: the new ones, then those it resumed."""
    run.run_deferred()  # every unit of the epochs that ended is logged (and its checkpoint queued) first
    t0 = time.perf_counter()
    was_stopped = stopping.run_stopped(run)
    stopped = stopping.stop_ended(run, ended)  # the run's stopper first: the procedure sees what it stopped
    run.procedure_asked()
    decision = Decision() if stopping.run_stopped(run) else run.procedure.step(run.configs.views())
    new = run.configs.apply(decision, type(run.procedure).__name__)
    ended_ids = {c.id for c in ended}  # (one of those the decision resumes opens with them)
    resumed = [run.configs[cid] for cid in dict.fromkeys(decision.resume) if cid not in ended_ids]
    for c in resumed:  # its weights, where the driver holds none (it stopped before a resume of the run)
        try:
            latest_state(run, c)
        except CorruptCheckpointError as e:
            _cannot_resume(run, c, f"the procedure resumed it, but {e}", readable=False)
    for c in new:
        if c.parent is None:
            continue
        src = run.configs[c.parent]
        handle = src.epoch_state if src.epoch_state is not None else src.state
        if handle is not None:  # the clone's own epochs start at 0: it inherits weights, not visits
            c.start_from(run.backend.put({**run.backend.get(handle), "visited": {}}))
            run.checkpoint(c, 0, 0, c.state, None)
    for c in ended:
        if c.status != ACTIVE:
            run.checkpoint_final(c)
    t1 = time.perf_counter()
    run.log.flush()  # every state the commit counts on (epoch ends, a clone's start) is on disk first
    t2 = time.perf_counter()
    run.log.commit(
        run.round,
        epochs=[(c.id, len(c.history) - 1, c.history[-1]) for c in ended],
        statuses=[(c.id, c.status, len(c.history), c.outcome) for c in run.configs if c.status != FAILED],
        new_configs=[(c.id, c.config, c.parent, run.round + 1) for c in new],
        procedure=run.procedure,
    )
    t3 = time.perf_counter()
    run.event("round_committed", round=run.round, decide_s=round(t1 - t0, 6), flush_s=round(t2 - t1, 6),
              commit_s=round(t3 - t2, 6))
    stopping.log_stops(run, stopped, first=stopping.run_stopped(run) and not was_stopped)
    # what the observers see is committed: a resume never shows them an epoch twice
    for c in ended:
        run.observers.call("on_epoch_end", c.id, len(c.history) - 1, dict(c.history[-1]), dict(c.config))
    run.observers.call("on_decision", run.round, decision)
    if run.faults.crash_after_commit(run.round):
        run.crash()
    run.round_committed()
    grow_into_free_resources(run)
    return new + [c for c in resumed if c.status == ACTIVE]


def latest_state(run: RunState, c: ConfigRecord) -> Any:
    """The latest weights of a stopped config (a backend handle), read from its newest checkpoint when the driver
    holds none (it stopped before this process resumed the run), with the units of an epoch it was cut in that the
    checkpoint holds (those it does not are marked lost). None when it never trained. Raises
    `CorruptCheckpointError` when it trained and no checkpoint of it can be read."""
    if c.state is not None:
        return c.state
    try:
        state, _, trained = run.log.load_latest(c.id)
    except CorruptCheckpointError:
        if c.history or c.parent is not None:
            raise
        return None
    visited = {int(e): list(ps) for e, ps in state.get("visited", {}).items()}
    logged = run.log.done_units(c.id, c.epoch)
    kept, lost, _ = resume_units(c.id, c.epoch, run.workers.partitions, visited.get(c.epoch, []),
                                 [(seq, r.unit) for seq, r in logged])
    reports = dict(logged)
    run.log.mark_seqs(lost, "lost")
    c.reload(run.backend.put(state), trained, visited, [reports[seq] for seq in kept])
    return c.state


def first_gap(visited: dict[int, list[int]], epochs: int, partitions: list[int]) -> tuple[int, list[int]] | None:
    """The first of `epochs` finished epochs whose visit record misses partitions: (epoch, missing), or None."""
    for e in range(epochs):
        missing = sorted(set(partitions) - set(visited.get(e, [])))
        if missing:
            return e, missing
    return None


def check_complete(run: RunState) -> None:
    """The completeness check at the end of a run, on the driver's mirror of every config's visits: each finished
    epoch trained on every partition exactly once, and nothing after the epoch in progress (a partial one only for a
    config a person stopped, or that failed). The rules are `framework.completeness`'s, which `Result.check_completeness`
    applies to the proof itself: the visit record each config's state carries, against the schedule log. A violation
    is an error, never a silent gap."""
    from framework.completeness import describe, visit_problems

    problems = []
    for c in run.configs:
        outcome = c.status if c.status in (ACTIVE, FAILED) else c.outcome or "completed"
        problems += visit_problems(c.id, status=outcome, epochs=len(c.history), partitions=run.workers.partitions,
                                   visited=c.visited)
    if problems:
        raise RuntimeError(f"the run's completeness check failed ({len(problems)} problems):\n{describe(problems)}")


def _cannot_resume(run: RunState, c: ConfigRecord, why: str, **gap) -> None:
    """A config whose restored state would leave a gap in what the run committed fails, loudly. Not through
    `recovery.fail_config`: nothing is dispatched yet, and the procedure sees the failure in the configs' views at
    its next step."""
    why = f"cannot resume: {why}"
    c.fail()
    run.log.fail_config(c.id, why)
    run.event("resume_gap", config_id=c.id, **gap)
    run.write(f"config {c.id} failed: {why}")


def restore(run: RunState, catalog) -> list[Unit]:
    """Rebuild the run's state from the catalog and checkpoints after a crash; returns the units still to run.

    For every active config, the units of its unfinished epoch that its restored checkpoint absorbed are kept,
    everything else logged for that epoch was lost with the crash (marked `lost`), and the rest runs.
    """
    last, _, _ = catalog.last_round()
    run.start_at_round(last + 1)
    configs, epochs = catalog.configs(), catalog.epochs()
    history: dict[int, list[dict]] = defaultdict(list)
    for row in epochs.sort_values(["config_id", "epoch"]).to_dict("records"):
        history[row.pop("config_id")].append({k: v for k, v in row.items() if k not in ("epoch", "round") and v == v})
    done = catalog.units(status="done")
    steered: dict[int, dict] = {}  # the configs a person steers, as the applied commands left them
    paused = False
    for detail in catalog.events("command").detail:
        d = json.loads(detail)
        steered.update((int(rec["id"]), rec) for rec in d.get("steered", ()) if d.get("applied"))
        if d.get("applied") and d.get("name") in ("pause", "unpause"):
            paused = d["name"] == "pause"
    if paused and run.backend.wall_clock:  # a person paused it: it stays paused until they unpause it
        run.pause()
        run.write("the run was paused when it stopped and stays paused: unpause it (`modelhopper unpause RUN` or "
                  "framework.connect(RUN).unpause())")
    todo: list[Unit] = []
    lost_seqs: list[int] = []
    for row in configs.itertuples():
        cid, parent, status, outcome = int(row.config_id), parent_id(row.parent), row.status, row.outcome or None
        finished = history.get(cid, [])
        c = ConfigRecord(
            cid, row.config, parent=parent, status=status, history=finished, outcome=outcome,
            # a person stopped it as its epoch waited for the barrier
            stopping=status == ACTIVE and outcome == "stopped",
            # it ended before the crash: its committed epochs were checked when they ended
            visited={e: list(run.workers.partitions) for e in range(len(finished))} if status != ACTIVE else {},
            **({k: steered[cid][k] for k in ("origin", "owner", "budget")} if cid in steered else {}))
        run.configs.add(c)
        if c.status != ACTIVE:
            continue
        try:
            state, _, trained = run.log.load_latest(c.id)
            visited = {int(e): list(ps) for e, ps in state["visited"].items()}
            gap = first_gap(visited, len(c.history), run.workers.partitions)
            if gap is not None:  # an older checkpoint than the commits count on (the latest was corrupt or missing)
                _cannot_resume(run, c, f"its newest readable checkpoint ({trained} units) lacks partitions {gap[1]} of "
                               f"epoch {gap[0]}, which the run committed; re-running them would change committed "
                               "metrics", epoch=gap[0], missing=gap[1], units=trained)
                continue
            handle = run.backend.put(state)
        except CorruptCheckpointError as e:
            if c.history or parent is not None:  # it had trained weights: they cannot be recovered
                _cannot_resume(run, c, str(e), readable=False)
                continue
            handle, trained, visited = None, 0, {}  # not trained past its first epoch: start afresh
        mine = done[(done.config_id == c.id) & (done.epoch == c.epoch)]
        rows = {int(r.seq): r for r in mine.itertuples()}
        kept, lost, run_units = resume_units(
            c.id, c.epoch, run.workers.partitions, visited.get(c.epoch, []),
            [(seq, Unit(c.id, int(r.epoch), int(r.partition), r.kind)) for seq, r in rows.items()])
        c.reload(handle, trained, visited, [
            UnitReport(Unit(c.id, int(r.epoch), int(r.partition), r.kind), int(r.worker), r.start, r.end,
                       json.loads(r.metrics) if r.metrics else {}, int(r.num_examples), int(r.state_bytes))
            for r in (rows[seq] for seq in kept)])
        lost_seqs += lost
        todo += run_units
    run.log.mark_seqs(lost_seqs, "lost")
    stopping.restore(run, catalog, history)
    if run.dispatch.packer is not None:  # what the packer learnt ("auto"'s sizes, refused keys): as if never stopped
        import pandas as pd

        refused = [(int(e["configs"][0]), e.get("unit_kind", TRAIN), e["why"])
                   for e in map(json.loads, catalog.events("pack_not_fused").detail)]
        run.dispatch.packer.restore(
            [(int(r.config_id), r.kind, r.start, r.end, int(r.num_examples), int(r.state_bytes),
              None if pd.isna(r.group) else int(r.group)) for r in done.itertuples()], refused)
    run.event("resume_plan", round=run.round, rerun=len(todo), lost_units=len(lost_seqs))
    return todo
