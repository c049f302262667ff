"""Fused packs (`framework.engine.packs`): k members trained at once end each with the weights, optimizer state and
metrics it reaches alone (float tolerance), for SGD and Adam with different hyper-parameters per member; what cannot
be packed is refused with an error that names it."""

from __future__ import annotations

import pytest
import torch

from framework.engine.packs import FusedPack, PackError
from framework.engine.steps import StepLoop
from framework.examples import classifier_step_fn, mlp_model_fn

BASE = {"in_features": 8, "hidden": 16, "layers": 2, "classes": 3, "batch_size": 16}


def _data(n: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


def _build(config, seed):
    torch.manual_seed(seed)
    return mlp_model_fn(config)


def _alone(config, seed, order_seed, passes):
    model, opt = _build(config, seed)
    out = []
    for p in range(passes):
        torch.manual_seed(order_seed + p)  # the unit's seed, before the loop's randperm
        out.append(StepLoop(classifier_step_fn).train(model, opt, _data(), config))
    return model, opt, out


@pytest.mark.parametrize("configs", [
    [{**BASE, "lr": 0.05}, {**BASE, "lr": 0.2, "weight_decay": 1e-3}, {**BASE, "lr": 0.01, "weight_decay": 0.1}],
    [{**BASE, "optimizer": "adam", "lr": 1e-3}, {**BASE, "optimizer": "adam", "lr": 1e-2, "weight_decay": 1e-2}],
], ids=["sgd-momentum", "adam"])
def test_each_member_of_a_pack_ends_as_it_would_alone(configs):
    x, y = _data()
    built = [_build(c, 10 + i) for i, c in enumerate(configs)]
    for p in range(2):  # two passes: the second starts from the optimizer state the first wrote back
        pack = FusedPack([m for m, _ in built], [o for _, o in built])
        orders = [torch.randperm(len(x), generator=torch.Generator().manual_seed(100 * i + p))
                  for i in range(len(configs))]
        metrics = pack.train(classifier_step_fn, (x, y), configs, orders)
        pack.write_back()
    for i, (config, (model, opt)) in enumerate(zip(configs, built, strict=True)):
        alone, alone_opt, alone_metrics = _alone(config, 10 + i, 100 * i, 2)
        for (name, a), b in zip(model.named_parameters(), alone.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"member {i}: {name}")
        for key in ("momentum_buffer", "exp_avg", "exp_avg_sq"):
            for p_pack, p_alone in zip(model.parameters(), alone.parameters(), strict=True):
                if key in alone_opt.state[p_alone]:
                    torch.testing.assert_close(opt.state[p_pack][key], alone_opt.state[p_alone][key], rtol=1e-5,
                                               atol=1e-6)
        assert metrics[i]["num_examples"] == alone_metrics[-1]["num_examples"] == len(x)
        assert metrics[i]["loss"] == pytest.approx(alone_metrics[-1]["loss"], rel=1e-4)
        assert metrics[i]["accuracy"] == pytest.approx(alone_metrics[-1]["accuracy"], abs=1e-6)


def test_what_cannot_be_packed_is_refused_naming_it():
    x, y = _data()
    a, b = _build({**BASE, "lr": 0.1}, 0), _build({**BASE, "hidden": 32, "lr": 0.1}, 1)
    with pytest.raises(PackError, match="differ in their parameters' names, shapes or dtypes"):
        FusedPack([a[0], b[0]], [a[1], b[1]])
    c = _build({**BASE, "optimizer": "adam"}, 2)
    with pytest.raises(PackError, match=r"optimizers are \['Adam', 'SGD'\]"):
        FusedPack([a[0], c[0]], [a[1], c[1]])
    bn = [torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4)) for _ in range(2)]
    with pytest.raises(PackError, match=r"module '1' \(BatchNorm1d\) keeps running statistics"):
        FusedPack(bn, [torch.optim.SGD(m.parameters(), lr=0.1) for m in bn])
    d = _build({**BASE, "lr": 0.3}, 3)
    pack = FusedPack([a[0], d[0]], [a[1], d[1]])

    def reads_lr(model, batch, config):  # a step that reads a key the members disagree on
        return classifier_step_fn(model, batch, config)[0] * config["lr"]

    orders = [torch.randperm(len(x)) for _ in range(2)]
    with pytest.raises(PackError, match=r"step_fn reads config \['lr'\], whose values differ among the members"):
        pack.train(reads_lr, (x, y), [{**BASE, "lr": 0.1}, {**BASE, "lr": 0.3}], orders)
