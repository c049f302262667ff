"""The worker table: which workers live, which partitions each holds, which are loading or draining.

Pure bookkeeping, the same for every backend. The same path serves a first start, a restart after a failure, a
new worker (elasticity) and re-loading a partition whose only holder died: `loading` until the backend reports
`WorkerJoined`, then `holds`.
"""

from __future__ import annotations

from collections.abc import Iterable


class WorkerTable:
    def __init__(self, partitions: Iterable[int], eval_partitions: Iterable[int] | None = None) -> None:
        self.partitions = sorted(partitions)  # each config trains on every one per epoch
        # ... and evaluates on every one of these (by default the same ids: partition p holds train and valid data)
        self.eval_partitions = self.partitions if eval_partitions is None else sorted(eval_partitions)
        self.holds: dict[int, set[int]] = {}  # live, loaded worker -> partitions
        self.loading: dict[int, set[int]] = {}  # worker -> partitions it is loading now
        self.draining: set[int] = set()
        self.restarts: dict[int, int] = {}
        self.started: set[int] = set()  # every id ever started: a new worker never reuses a dead one's id
        self.info: dict[int, dict] = {}  # what each worker reported when it joined (data bytes, extraction)

    def start(self, worker: int, partitions: Iterable[int]) -> None:
        self.started.add(worker)
        self.loading.setdefault(worker, set()).update(partitions)

    def joined(self, worker: int, partitions: Iterable[int]) -> None:
        parts = set(partitions)
        left = self.loading.get(worker, set()) - parts
        if left:
            self.loading[worker] = left
        else:
            self.loading.pop(worker, None)
        self.holds.setdefault(worker, set()).update(parts)

    def remove(self, worker: int) -> set[int]:
        """Forget a dead, hung or drained worker; returns the partitions it held or was loading."""
        self.draining.discard(worker)
        return self.holds.pop(worker, set()) | self.loading.pop(worker, set())

    def next_id(self) -> int:
        return max([*self.started, -1]) + 1

    def live(self) -> list[int]:
        return sorted(self.holds)

    def availability(self) -> dict[int, list[int]]:
        """partition -> live, loaded, non-draining workers holding it (every partition, maybe empty)."""
        av: dict[int, list[int]] = {p: [] for p in (*self.partitions, *self.eval_partitions)}
        for w, parts in sorted(self.holds.items()):
            if w not in self.draining:
                for p in parts:
                    av.setdefault(p, []).append(w)
        return av

    def incoming(self) -> set[int]:
        """Partitions being loaded right now."""
        return {p for parts in self.loading.values() for p in parts}

    def least_replicated(self) -> list[int]:
        """Partitions a new worker should load: the least-held ones (counting loads under way), as many as an
        average worker holds."""
        holders = {p: len(ws) for p, ws in self.availability().items()}
        for parts in self.loading.values():
            for p in parts:
                holders[p] = holders.get(p, 0) + 1
        per_worker = max(1, round(sum(holders.values()) / max(1, len(self.holds) + len(self.loading))))
        return sorted(sorted(holders, key=lambda p: (holders[p], p))[:per_worker])
