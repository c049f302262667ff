"""Packing: any policy's single-config assignments grown into packs, configs that train as one fused model.

    packer = Packer(8, key_of)                     # or Packer("auto", key_of)
    chosen = packer.extend(policy.select(state), state)

A pack is an `Assignment` with several `members` on one worker: configs whose units are at the same (epoch,
partition, kind), free and eligible there now (or at other epochs, `mix_epochs`: configs of an asynchronous
procedure, where the step takes no `epoch` and the policy fixes no order), and of one *pack key* (`key_of(config_id)`: the same architecture,
optimizer class and batch size; None: a config that never packs). The worker trains them as one fused model
(`framework.engine.packs`) and reports one row per member, so the schedule, the procedures and the dashboard still
see configs. `extend` takes the policy's choices in order and adds to each, up to the pack size, configs of its key
that are free there (taking a config the policy gave a later worker in the same call when that config's unit is
the same one, so a replica does not cap a pack); it leaves gangs (several workers) as they are, so packs combine
with every policy.

Packing is a speed knob only: it never changes a config's visit order, row order or seeds, so never what it learns.
Where the policy fixes each config's order (`Scheduler.order`, the seeded order of `deterministic=True`), a config
joins a pack only at its own next unit, and only with configs that share its whole order: the configs of one
(epoch, order, key) are cut into fixed *chunks* of the pack size by id, and a pack holds one chunk's free members.
Members of a chunk move in lock-step, so the same seed gives the same packs, whatever the timing: two runs are
bit-identical, and each config's weights are those of pack=1 up to the float rounding of the fused arithmetic.
Where the policy fixes no order (randomized, MWR, ...), a config's order already depends on timing at pack=1; a
pack only gives it a unit the policy could have given it.

The pack size is fixed (`Packer(k)`) or found per key (`"auto"`, `PackSizer`): it starts at 1 and doubles while the
per-config seconds per example measured on the run's own training units improve by `GAIN`, then keeps the fastest
size it measured; so `"auto"` settles on 1 where packing does not pay, and never on a size it measured slower than a
smaller one. Packs never hold more than `max_bytes` of state (the states the driver has seen, times `k`).
Pure Python, like the rest of `framework.scheduling`: the simulators and the engine share it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any

from framework.scheduling._base import Scheduler
from framework.scheduling.dispatch_state import DispatchState
from framework.scheduling.units import TRAIN, Assignment, Unit

__all__ = ["AUTO", "MAX_PACK", "Packer", "PackSizer", "check_pack"]

AUTO = "auto"
#: the largest pack: where the fused pass's gain levels off for the small models it is for (issue 35's probes)
MAX_PACK = 16
#: "auto" tries a larger size only if the smaller one's per-config time improved on the best so far by this factor
GAIN = 0.9
#: training units measured at a size before "auto" judges it
SAMPLES = 2
#: configs per worker the procedures are told of under "auto" (`Packer.slots`): the middle of the sizes it tries
AUTO_SLOTS = 4


def check_pack(pack: Any) -> int | str:
    """`pack` as `ModelSelection(pack=...)` takes it, or the error naming the rule."""
    if pack == AUTO and isinstance(pack, str):
        return pack
    if isinstance(pack, bool) or not isinstance(pack, int) or not 1 <= pack <= MAX_PACK:
        raise ValueError(f"`pack` is {pack!r}, but must be an int in 1..{MAX_PACK} (configs trained at once as one "
                         f"fused model on a worker; 1: one at a time) or {AUTO!r} (sized by measuring)")
    return pack


class PackSizer:
    """The pack size of each key under `pack="auto"` (see the module docstring)."""

    SIZES = (1, 2, 4, 8, 16)

    def __init__(self) -> None:
        self._seen: dict[Hashable, dict[int, list[float]]] = {}  # key -> size -> per-config s per example

    def observe(self, key: Hashable, size: int, seconds: float, examples: int) -> None:
        """A fused training pack of `size` configs (1: a unit alone) took `seconds` for `examples` rows each; it
        counts for the size it was asked as (the smallest of `SIZES` that holds it: fewer configs may have been
        free)."""
        bucket = next((s for s in self.SIZES if s >= size), None)
        if examples > 0 and seconds > 0 and bucket is not None:
            runs = self._seen.setdefault(key, {}).setdefault(bucket, [])
            runs[:] = [*runs[-7:], seconds / size / examples]

    def size(self, key: Hashable) -> int:
        """The size the next pack of `key` should have."""
        seen = self._seen.get(key, {})
        best = None
        for s in self.SIZES:
            runs = seen.get(s, [])
            if len(runs) < SAMPLES:
                return s
            t = min(runs)  # (a unit's time only grows by interference, and a size's first unit pays its warm-up)
            if best is not None and t > GAIN * best[1]:
                return best[0]  # no longer paying: the fastest measured
            if best is None or t < best[1]:
                best = (s, t)
        return best[0] if best is not None else 1


class Packer:
    """Grows a policy's assignments into packs of up to `size` configs (an int, or `"auto"`) of one key."""

    def __init__(self, size: int | str, key_of: Callable[[int], Hashable | None], max_bytes: int = 4 << 30,
                 mix_epochs: bool = False) -> None:
        self.size = check_pack(size)
        self._key_of, self.max_bytes, self.mix_epochs = key_of, max_bytes, mix_epochs
        self._keys: dict[int, Hashable | None] = {}
        self.sizer = PackSizer() if self.size == AUTO else None
        # (key, kind) whose packs did not fuse, and why: that kind of unit of the key runs alone from then
        self.refused: dict[tuple[Hashable, str], str] = {}
        self._fixed = _FixedOrders()  # what a policy that fixes each config's order lets a pack hold
        self.state_bytes: dict[Hashable, int] = {}  # key -> the largest state of it seen

    @property
    def slots(self) -> int:
        """Configs a worker trains at once when packs fill: the pack size (`AUTO_SLOTS` for "auto", which sizes as
        it measures). What the procedures' concurrency hint counts per worker, so asynchronous ones (ASHA, the
        Optuna ones) keep enough configs active to fill packs."""
        return AUTO_SLOTS if self.size == AUTO else self.size

    def key(self, config_id: int, kind: str = TRAIN) -> Hashable | None:
        """The config's pack key for units of `kind` (None: they run alone), asked of `key_of` once per config."""
        if config_id not in self._keys:
            self._keys[config_id] = self._key_of(config_id)
        key = self._keys[config_id]
        return None if (key, kind) in self.refused else key

    def target(self, key: Hashable) -> int:
        """How many configs the next pack of `key` may hold."""
        k = self.sizer.size(key) if self.sizer is not None else self.size
        state = self.state_bytes.get(key, 0)
        return max(1, min(k, self.max_bytes // state)) if state else k

    def extend(self, chosen: list[Assignment], state: DispatchState, policy: Scheduler | None = None
               ) -> list[Assignment]:
        """The policy's assignments, each single-config one grown into a pack (module docstring): with configs of
        its key that are free and eligible on its worker at its unit's (epoch, partition, kind), that the policy
        did not choose for an earlier assignment, and, under `policy.order`, that share the lead's order and chunk
        and are at their own next unit there. A later assignment whose config joined a pack is dropped (its worker
        asks again)."""
        taken: set[int] = set()
        out = []
        for i, a in enumerate(chosen):
            if a.unit.config_id in taken:
                continue  # (it joined an earlier pack)
            later = {b.unit.config_id: b.unit for b in chosen[i + 1:] if not b.plural}
            grown = a if a.plural else self._grow(a, state, taken, later, policy)
            taken.update(grown.members)
            out.append(grown)
        return out

    def _grow(self, a: Assignment, state: DispatchState, busy: set[int], later: dict[int, Unit],
              policy: Scheduler | None) -> Assignment:
        key = self.key(a.unit.config_id, a.unit.kind)
        k = self.target(key) if key is not None else 1
        if k <= 1:
            return a
        u, w = a.unit, a.workers[0]
        parts = tuple(sorted(state.availability))
        order = self._fixed.order(policy, u.config_id, u.epoch, parts) if policy is not None else None
        # configs at other epochs may join where the step takes no epoch and the policy fixes no order (an
        # asynchronous procedure's configs); a fixed order is an epoch's
        any_epoch = self.mix_epochs and order is None
        candidates = [v for v in state.eligible(w)
                      if v.config_id not in busy and v.config_id != u.config_id
                      and (v.partition, v.kind) == (u.partition, u.kind) and (any_epoch or v.epoch == u.epoch)
                      and later.get(v.config_id, v) == v and self.key(v.config_id, u.kind) == key]
        allowed = None if order is None else self._fixed.mates(policy, state, u, order, parts, candidates, key, k, self)
        mates = [v for v in candidates if allowed is None or v.config_id in allowed][:k - 1]
        pack = Assignment(u, (w,), (u.config_id, *(v.config_id for v in mates)),
                          epochs=(u.epoch, *(v.epoch for v in mates)))
        return pack if mates and state.can_start(pack) else a

    def observe(self, a: Assignment, seconds: float, examples: int, state_bytes: int, note: str | None) -> None:
        """An assignment of one worker ended: its training time feeds "auto", its state size the memory cap, and
        a pack that did not fuse (`note` says why) refuses its key for that kind of unit from then on."""
        key = self.key(a.unit.config_id, a.unit.kind)
        if key is None:
            return
        if note is not None and len(a.members) > 1:
            self.refused[(key, a.unit.kind)] = note
            self._learn(key, a.unit.kind, 0, 0.0, 0, state_bytes)
        else:
            self._learn(key, a.unit.kind, len(a.members), seconds, examples, state_bytes)

    def _learn(self, key: Hashable, kind: str, size: int, seconds: float, examples: int, state_bytes: int) -> None:
        """An assignment of `size` configs of `key` (0: one that did not fuse) took `seconds` for `examples` rows
        each and held states of up to `state_bytes`: the memory cap, and "auto"'s measure of a training pack."""
        if state_bytes:
            self.state_bytes[key] = max(self.state_bytes.get(key, 0), state_bytes)
        if size and self.sizer is not None and kind == TRAIN:
            self.sizer.observe(key, size, seconds, examples)


    def restore(self, rows: Iterable[tuple[int, str, float, float, int, int, int | None]],
                refused: Iterable[tuple[int, str, str]] = ()) -> None:
        """A resumed run's packer learns what its log says ran, in the logged order, so it sizes and refuses as one
        that never stopped: `rows`, the done units as (config, kind, start, end, examples, state bytes, group; rows
        of one group are one pack), `refused`, each `pack_not_fused` event as (its lead config, its kind, why)."""
        packs: dict[object, list[tuple]] = {}
        for row in rows:
            packs.setdefault(("group", row[6]) if row[6] is not None else ("row", len(packs)), []).append(row)
        for members in packs.values():
            cid, kind, start, end, examples = members[0][:5]
            key = self.key(cid, kind)
            if key is not None:
                self._learn(key, kind, len(members), end - start, examples, max(m[5] for m in members))
        for cid, kind, why in refused:
            key = self.key(cid, kind)
            if key is not None:
                self.refused[(key, kind)] = why


class _FixedOrders:
    """What a policy that fixes each config's visit order (`Scheduler.order`) allows a pack: mates that share the
    lead's whole order in the epoch, are at their own next unit, and are in the lead's chunk (module docstring).
    Orders and chunks are cached: an order is fixed by (config, epoch, partitions), a chunk by the round's configs."""

    def __init__(self) -> None:
        self._orders: dict[tuple[int, int, tuple[int, ...]], tuple[int, ...] | None] = {}
        self._chunks: dict[tuple, dict[int, int]] = {}  # (epoch, order, key, k) -> config -> its chunk

    def order(self, policy: Scheduler, config_id: int, epoch: int, parts: tuple[int, ...]) -> tuple[int, ...] | None:
        key = (config_id, epoch, parts)
        if key not in self._orders:
            o = policy.order(config_id, epoch, list(parts))
            self._orders[key] = None if o is None else tuple(o)
        return self._orders[key]

    def mates(self, policy: Scheduler, state: DispatchState, u: Unit, order: tuple[int, ...],
              parts: tuple[int, ...], candidates: list[Unit], key: Hashable, k: int, packer: Packer) -> list[int]:
        """Which of `candidates` (units at u's partition and kind, of u's key) may join u's pack, under the fixed
        `order` of u's config in its epoch (over the partitions `parts`)."""
        same = [v for v in candidates if self.order(policy, v.config_id, v.epoch, parts) == order]
        done = _done(state, u, parts)
        same = [v for v in same if _done(state, v, parts) == done]  # (else v's next unit is elsewhere)
        chunks = self._chunk_of(policy, state, u.epoch, order, key, k, packer, parts,
                                [u.config_id, *(v.config_id for v in same)])
        return [v.config_id for v in same if chunks[v.config_id] == chunks[u.config_id]]

    def _chunk_of(self, policy: Scheduler, state: DispatchState, epoch: int, order: tuple[int, ...], key: Hashable,
                  k: int, packer: Packer, parts: tuple[int, ...], need: list[int]) -> dict[int, int]:
        """config -> its chunk among the round's configs at `epoch` with this order and key: by id, k a chunk
        (configs that join the round later form chunks of their own, after these)."""
        ck = (epoch, order, key, k)
        chunks = self._chunks.setdefault(ck, {})
        if any(c not in chunks for c in need):
            configs = sorted({v.config_id for v in state.units if v.epoch == epoch} - set(chunks))
            new = [c for c in configs if packer.key(c) == key and self.order(policy, c, epoch, parts) == order]
            base = max(chunks.values(), default=-1) + 1
            chunks.update({c: base + i // k for i, c in enumerate(new)})
            for c in need:  # (not in the round's units: alone in a chunk of its own)
                chunks.setdefault(c, max(chunks.values(), default=-1) + 1)
        return chunks


def _done(state: DispatchState, u: Unit, parts: tuple[int, ...]) -> frozenset[int]:
    """The partitions u's config has no pending unit of u's kind in u's epoch (done, or running)."""
    pending = {v.partition for v in state.remaining(u.config_id) if v.epoch == u.epoch and v.kind == u.kind}
    return frozenset(p for p in parts if p not in pending)
