"""Layer freezing on a worker (Egeria): the controller a training unit runs under, and hops that leave frozen
weights behind (published once per config and generation; a worker that holds them never receives them again)."""

from __future__ import annotations

import os
from typing import Any

import torch

from framework.engine.state import ModelState, to_cpu
from framework.scheduling.units import Unit


class FrozenLayers:
    """What a worker does for layer freezing (mixed into `Worker`, which sets `freezing`, `_frozen` and the cache
    folder). `_publish`/`_resolve` share frozen weights between workers: in-process the tensors themselves, on Ray
    an object ref."""

    freezing: dict[str, Any] | None = None
    _frozen: dict[tuple[int, int], tuple[dict[str, torch.Tensor], Any]]

    def _cache_folder(self) -> str:
        raise NotImplementedError

    def controller(self, model: torch.nn.Module, unit: Unit, state: ModelState | None) -> Any:
        from framework.freezing import FreezingController, split_by_size, split_children, split_regex

        opts = dict(self.freezing or {})
        split = opts.pop("modules", "children")
        cache = opts.pop("cache", False)
        if isinstance(split, int):
            modules = split_by_size(model, split)
        elif split == "children":
            modules = split_children(model)
        else:
            modules = split_regex(model, split)
        cache_dir = os.path.join(self._cache_folder(), f"c{unit.config_id}-p{unit.partition}") if cache else None
        controller = FreezingController(model, modules, cache_dir=cache_dir, **opts)
        if state is not None and state.get("freezing") is not None:
            controller.load_state_dict(state["freezing"])
        return controller

    def split_frozen(self, config_id: int, model: torch.nn.Module, new_state: ModelState) -> None:
        """Move the frozen weights out of the hop payload: they are published once per (config, generation) and
        a worker that already holds them never receives them again."""
        from framework.freezing import frozen_parameter_names

        fstate = new_state["freezing"]
        names = frozen_parameter_names(model, fstate, include_buffers=True)
        if not names:
            return
        key = (config_id, int(fstate["generation"]))
        if key not in self._frozen:
            frozen = {k: to_cpu(new_state["model"][k]) for k in names}
            self._frozen = {k: v for k, v in self._frozen.items() if k[0] != config_id}  # older generations
            self._frozen[key] = (frozen, self._publish(frozen))
        new_state["model"] = {k: v for k, v in new_state["model"].items() if k not in set(names)}
        new_state["frozen"] = {"generation": key[1], "weights": self._frozen[key][1]}

    def full_weights(self, config_id: int, state: ModelState) -> dict[str, Any]:
        if "frozen" not in state:
            return state["model"]
        key = (config_id, int(state["frozen"]["generation"]))
        if key not in self._frozen:
            weights = self._resolve(state["frozen"]["weights"])
            self._frozen = {k: v for k, v in self._frozen.items() if k[0] != config_id}
            self._frozen[key] = (weights, state["frozen"]["weights"])
        return {**state["model"], **self._frozen[key][0]}

    def _publish(self, frozen: dict[str, torch.Tensor]) -> Any:
        """A handle other workers can resolve (in-process: the tensors themselves; on Ray: an object ref)."""
        return frozen

    def _resolve(self, handle: Any) -> dict[str, torch.Tensor]:
        return handle
