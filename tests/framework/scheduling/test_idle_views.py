"""The idle workers at each capacity are kept up to date incrementally (`DispatchState`'s idle views): after any
sequence of starts, completions, failures, drains and joins, each capacity's idle workers and idle holders are the
ones a fresh count gives, and switching capacities walks no worker."""

from __future__ import annotations

import random

from framework.scheduling import Assignment, DispatchState, Unit


def _expected_idle(state: DispatchState, capacity: int) -> list[int]:
    return sorted(w for w in state.workers if state.load(w) < capacity)


def test_idle_views_match_a_fresh_count_after_random_transitions():
    rng = random.Random(3)
    availability = {p: [p, p + 4, (p + 1) % 8] for p in range(4)}
    state = DispatchState([Unit(c, 0, p) for c in range(12) for p in range(4)], availability)
    checked = 0
    for _ in range(400):
        capacity = rng.choice((1, 2, 3))
        state.set_capacity(capacity)
        assert state.idle_workers() == _expected_idle(state, capacity)
        for c in range(12):
            parts = {u.partition for u in state.remaining(c)}  # (training units only: each may run once c is free)
            holders = [w for w in _expected_idle(state, capacity) if state.partitions_of(w) & parts]
            assert state.idle_holders_of(c) == holders
            assert state.first_idle_holder(c) == (holders[0] if holders else None)
            checked += 1
        move = rng.random()
        candidates = [(u, w) for w in state.idle_workers() for u in state.eligible(w)]
        if move < 0.5 and candidates:
            u, w = rng.choice(candidates)
            state.start(Assignment(u, (w,)))
        elif move < 0.8 and state.running:
            state.complete(rng.choice(sorted(state.running)))
        elif move < 0.9 and state.running:
            state.requeue(rng.choice(sorted(state.running)))
        elif move < 0.95:
            w = rng.randrange(8)
            state.remove_worker(w)
            state.add_worker(w, [p for p, ws in availability.items() if w in ws])
        if state.finished:
            break
    assert checked > 0
