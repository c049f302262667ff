"""Peak training-memory estimate of a (fused) reuse plan: live-tensor analysis (Nautilus section 4.3.3).

memory = parameters of the computed layers + gradients, optimizer slots and one transient parameter-sized temporary
         of the optimizer step (Adam's denominator) for the trainable ones + workspace
       + peak of the live layer tensors over a topological traversal of forward nodes, a loss node, and one backward
         node l' per computed non-materializable layer (s_mem(l') = s_mem(l)).

Edges of the augmented graph, as in the paper: (l, l'), (parent(l), l'), (child(l)', l'); outputs feed the loss.
A tensor is live from the step that produces it to its last consumer. A computed layer's size is its ``act_bytes``
(all tensors its ops produce, so composite layers count their internals); a loaded layer's size is its output.
"""

from __future__ import annotations

from framework.planner.milp import COMPUTE, LOAD, ReusePlan
from framework.planner.multimodel import MultiModelGraph


def estimate_peak_memory(
    mm: MultiModelGraph,
    plan: ReusePlan,
    batch_size: int,
    *,
    optimizer_slots: int = 2,
    workspace_bytes: int = 0,
) -> int:
    """Upper-bound estimate in bytes of one training step of the unit ``plan`` describes (Adam: 2 slots)."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"`batch_size` is {batch_size!r}, but must be an int >= 1")
    order = {k: n for n, k in enumerate(mm.layers)}
    present = sorted((k for k, a in plan.actions.items() if a in (COMPUTE, LOAD)), key=order.__getitem__)
    computed = {k for k in present if plan.actions[k] == COMPUTE}
    outputs = {k for k in present if not any(k in mm.parents[c] and c in computed for c in present)}
    backward = [k for k in reversed(present) if k in computed and not mm.layers[k].materializable]
    bset = set(backward)

    steps: list[tuple[str, str]] = [("f", k) for k in present] + [("loss", "")] + [("b", k) for k in backward]
    pos = {s: t for t, s in enumerate(steps)}
    loss_step = pos[("loss", "")]
    size: dict[tuple[str, str], float] = {}
    last: dict[tuple[str, str], int] = {}
    for k in present:
        node = mm.layers[k]
        size[("f", k)] = (max(node.act_bytes, node.out_bytes) if k in computed else node.out_bytes) * batch_size
        uses = [pos[("f", c)] for c in present if c in computed and k in mm.parents[c]]
        if k in outputs:
            uses.append(loss_step)
        if k in bset:
            uses.append(pos[("b", k)])
        uses += [pos[("b", c)] for c in backward if k in mm.parents[c]]
        last[("f", k)] = max(uses, default=pos[("f", k)])
    for k in backward:
        size[("b", k)] = max(mm.layers[k].act_bytes, mm.layers[k].out_bytes) * batch_size
        uses = [pos[("b", p)] for p in mm.parents[k] if p in bset]
        last[("b", k)] = max(uses, default=pos[("b", k)])
    delta = [0.0] * (len(steps) + 1)  # sweep: +size at the producing step, -size after the last use
    for tensor, s in size.items():
        delta[pos[tensor]] += s
        delta[last[tensor] + 1] -= s
    peak = live = 0.0
    for d in delta:
        live += d
        peak = max(peak, live)
    params = sum(mm.layers[k].param_bytes for k in computed)
    trainable = sum(mm.layers[k].trainable_param_bytes for k in computed)
    return int(params + trainable * (2 + optimizer_slots) + workspace_bytes + peak)
