"""The thin Ray layer: worker actors, in-memory partitions through the object store, and cluster start-up."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import ray

from framework.engine.worker import Worker


class _RayWorker(Worker):
    """`Worker` as a Ray actor; partition entries may be object refs (in-memory data put once by the driver), and
    frozen weights are shared through the object store."""

    LOST_STATE_ERRORS = (ray.exceptions.ObjectLostError, ray.exceptions.OwnerDiedError)

    def _lost_state_error(self, unit) -> BaseException:
        return ray.exceptions.ObjectLostError(ray.ObjectRef.nil().hex(), None, f"injected fault: {unit}")

    def _publish(self, frozen: dict) -> Any:
        return ray.put(frozen)

    def _resolve(self, handle: Any) -> dict:
        return ray.get(handle) if isinstance(handle, ray.ObjectRef) else handle

    def load(
        self, partitions: Mapping[int, tuple[Sequence[Any], Sequence[Any]]], fault: str | None = None
    ) -> dict[int, int]:
        resolved = {
            pid: tuple([ray.get(e) if isinstance(e, ray.ObjectRef) else e for e in entries] for entries in pair)
            for pid, pair in partitions.items()
        }
        return super().load(resolved, fault)


def ensure_ray(min_cpus: float = 1.0) -> bool:
    """Attach to a running cluster (RAY_ADDRESS, `ray job submit`) or start an embedded local one.

    Returns True when this call started Ray. A local instance gets at least `min_cpus` logical CPUs so the workers
    a run asks for can be placed even on a small machine (they then share the cores).
    """
    if ray.is_initialized():
        return False
    if os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=True)
    else:
        ray.init(num_cpus=max(int(min_cpus + 0.999), os.cpu_count() or 1), include_dashboard=False, log_to_driver=True)
    return True


def actor_options(resources: Mapping[str, float]) -> dict[str, Any]:
    custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
    opts: dict[str, Any] = {"num_cpus": resources.get("CPU", 1), "num_gpus": resources.get("GPU", 0)}
    if custom:
        opts["resources"] = custom
    return opts


def materialize(state: dict | None) -> dict | None:
    """A self-contained copy of a config state (frozen weights fetched back in): what a checkpoint stores."""
    if state is None or "frozen" not in state:
        return state
    handle = state["frozen"]["weights"]
    frozen = ray.get(handle) if isinstance(handle, ray.ObjectRef) else handle
    return {**{k: v for k, v in state.items() if k != "frozen"}, "model": {**state["model"], **frozen}}


def start_worker(worker_id: int, resources: Mapping[str, float], fns: dict[str, Any], num_threads: int) -> Any:
    """Start one worker actor (not restarted by Ray: the engine handles failures itself, Cerebro 5.6)."""
    device = "cuda" if resources.get("GPU", 0) > 0 else "cpu"
    cls = ray.remote(max_restarts=0, max_task_retries=0)(_RayWorker)
    return cls.options(**actor_options(resources)).remote(worker_id, device=device, num_threads=num_threads, **fns)
