"""Fused packs (`framework.engine.packs`): k members trained at once end each with the weights, buffers, optimizer
state and metrics it reaches alone (float tolerance), for SGD and Adam with different hyper-parameters per member, on
the fused path (fused modules on a folded batch) and on the generic one (vmap of `functional_call`); a forward that
mixes rows falls back to the generic path; a member that diverges disturbs no other; what cannot be packed is
refused with an error that names it. Members with LR schedulers (per step or per epoch, each its own) end as alone,
schedulers included; a fused evaluation equals each member's `StepLoop.evaluate`; the runner fuses both (an enabled
GradScaler refused by name)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from framework.data import PartitionedDataset, data_len
from framework.engine.packs import FusedPack, PackError, StackedOptimizer
from framework.engine.state import unpack_state
from framework.engine.steps import StepLoop
from framework.engine.worker import Worker
from framework.examples import classifier_step_fn, mlp_model_fn
from framework.functions import UserFunctions, pack_key, signature
from framework.scheduling import EVAL, TRAIN, Unit, UnitTask
from framework.trainable import Trainable

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


# --- LR schedulers per member, fused evaluation, and the runner around both ----------------------------------------

PASSES = 3
STEPS = PASSES * N // BATCH  # the optimizer steps of `PASSES` passes


def _scheduler(opt: torch.optim.Optimizer, config: dict) -> torch.optim.lr_scheduler.LRScheduler | None:
    kind, *args = config.get("schedule", (None,))
    if kind == "steplr":
        return torch.optim.lr_scheduler.StepLR(opt, step_size=args[0], gamma=args[1])
    if kind == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args[0])
    if kind == "onecycle":  # (cycles SGD's momentum or Adam's beta1 too)
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args[0], total_steps=STEPS)
    return None


def _group(opt: torch.optim.Optimizer) -> dict:
    return {k: v for k, v in opt.param_groups[0].items() if k != "params"}


SCHEDULED_SGD = [
    {**BASE, "lr": 0.1, "schedule": ("steplr", 2, 0.5)},
    {**BASE, "lr": 0.05, "weight_decay": 1e-3, "schedule": ("steplr", 3, 0.8)},
    {**BASE, "lr": 0.1, "schedule": ("onecycle", 0.3)},
    {**BASE, "lr": 0.2, "momentum": 0.5, "schedule": ("cosine", 5)},
    {**BASE, "lr": 0.1, "schedule": ("steplr", 1, 0.5), "interval": "epoch"},
    {**BASE, "lr": 0.05},
]
SCHEDULED_ADAM = [
    {**BASE, "optimizer": "adamw", "lr": 1e-2, "weight_decay": 0.1, "schedule": ("cosine", 4)},
    {**BASE, "optimizer": "adamw", "lr": 3e-3, "weight_decay": 0.01, "schedule": ("steplr", 2, 0.5)},
    {**BASE, "optimizer": "adamw", "lr": 1e-3, "weight_decay": 0.05, "schedule": ("onecycle", 2e-2)},
    {**BASE, "optimizer": "adamw", "lr": 1e-2, "schedule": ("steplr", 1, 0.3), "interval": "epoch"},
]


def _scheduled(kind: str, configs: list[dict], packed: bool):
    """Each config trained `PASSES` passes with its own scheduler, packed (one `FusedPack` per pass) or alone
    (`StepLoop`); a per-epoch scheduler stepped between passes either way, as the worker does. (models, optimizers,
    schedulers, the last pass's metrics)."""
    built = [_build(kind, c, 10 + i) for i, c in enumerate(configs)]
    schedulers = [_scheduler(o, c) for (_, o), c in zip(built, configs, strict=True)]
    per_step = [s if c.get("interval", "step") == "step" else None for s, c in zip(schedulers, configs, strict=True)]
    metrics = [None] * len(configs)
    for p in range(PASSES):
        for s, c in zip(schedulers, configs, strict=True):
            if p and s is not None and c.get("interval") == "epoch":
                s.step()
        if packed:
            pack = FusedPack([m for m, _ in built], [o for _, o in built])
            metrics = pack.train(classifier_step_fn, _data(), configs, _orders(len(configs), p), lr_schedulers=per_step)
            pack.write_back()
            continue
        for i, ((model, opt), s, c) in enumerate(zip(built, schedulers, configs, strict=True)):
            torch.manual_seed(100 * i + p)  # (`_orders`' draw, as the unit's seed draws it)
            metrics[i] = StepLoop(classifier_step_fn).train(model, opt, _data(), c, lr_scheduler=s,
                                                            scheduler_interval=c.get("interval", "step"))
    return built, schedulers, metrics


@pytest.mark.parametrize("configs", [SCHEDULED_SGD, SCHEDULED_ADAM], ids=["sgd", "adamw"])
def test_each_member_follows_its_own_lr_schedule_as_alone(configs):
    packed, packed_schedulers, metrics = _scheduled("mlp", configs, packed=True)
    alone, alone_schedulers, alone_metrics = _scheduled("mlp", configs, packed=False)
    for i in range(len(configs)):
        (model, opt), (alone_model, alone_opt) = packed[i], alone[i]
        # weights of magnitude ~0.1-1 after 12 steps: 1e-5 relative, 1e-6 absolute is float32 rounding, not a step
        for (name, a), b in zip(model.state_dict().items(), alone_model.state_dict().values(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"member {i}: {name}")
        for p_pack, p_alone in zip(model.parameters(), alone_model.parameters(), strict=True):
            state, alone_state = opt.state[p_pack], alone_opt.state[p_alone]
            assert state.keys() == alone_state.keys()
            for key in state:  # (moments ~1e-3-1: the same tolerances hold with margin)
                torch.testing.assert_close(state[key], alone_state[key], rtol=1e-5, atol=1e-6, msg=f"{i}: {key}")
        assert _group(opt) == _group(alone_opt)  # lr, and OneCycleLR's momentum or betas, exactly
        s, alone_s = packed_schedulers[i], alone_schedulers[i]
        if s is not None:
            assert s.state_dict() == alone_s.state_dict() and s.get_last_lr() == alone_s.get_last_lr()
            assert opt.param_groups[0]["lr"] != configs[i]["lr"]  # (the schedule did move it)
        assert metrics[i]["loss"] == pytest.approx(alone_metrics[i]["loss"], rel=1e-4)
        assert metrics[i]["num_examples"] == alone_metrics[i]["num_examples"] == N


def _eval_step(model, batch, config):
    """An evaluation without a loss: metrics only."""
    x, y = batch
    logits = model(x)
    return {"accuracy": (logits.argmax(1) == y).float().mean(), "nll": nn.functional.cross_entropy(logits, y),
            "top": logits.max(1).values.mean(), "rows": 1}


class _Dropout(nn.Module):
    """Dropout in the forward: evaluation must switch it off (eval mode), else members draw noise."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


@pytest.mark.parametrize("eval_step", [None, _eval_step], ids=["step_fn", "eval_step"])
@pytest.mark.parametrize(("kind", "path"), [("mlp", "fused"), ("direct", "generic"), ("cnn", "fused"),
                                            ("dropout", "fused")])
def test_fused_evaluation_equals_each_members_evaluation_alone(kind, path, eval_step):
    configs = [{**c, "eval_batch_size": 24} for c in SGD]  # (64 rows: batches of 24, 24, 16)
    torch.manual_seed(0)
    models = [_Dropout() if kind == "dropout" else _build(kind, c, 10 + i)[0] for i, c in enumerate(configs)]
    if kind == "cnn":  # running statistics of their own (eval mode reads them)
        with torch.no_grad():
            for i, m in enumerate(models):
                m.body[1].running_mean.uniform_(-0.5, 0.5)
                m.body[1].running_var.fill_(0.5 + i)
    pack = FusedPack([m.train() for m in models], [torch.optim.SGD(m.parameters(), lr=0.1) for m in models])
    stacked = {n: t.clone() for n, t in pack.tensors.items()}
    fn, name = (eval_step, "eval_step") if eval_step is not None else (classifier_step_fn, "step_fn")
    with torch.no_grad():
        metrics = pack.evaluate(fn, _data(), configs, name=name)
    assert pack.path == path
    assert pack.base.training and all(torch.equal(t, stacked[n]) for n, t in pack.tensors.items())  # nothing moved
    for i, (model, config) in enumerate(zip(models, configs, strict=True)):
        model.eval()
        with torch.no_grad():
            alone = StepLoop(classifier_step_fn, eval_step).evaluate(model, _data(), config)
        assert metrics[i].keys() == alone.keys()
        assert metrics[i]["num_examples"] == alone["num_examples"] == N
        for key in alone.keys() - {"num_examples"}:  # means of float32 values ~0.1-3: float rounding only
            assert metrics[i][key] == pytest.approx(alone[key], rel=1e-5, abs=1e-6), (i, key)
    with pytest.raises(PackError, match=r"evaluation batch sizes are \[16, 24\]"):
        pack.evaluate(fn, _data(), [configs[0], BASE, configs[2]], name=name)


def _scheduled_model_fn(config: dict) -> Trainable:
    """`mlp_model_fn`'s model and optimizer with the config's LR scheduler (and GradScaler)."""
    model, opt = mlp_model_fn(config)
    scaler = torch.amp.GradScaler("cpu", enabled=config["amp"]) if "amp" in config else None
    return Trainable(model, opt, _scheduler(opt, config), scaler, config.get("interval", "step"))


def _runner_worker(eval_step=None) -> Worker:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(120, 8, generator=g)
    ds = PartitionedDataset.from_arrays(x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long(), num_partitions=2,
                                        valid_fraction=0.3, seed=0)
    w = Worker(0, UserFunctions(_scheduled_model_fn, step_fn=classifier_step_fn, eval_step=eval_step))
    w.load({p: ([ds.train[p]], [ds.valid[p]]) for p in range(2)})
    return w


def test_the_runner_fuses_scheduled_members_and_their_evaluation_as_alone(monkeypatch):
    """On an in-process worker: a pack of members with per-step and per-epoch schedulers trains fused (no note) to
    each member's state alone, scheduler included; its evaluation units run fused, each report as alone; an enabled
    GradScaler is refused by name, a disabled one packs."""
    fused = {"train": 0, "evaluate": 0}

    def counted(name: str, fn):
        def spy(self, *args, **kwargs):
            fused[name] += 1
            return fn(self, *args, **kwargs)
        return spy

    for name in fused:
        monkeypatch.setattr(FusedPack, name, counted(name, getattr(FusedPack, name)))
    w = _runner_worker(_eval_step)
    base = {**BASE, "batch_size": 8, "eval_batch_size": 10}
    configs = ({**base, "lr": 0.1, "schedule": ("steplr", 3, 0.5)},
               {**base, "lr": 0.05, "schedule": ("cosine", 7), "amp": False},
               {**base, "lr": 0.2, "schedule": ("steplr", 1, 0.5), "interval": "epoch"})
    members, seed = (3, 5, 8), 7
    states: tuple = (None,) * 3
    for epoch in range(2):  # (epoch 1: the per-epoch scheduler steps as each member is built)
        task = UnitTask(Unit(3, epoch, 0, TRAIN), configs[0], seed, members=members, configs=configs)
        states, reports = w.run_members(task, states)
        assert all(r.error is None and r.note is None for r in reports), [r.error or r.note for r in reports]
    assert fused["train"] == 2
    evaluation = UnitTask(Unit(3, 1, 1, EVAL), configs[0], seed, members=members, configs=configs)
    no_states, eval_reports = w.run_members(evaluation, states)
    assert fused["evaluate"] == 1 and no_states == (None,) * 3
    assert len({(r.start, r.end) for r in eval_reports}) == 1  # (the pack held the worker as one)
    for cid, config, state, report in zip(members, configs, states, eval_reports, strict=True):
        alone = None
        for epoch in range(2):
            alone, _ = w.run(UnitTask(Unit(cid, epoch, 0, TRAIN), config, seed), alone)
        a, b = unpack_state(state), unpack_state(alone)
        for k, v in b["model"].items():  # (weights ~0.1-1, 2 epochs of 6 steps: float32 rounding)
            torch.testing.assert_close(a["model"][k], v, rtol=1e-5, atol=1e-6, msg=f"config {cid}: {k}")
        assert a["lr_scheduler"] == b["lr_scheduler"] and a["visited"] == b["visited"]
        assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
        _, alone_report = w.run(UnitTask(Unit(cid, 1, 1, EVAL), config, seed), alone)
        assert report.error is None and report.note is None and report.unit == alone_report.unit
        assert report.metrics.keys() == alone_report.metrics.keys() == {"accuracy", "nll", "top", "rows"}
        assert report.num_examples == alone_report.num_examples == data_len(w.data[("valid", 1)])
        for key, value in alone_report.metrics.items():
            assert report.metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (cid, key)
    amp = (configs[0], {**configs[1], "amp": True})  # bfloat16 autocast with a scaler on the CPU
    _, reports = w.run_members(UnitTask(Unit(3, 0, 0, TRAIN), amp[0], seed, members=(3, 5), configs=amp), (None,) * 2)
    assert fused["train"] == 2 and all(r.error is None for r in reports)
    assert reports[0].note == "not fused: config 5 has an enabled GradScaler (mixed precision), which a pack does " \
                              "not stack"
    key = pack_key(_scheduled_model_fn)
    assert key(configs[0]) == key(configs[1]) == key(configs[2]) is not None and key(amp[1]) is None
