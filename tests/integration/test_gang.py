"""Data-parallel gangs (`framework.engine.gang`) among real Ray actors: a gang of two trains to the weights one worker
reaches on the same global batches, also when its members hold unequal numbers of batches; a group set up once
serves many steps."""

from __future__ import annotations

import pytest
import torch

from framework.engine.gang import GangMember

pytestmark = pytest.mark.ray


def _batches(seed: int, n: int, rows: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(rows, 5, generator=g), torch.randint(0, 3, (rows,), generator=g)) for _ in range(n)]


def _model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _train(model, optimizer, batches) -> None:
    """A user's train_fn: plain SGD steps with a mean-reduced loss."""
    for x, y in batches:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


class _Member(GangMember):
    """A worker actor's side of a gang."""

    def __init__(self) -> None:
        torch.set_num_threads(1)

    def train(self, seed: int, n: int) -> tuple[dict, int, int]:
        model, optimizer = _model_and_optimizer()
        averaging = self.gang.averaging(optimizer)
        torch.optim.lr_scheduler.StepLR(optimizer, step_size=100)  # a user's scheduler, made inside the gang
        _train(model, optimizer, _batches(seed, n))
        followed = self.gang.finish(optimizer)
        averaging.restore()
        return model.state_dict(), followed, self.gang.steps


@pytest.mark.parametrize("counts", [(3, 3), (5, 2)])
def test_a_gang_of_two_takes_the_steps_of_one_worker_on_the_global_batches(ray_actors, counts):
    ray_cluster = ray_actors
    member = ray_cluster.remote(num_cpus=1)(_Member)
    a, b = member.remote(), member.remote()
    port = ray_cluster.get(a.host_gang.remote())
    assert ray_cluster.get([a.join_gang.remote("g", 0, 2, port), b.join_gang.remote("g", 1, 2, port)]) == [0, 1]
    (wa, followed_a, steps_a), (wb, followed_b, steps_b) = ray_cluster.get(
        [a.train.remote(0, counts[0]), b.train.remote(1, counts[1])])
    mine, theirs = _batches(0, counts[0]), _batches(1, counts[1])
    common = min(counts)
    global_batches = [(torch.cat([x0, x1]), torch.cat([y0, y1])) for (x0, y0), (x1, y1) in zip(mine, theirs)]
    global_batches += (mine if counts[0] > counts[1] else theirs)[common:]  # the one with more batches, alone
    model, optimizer = _model_and_optimizer()
    _train(model, optimizer, global_batches)
    for k, v in model.state_dict().items():
        assert torch.equal(wa[k], wb[k]), f"the members' {k} differ"
        assert torch.allclose(wa[k], v, atol=1e-6), f"{k}: the gang differs from one worker on the global batches"
    assert (followed_a, followed_b) == (0, counts[0] - counts[1]) and steps_a == steps_b == max(counts) + 1
    # the group lives on: a second pass needs no new rendezvous
    (wa2, _, steps_a2), _ = ray_cluster.get([a.train.remote(2, 2), b.train.remote(3, 2)])
    assert steps_a2 == steps_a + 3
    for actor in (a, b):
        ray_cluster.kill(actor)
