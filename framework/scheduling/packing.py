"""Packing: any policy's single-config assignments grown into packs, configs that train as one fused model.

    packer = Packer(8, key_of)                     # or Packer("auto", key_of)
    chosen = packer.extend(policy.select(state), state)

A pack is an `Assignment` with several `members` on one worker: configs whose units are at the same (epoch,
partition, kind), free and eligible there now, and of one *pack key* (`key_of(config_id)`: the same architecture,
optimizer class and batch size; None: a config that never packs). The worker trains them as one fused model
(`framework.engine.packs`) and reports one row per member, so the schedule, the procedures and the dashboard still
see configs. `extend` takes the policy's choices in order and adds to each, up to the pack size, configs the policy
did not choose in this call; it leaves gangs (several workers) as they are, so packs combine with every policy.

The pack size is fixed (`Packer(k)`) or found per key (`"auto"`, `PackSizer`): it starts at 1 and doubles while the
per-config seconds per example measured on the run's own training units improve by `GAIN`, then keeps the fastest
size it measured; so `"auto"` settles on 1 where packing does not pay, and never on a size it measured slower than a
smaller one. Packs never hold more than `max_bytes` of state (the states the driver has seen, times `k`).
Pure Python, like the rest of `framework.scheduling`: the simulators and the engine share it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from framework.scheduling.dispatch_state import DispatchState
from framework.scheduling.units import TRAIN, Assignment

__all__ = ["AUTO", "MAX_PACK", "Packer", "PackSizer", "check_pack"]

AUTO = "auto"
#: the largest pack: where the fused pass's gain levels off for the small models it is for (issue 35's probes)
MAX_PACK = 16
#: "auto" tries a larger size only if the smaller one's per-config time improved on the best so far by this factor
GAIN = 0.9
#: training units measured at a size before "auto" judges it
SAMPLES = 2


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

    def __init__(self, size: int | str, key_of: Callable[[int], Hashable | None], max_bytes: int = 4 << 30) -> None:
        self.size = check_pack(size)
        self._key_of, self.max_bytes = key_of, max_bytes
        self._keys: dict[int, Hashable | None] = {}
        self.sizer = PackSizer() if self.size == AUTO else None
        self.refused: dict[Hashable, str] = {}  # keys whose packs did not fuse, and why (they run alone from then)
        self.state_bytes: dict[Hashable, int] = {}  # key -> the largest state of it seen

    def key(self, config_id: int) -> Hashable | None:
        """The config's pack key (None: it trains alone), asked of `key_of` once per config."""
        if config_id not in self._keys:
            self._keys[config_id] = self._key_of(config_id)
        key = self._keys[config_id]
        return None if key in self.refused else key

    def target(self, key: Hashable) -> int:
        """How many configs the next pack of `key` may hold."""
        k = self.sizer.size(key) if self.sizer is not None else self.size
        state = self.state_bytes.get(key, 0)
        return max(1, min(k, self.max_bytes // state)) if state else k

    def extend(self, chosen: list[Assignment], state: DispatchState) -> list[Assignment]:
        """The policy's assignments, each single-config one grown into a pack with configs of its key that are free
        and eligible on its worker at its unit's (epoch, partition, kind) and that the policy did not choose."""
        taken = {c for a in chosen for c in a.members}
        out = []
        for a in chosen:
            grown = a if a.plural else self._grow(a, state, taken)
            taken.update(grown.members)
            out.append(grown)
        return out

    def _grow(self, a: Assignment, state: DispatchState, busy: set[int]) -> Assignment:
        key = self.key(a.unit.config_id)
        k = self.target(key) if key is not None else 1
        if k <= 1:
            return a
        u, w = a.unit, a.workers[0]
        mates = [v.config_id for v in state.eligible(w)
                 if v.config_id not in busy and (v.epoch, v.partition, v.kind) == (u.epoch, u.partition, u.kind)
                 and self.key(v.config_id) == key][:k - 1]
        pack = Assignment(u, (w,), (u.config_id, *mates))
        return pack if mates and state.can_start(pack) else a

    def observe(self, a: Assignment, seconds: float, examples: int, state_bytes: int, note: str | None) -> None:
        """An assignment of one worker ended: its training time feeds "auto", its state size the memory cap, and
        a pack that did not fuse (`note` says why) refuses its key from then on."""
        key = self.key(a.unit.config_id)
        if key is None:
            return
        if state_bytes:
            self.state_bytes[key] = max(self.state_bytes.get(key, 0), state_bytes)
        if note is not None and len(a.members) > 1:
            self.refused[key] = note
        elif self.sizer is not None and a.unit.kind == TRAIN:
            self.sizer.observe(key, len(a.members), seconds, examples)
