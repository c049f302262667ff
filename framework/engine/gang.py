"""Data-parallel gangs: k worker processes that train one config together, each on its own data, with their
gradients averaged at every optimizer step (pure torch.distributed; no Ray here).

    store, port = open_store()                                  # on the gang's rank 0
    gang = Gang("g7", rank, size, host, port, store=store)      # on every member (all at once: a rendezvous)
    step = gang.averaging(optimizer)                            # optimizer.step now averages gradients first
    train_fn(model, optimizer, my_batches, config)              # the user's code, unchanged
    gang.finish(optimizer)                                      # until every member has run out of batches
    step.restore()

Equivalence: with a mean-reduced loss and equal local batches, averaging the members' gradients is the gradient of
the mean loss over their union, so a gang of k takes the steps one worker would take on the global batches (the
union of the members' i-th batches), up to float rounding. Members need not have as many batches: a member that ran
out keeps taking part in each step with no gradient of its own (the others' average is divided by the members that
gave one) and applies the same update, so every member holds the same weights at the end. One all-reduce per step
carries every gradient and the contributor count (one flat buffer: a ring all-reduce of 2(k-1)/k x the model's
bytes).

Why torch.distributed's own gloo (CPU) and NCCL (GPU) groups, made from a `TCPStore` that rank 0 hosts, rather
than Ray's collective library or Ray Train: the gang's members are our long-lived worker actors, which hold their
partitions; Ray Train starts its own worker group (the data would move to it), and Ray's collective library needs
pygloo or cupy, which we do not install. A group costs a rendezvous to set up (`experiments/gang_costs.py` measures
it beside the per-step cost); the engine keeps it while the gang lives instead of paying it per unit.
"""

from __future__ import annotations

import datetime
import socket
import time
import types
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from framework.scheduling.units import TRAIN, Unit, UnitTask

__all__ = ["Gang", "GangBrokenError", "GangMember", "gang_id", "open_store"]


class GangBrokenError(RuntimeError):
    """A gang's all-reduce failed: a member died or stopped answering. Not the user's fault: the engine re-runs
    the gang's units from the config's last state."""


