"""Fused packs (`framework.engine.packs`): k members trained at once end each with the weights, buffers, optimizer
state and metrics it reaches alone (float tolerance), for SGD and Adam with different hyper-parameters per member, on
the fused path (fused modules on a folded batch) and on the generic one (vmap of `functional_call`); a forward that
mixes rows falls back to the generic path; a member that diverges disturbs no other; what cannot be packed is
refused with an error that names it."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from framework.engine.packs import FusedPack, PackError, StackedOptimizer, signature
from framework.engine.steps import StepLoop
from framework.examples import classifier_step_fn, mlp_model_fn

N, BATCH = 64, 16
BASE = {"in_features": 8, "hidden": 16, "layers": 2, "classes": 3, "batch_size": BATCH}


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 8, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


class _Direct(nn.Module):
    """A parameter used directly in the forward: the generic path."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.head, self.scale = nn.Linear(8, 16), nn.Linear(16, 3), nn.Parameter(torch.ones(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.fc(x)) * self.scale)


class _MixesRows(nn.Module):
    """A forward that mixes rows across the batch: folding would be wrong, so the pack goes generic."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.head = nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return self.head(torch.relu(h - h.mean(0)))


class _Cnn(nn.Module):
    """Convolution, batch norm (running statistics), layer norm: the fused path. (No bias before the batch norm:
    its gradient is rounding noise, which Adam would amplify.)"""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.LayerNorm(4), nn.Linear(4, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x.view(-1, 1, 2, 4))


def _net(kind: str, config: dict) -> nn.Module:
    if kind == "mlp":
        return mlp_model_fn(config)[0]
    return {"direct": _Direct, "mixes": _MixesRows, "cnn": _Cnn}[kind]()


def _optimizer(model: nn.Module, config: dict) -> torch.optim.Optimizer:
    name, lr, wd = config.get("optimizer", "sgd"), config["lr"], config.get("weight_decay", 0.0)
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, weight_decay=wd, momentum=config.get("momentum", 0.9),
                               dampening=config.get("dampening", 0.0), nesterov=config.get("nesterov", False))
    kind = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
    return kind(model.parameters(), lr=lr, weight_decay=wd, betas=config.get("betas", (0.9, 0.999)))


def _build(kind: str, config: dict, seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = _net(kind, config)
    return model, _optimizer(model, config)


def _orders(k: int, p: int) -> list[torch.Tensor]:
    return [torch.randperm(N, generator=torch.Generator().manual_seed(100 * i + p)) for i in range(k)]


def _packed(kind: str, configs: list[dict], passes: int = 2, generic: bool = False):
    built = [_build(kind, c, 10 + i) for i, c in enumerate(configs)]
    for p in range(passes):  # the second pass starts from the state the first wrote back
        pack = FusedPack([m for m, _ in built], [o for _, o in built], generic=generic)
        metrics = pack.train(classifier_step_fn, _data(), configs, _orders(len(configs), p))
        pack.write_back()
    return built, metrics, pack.path


def _alone(kind: str, config: dict, i: int, passes: int = 2):
    model, opt = _build(kind, config, 10 + i)
    for p in range(passes):
        torch.manual_seed(100 * i + p)  # the unit's seed, before the loop's randperm
        metrics = StepLoop(classifier_step_fn).train(model, opt, _data(), config)
    return model, opt, metrics


def _assert_as_alone(kind: str, configs: list[dict], built, metrics, members=None) -> None:
    for i in members if members is not None else range(len(configs)):
        model, opt = built[i]
        alone, alone_opt, alone_metrics = _alone(kind, configs[i], i)
        for (name, a), b in zip(model.state_dict().items(), alone.state_dict().values(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"member {i}: {name}")
        for p_pack, p_alone in zip(model.parameters(), alone.parameters(), strict=True):
            state, alone_state = opt.state[p_pack], alone_opt.state[p_alone]
            assert state.keys() == alone_state.keys()
            for key in state:
                torch.testing.assert_close(state[key], alone_state[key], rtol=1e-5, atol=1e-6, msg=f"{i}: {key}")
        assert metrics[i]["num_examples"] == alone_metrics["num_examples"] == N
        assert metrics[i]["loss"] == pytest.approx(alone_metrics["loss"], rel=1e-4)
        assert metrics[i]["accuracy"] == pytest.approx(alone_metrics["accuracy"], abs=1e-6)


SGD = [{**BASE, "lr": 0.05}, {**BASE, "lr": 0.2, "weight_decay": 1e-3}, {**BASE, "lr": 0.01, "weight_decay": 0.1}]
NESTEROV = [{**BASE, "lr": 0.05, "nesterov": True}, {**BASE, "lr": 0.1, "momentum": 0.5, "nesterov": True}]
DAMPENED = [{**BASE, "lr": 0.05, "dampening": 0.5}, {**BASE, "lr": 0.1, "momentum": 0.0, "weight_decay": 0.01}]
ADAM = [{**BASE, "optimizer": "adam", "lr": 1e-3}, {**BASE, "optimizer": "adam", "lr": 1e-2, "weight_decay": 1e-2,
                                                     "betas": (0.8, 0.99)}]
ADAMW = [{**BASE, "optimizer": "adamw", "lr": 1e-3, "weight_decay": 0.1}, {**BASE, "optimizer": "adamw", "lr": 1e-2}]


@pytest.mark.parametrize(("kind", "path", "configs"), [
    ("mlp", "fused", SGD), ("mlp", "fused", NESTEROV), ("mlp", "fused", DAMPENED), ("mlp", "fused", ADAM),
    ("mlp", "fused", ADAMW), ("direct", "generic", SGD), ("direct", "generic", ADAM), ("cnn", "fused", ADAM),
], ids=["sgd-momentum", "nesterov", "dampening", "adam", "adamw", "generic-sgd", "generic-adam", "cnn-adam"])
def test_each_member_of_a_pack_ends_as_it_would_alone(kind, path, configs):
    built, metrics, taken = _packed(kind, configs)
    assert taken == path
    _assert_as_alone(kind, configs, built, metrics)


@pytest.mark.parametrize("generic", [False, True], ids=["fused", "generic"])
def test_batch_norm_keeps_each_members_running_statistics(generic):
    built, metrics, taken = _packed("cnn", SGD, generic=generic)
    assert taken == ("generic" if generic else "fused")
    stats = [dict(m.body[1].named_buffers()) for m, _ in built]
    assert not torch.equal(stats[0]["running_mean"], stats[1]["running_mean"])
    assert all(int(s["num_batches_tracked"]) == 2 * N // BATCH for s in stats)
    _assert_as_alone("cnn", SGD, built, metrics)  # (state_dict: the running statistics of each member alone)


def test_a_forward_that_mixes_rows_falls_back_to_the_generic_path():
    built, metrics, taken = _packed("mixes", SGD)
    assert taken == "generic"
    _assert_as_alone("mixes", SGD, built, metrics)


@pytest.mark.parametrize("kind", ["mlp", "direct"])
def test_a_diverging_member_disturbs_no_other(kind):
    configs = [{**BASE, "lr": 0.05}, {**BASE, "lr": 1e6}, {**BASE, "lr": 0.1, "weight_decay": 0.01}]
    built, metrics, _ = _packed(kind, configs)
    assert not math.isfinite(metrics[1]["loss"])
    _assert_as_alone(kind, configs, built, metrics, members=[0, 2])


def test_dropout_draws_per_member():
    def dropout_step(model, batch, config):
        x, y = batch
        return nn.functional.cross_entropy(nn.functional.dropout(model(x), 0.5), y)

    built = [_build("mlp", {**BASE, "lr": 0.1}, 0) for _ in range(2)]  # identical members
    pack = FusedPack([m for m, _ in built], [o for _, o in built])
    metrics = pack.train(dropout_step, _data(), [{**BASE, "lr": 0.1}] * 2, [torch.arange(N)] * 2)
    assert pack.path == "fused" and metrics[0]["loss"] != metrics[1]["loss"]


def test_signature_groups_what_can_share_a_pack():
    def sig(config, seed=0):
        return signature(*_build("mlp", config, seed))

    assert sig({**BASE, "lr": 0.1}) == sig({**BASE, "lr": 0.3, "weight_decay": 0.1}, seed=1)
    assert len({sig({**BASE, "lr": 0.1}), sig({**BASE, "lr": 0.1, "hidden": 32}), sig({**BASE, "optimizer": "adam",
                                                                                          "lr": 0.1})}) == 3
    a, b = nn.Sequential(nn.Linear(2, 2), nn.ReLU()), nn.Sequential(nn.Linear(2, 2), nn.Tanh())
    assert signature(a, torch.optim.SGD(a.parameters())) != signature(b, torch.optim.SGD(b.parameters()))


def test_what_cannot_be_packed_is_refused_naming_it():
    x, y = _data()
    a, b = _build("mlp", {**BASE, "lr": 0.1}, 0), _build("mlp", {**BASE, "hidden": 32, "lr": 0.1}, 1)
    with pytest.raises(PackError, match="differ in their parameters' names, shapes or dtypes"):
        FusedPack([a[0], b[0]], [a[1], b[1]])
    c = _build("mlp", {**BASE, "optimizer": "adam", "lr": 0.1}, 2)
    with pytest.raises(PackError, match=r"optimizers are \['Adam', 'SGD'\]"):
        FusedPack([a[0], c[0]], [a[1], c[1]])
    relu, tanh = nn.Sequential(nn.Linear(8, 3), nn.ReLU()), nn.Sequential(nn.Linear(8, 3), nn.Tanh())
    with pytest.raises(PackError, match=r"differ in their modules"):
        FusedPack([relu, tanh], [torch.optim.SGD(m.parameters(), lr=0.1) for m in (relu, tanh)])
    ams = [torch.optim.Adam(m.parameters(), amsgrad=True) for m in (a[0], c[0])]
    with pytest.raises(PackError, match="`amsgrad`"):
        FusedPack([a[0], c[0]], ams)
    groups = [torch.optim.SGD([{"params": m[0].parameters()}, {"params": m[2].parameters()}], lr=0.1)
              for m in (a[0], c[0])]
    with pytest.raises(PackError, match="several parameter groups"):
        FusedPack([a[0], c[0]], groups)
    d = _build("mlp", {**BASE, "lr": 0.3}, 3)
    pack = FusedPack([a[0], d[0]], [a[1], d[1]])
    with pytest.raises(PackError, match=r"batch sizes are \[8, 16\]"):
        pack.train(classifier_step_fn, (x, y), [BASE, {**BASE, "batch_size": 8}], _orders(2, 0))

    def reads_lr(model, batch, config):  # a step that reads a key the members disagree on
        return classifier_step_fn(model, batch, config)[0] * config["lr"]

    before = [p.detach().clone() for p in a[0].parameters()]
    with pytest.raises(PackError, match=r"step_fn reads config \['lr'\], whose values differ among the members"):
        pack.train(reads_lr, (x, y), [{**BASE, "lr": 0.1}, {**BASE, "lr": 0.3}], _orders(2, 0))
    pack.write_back()  # (refused before its first optimizer step: nothing changed)
    assert all(torch.equal(p, q) for p, q in zip(a[0].parameters(), before, strict=True))


@pytest.mark.parametrize("kind", [torch.optim.SGD, torch.optim.Adam])
def test_the_stacked_optimizer_steps_as_torch_when_a_parameter_has_no_gradient_at_first(kind):
    torch.manual_seed(0)
    alone = [[torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True)] for _ in range(3)]
    packed = [[t.detach().clone().requires_grad_() for t in m] for m in alone]
    settings = {"momentum": 0.9, "dampening": 0.3} if kind is torch.optim.SGD else {"betas": (0.9, 0.99)}

    def optimizers(members):
        return [kind(m, lr=0.1 * (i + 1), weight_decay=0.01 * i, **settings) for i, m in enumerate(members)]

    alone_opts, packed_opts = optimizers(alone), optimizers(packed)
    stacked = {n: torch.stack([m[j].detach() for m in packed]).requires_grad_() for j, n in enumerate("wb")}
    pack = StackedOptimizer(packed_opts, stacked, ["w", "b"])
    for step in range(4):  # b has no gradient in steps 0 and 1: its first step comes after w's
        grads = {"w": torch.randn(3, 4, 3), "b": torch.randn(3, 3) if step >= 2 else None}
        for n, t in stacked.items():
            t.grad = grads[n]
        pack.step()
        for i, (m, opt) in enumerate(zip(alone, alone_opts, strict=True)):
            for t, n in zip(m, "wb", strict=True):
                t.grad = None if grads[n] is None else grads[n][i].clone()
            opt.step()
    pack.write_back()
    for i in range(3):
        for j, n in enumerate("wb"):
            torch.testing.assert_close(stacked[n][i], alone[i][j])
            state, alone_state = packed_opts[i].state[packed[i][j]], alone_opts[i].state[alone[i][j]]
            assert state.keys() == alone_state.keys()
            for key in state:
                torch.testing.assert_close(state[key], alone_state[key])
