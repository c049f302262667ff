"""Multi-model graph (Nautilus Definition 4.4): merge identical materializable sub-expressions across models.

Two layers merge iff both are materializable and have the same signature: the same op with the same configuration,
the same parameter and buffer values (by hash) and identical inputs (recursively). Non-materializable layers never
merge: they train, so every model keeps its own copy. Each layer of model ``i`` gets a *key*: the signature for a
materializable layer (shared), ``"<i>/<name>"`` otherwise (private). A key names a layer's value when the layer
ran: a later in-place layer gets its own key (see ``profile``), so sharing across models stays exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from framework.planner.profile import LayerGraph, LayerNode


@dataclass
class MultiModelGraph:
    """The merged DAG of several profiled models; ``layers[key]`` is a representative profile of each merged layer."""

    models: list[LayerGraph]
    keys: list[dict[str, str]] = field(init=False)  # per model: node name -> key
    layers: dict[str, LayerNode] = field(init=False)  # key -> representative node
    parents: dict[str, tuple[str, ...]] = field(init=False)  # key -> parent keys
    owners: dict[str, list[tuple[int, str]]] = field(init=False)  # key -> [(model index, node name)]

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("`models` is empty, but must hold at least one LayerGraph")
        self.keys, self.layers, self.parents, self.owners = [], {}, {}, {}
        for i, g in enumerate(self.models):
            km: dict[str, str] = {}
            for name, node in g.nodes.items():
                key = node.signature if node.materializable else f"{i}/{name}"
                km[name] = key
                self.owners.setdefault(key, []).append((i, name))
                if key not in self.layers:
                    self.layers[key] = node
                    self.parents[key] = tuple(km[p] for p in node.parents)
            self.keys.append(km)

    @property
    def materializable(self) -> list[str]:
        """U: every materializable key (inputs included)."""
        return [k for k, n in self.layers.items() if n.materializable]

    @property
    def shared(self) -> list[str]:
        """Keys used by more than one model."""
        return [k for k, o in self.owners.items() if len({i for i, _ in o}) > 1]

    def model_keys(self, i: int) -> list[str]:
        return list(self.keys[i].values())

    def output_key(self, i: int) -> str:
        return self.keys[i][self.models[i].output]


def build_multimodel(models: Sequence[LayerGraph]) -> MultiModelGraph:
    return MultiModelGraph(list(models))