def open_store(host: str = "127.0.0.1", timeout_s: float = 60.0) -> tuple[dist.TCPStore, int]:
    """Host a rendezvous store on a free port of `host` (the gang's rank 0 calls it); returns it and the port the
    other members connect to. It must live as long as the gang (keep the reference)."""
    store = dist.TCPStore(host, 0, None, True, datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
    return store, int(store.port)


def gang_id(workers: Iterable[int]) -> str:
    """The name of the gang of `workers` (in their order: rank i is `workers[i]`)."""
    return "g" + "-".join(str(w) for w in workers)


def this_host() -> str:
    """An address of this machine the other members can reach (127.0.0.1 when it has no other)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class Gang:
    """This process's place in gang `gang_id`: rank `rank` of `size`, through the store at `host`:`port` (`store`:
    rank 0's own, from `open_store`). Every member constructs it at about the same time: it returns once all have
    joined. `backend`: "gloo" (CPU tensors) or "nccl" (CUDA tensors)."""

    def __init__(self, gang_id: str, rank: int, size: int, host: str, port: int, store: Any = None,
                 backend: str = "gloo", timeout_s: float = 60.0) -> None:
        if not isinstance(size, int) or size < 1 or not isinstance(rank, int) or not 0 <= rank < size:
            raise ValueError(f"`rank` is {rank!r} and `size` {size!r}, but rank must be in 0..size-1")
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"`backend` is {backend!r}, but must be 'gloo' or 'nccl'")
        timeout = datetime.timedelta(seconds=timeout_s)
        if store is None:
            store = dist.TCPStore(host, port, None, False, timeout)
        self.gang_id, self.rank, self.size, self.backend = gang_id, rank, size, backend
        self._store = store
        prefixed = dist.PrefixStore(f"gang/{gang_id}/", store)
        if backend == "gloo":
            self.group = dist.ProcessGroupGloo(prefixed, rank, size, timeout)
        else:  # pragma: no cover - needs GPUs
            self.group = dist.ProcessGroupNCCL(prefixed, rank, size)
        self.steps = 0  # all-reduces this member took part in
        self.broken = False  # an all-reduce failed: the gang cannot be used again
        self.comm_seconds = 0.0  # time spent in all-reduces (waiting for the slowest member included)

    def average(self, params: Iterable[torch.nn.Parameter], contributes: bool) -> int:
        """Average the gradients of `params` over the members that `contribute` (one all-reduce); returns how many
        did (0: none had a gradient; nothing changed). A member that does not contribute sends zeros and receives
        the others' average."""
        params = list(params)
        if not params:
            grads = torch.zeros(0)
        else:
            grads = torch.cat([(p.grad if p.grad is not None and contributes else torch.zeros_like(p)).reshape(-1)
                               .to(torch.float32) for p in params])
        device = params[0].device if params else torch.device("cpu")
        flat = torch.cat([grads.to(device), torch.tensor([1.0 if contributes else 0.0], device=device)])
        t0 = time.perf_counter()
        try:
            self.group.allreduce([flat]).wait()
        except Exception as e:  # noqa: BLE001 - gloo and NCCL raise RuntimeError subclasses of their own
            self.broken = True
            raise GangBrokenError(f"gang {self.gang_id}: the all-reduce of step {self.steps + 1} failed at rank "
                                  f"{self.rank} of {self.size} (a member is gone?): {e}") from e
        self.steps += 1
        count = int(round(float(flat[-1])))  # (a CUDA tensor's read waits for the all-reduce)
        self.comm_seconds += time.perf_counter() - t0
        if count == 0:
            return 0
        flat = flat[:-1] / count
        at = 0
        for p in params:
            n = p.numel()
            p.grad = flat[at:at + n].view_as(p).to(p.dtype).clone()
            at += n
        return count

    def averaging(self, optimizer: torch.optim.Optimizer) -> _Averaging:
        """Make `optimizer.step()` average the gradients over the gang first (undo with `.restore()`)."""
        return _Averaging(self, optimizer)

    def finish(self, optimizer: torch.optim.Optimizer) -> int:
        """This member has no batches left: take part in the others' remaining steps (applying the same updates)
        until no member has one. Returns how many steps it followed."""
        params = _params(optimizer)
        step = getattr(optimizer.step, "__wrapped_step__", optimizer.step)
        followed = 0
        while self.average(params, contributes=False):
            step()
            followed += 1
        return followed

    def close(self) -> None:
        """Leave the gang (its group's resources go; rank 0's store goes with its last reference)."""
        self.group = None
        self._store = None


class GangMember:
    """What a worker process does to take part in gangs (mix it into an actor class): `host_gang(gang_id)` on the
    gang's rank 0 returns the port of the store it hosts, then `join_gang(gang_id, ...)` on every member (all at
    once) makes `self.gangs[gang_id]` (and `self.gang`, the latest); `leave_gang(gang_id)` drops it. A worker may
    belong to several gangs: each keeps its group until it is left."""

    gang: Gang | None = None
    worker_id: int = 0

    def host_gang(self, gang_id: str = "g", host: str = "127.0.0.1") -> int:
        store, port = open_store(host)
        self.__dict__.setdefault("_gang_stores", {})[gang_id] = store
        return port

    def join_gang(self, gang_id: str, rank: int, size: int, port: int, host: str = "127.0.0.1",
                  backend: str = "gloo") -> int:
        store = self.__dict__.get("_gang_stores", {}).get(gang_id) if rank == 0 else None
        self.gang = Gang(gang_id, rank, size, host, port, store=store, backend=backend)
        self.__dict__.setdefault("gangs", {})[gang_id] = self.gang
        return rank

    def leave_gang(self, gang_id: str) -> None:
        gang = self.__dict__.get("gangs", {}).pop(gang_id, None)
        self.__dict__.get("_gang_stores", {}).pop(gang_id, None)
        if gang is not None:
            gang.close()
            if self.gang is gang:
                self.gang = None

    def gang_place(self, task: UnitTask) -> tuple[Unit, int, Gang | None, tuple[int, int]]:
        """This worker's part of a gang's task: (its unit, its rank, the gang (None for eval: no gradients), its
        share of the partition (index, count))."""
        rank = task.workers.index(self.worker_id)
        parts = task.partitions or (task.unit.partition,) * len(task.workers)
        sharers = [i for i, p in enumerate(parts) if p == parts[rank]]
        unit = Unit(task.unit.config_id, task.unit.epoch, parts[rank], task.unit.kind)
        gang = None
        if unit.kind == TRAIN:
            gang = self.__dict__.get("gangs", {}).get(gang_id(task.workers))
            if gang is None:
                raise GangBrokenError(f"worker {self.worker_id} is in no gang of workers {task.workers}")
        return unit, rank, gang, (sharers.index(rank), len(sharers))


class _Averaging:
    """`optimizer.step` wrapped so that it averages the gang's gradients first."""

    def __init__(self, gang: Gang, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer, self.original = optimizer, optimizer.step
        params = _params(optimizer)

        original = self.original

        def step(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
            gang.average(params, contributes=True)
            return original(*args, **kwargs)

        step.__wrapped_step__ = original
        optimizer.step = types.MethodType(step, optimizer)  # a bound method, as LR schedulers expect

    def restore(self) -> None:
        self.optimizer.step = self.original


def _params(optimizer: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    return [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
