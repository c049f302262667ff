"""The member check of a fused pack (`FusedPack.check`): before any member trains in a pack, each member's own module
(its own object, attributes and forward) is compared with what the pack computes for it, in training and in eval
mode, on the first batch; configs whose forward differs only by a plain attribute, by a value read from the config
inside `forward`, or by what the forward does in training mode never share a fused computation, and the error says
which config and why. Through the driver, such a pack's members train alone, each as it would, and the run's
`pack_not_fused` event names the reason."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import automl
from framework.driver import Driver, MemoryRunLog
from framework.engine.local import LocalBackend
from framework.engine.packs import FusedPack, PackError
from framework.examples import classifier_step_fn
from framework.functions import UserFunctions, pack_key
from framework.options import RunOptions

N, BATCH = 64, 16


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 8, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


class _ByAttribute(nn.Module):
    """The forward reads a plain attribute set from the config (common in research code)."""

    def __init__(self, act: str) -> None:
        super().__init__()
        self.fc, self.head, self.act = nn.Linear(8, 16), nn.Linear(16, 3), act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(getattr(F, self.act)(self.fc(x)))


def _closure_model(config: dict) -> nn.Module:
    """The forward reads the config itself (a closure): same parameters, repr and attributes for every config."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.head = nn.Linear(8, 16), nn.Linear(16, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(getattr(F, config["act"])(self.fc(x)))

    return Net()


def _training_mode_model(config: dict) -> nn.Module:
    """Members that agree in eval mode and differ only in training mode (a dropout rate read from the config)."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.head = nn.Linear(8, 16), nn.Linear(16, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(F.dropout(torch.relu(self.fc(x)), config["p"], self.training))

    return Net()


class _Counter(nn.Module):
    """A forward that changes a plain attribute (a step counter): a pack runs one copy of the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.steps = nn.Linear(8, 3), 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        return self.fc(x) * (1.0 if self.steps < 3 else 2.0)


def _members(build, configs: list[dict]) -> tuple[list[nn.Module], list[torch.optim.Optimizer]]:
    models, opts = [], []
    for config in configs:
        torch.manual_seed(0)
        m = build(config)
        models.append(m)
        opts.append(torch.optim.SGD(m.parameters(), lr=config.get("lr", 0.1)))
    return models, opts


def _train(build, configs: list[dict]) -> FusedPack:
    models, opts = _members(build, configs)
    for m in models:
        m.train()
    pack = FusedPack(models, opts, ids=[10 + i for i in range(len(configs))])
    orders = [torch.randperm(N, generator=torch.Generator().manual_seed(i)) for i in range(len(configs))]
    pack.train(classifier_step_fn, _data(), [{**c, "batch_size": BATCH} for c in configs], orders)
    return pack


def test_members_that_differ_by_a_plain_attribute_never_share_a_pack():
    models, opts = _members(lambda c: _ByAttribute(c["act"]), [{"act": "relu"}, {"act": "tanh"}])
    with pytest.raises(PackError, match="plain attributes"):
        FusedPack(models, opts)
    # the driver's key tells them apart already (so they are never grouped), and keeps equal ones together
    key = pack_key(lambda c: (m := _ByAttribute(c["act"]), torch.optim.SGD(m.parameters(), lr=c["lr"])))
    assert key({"act": "relu", "lr": 0.1}) != key({"act": "tanh", "lr": 0.1})
    assert key({"act": "relu", "lr": 0.1}) == key({"act": "relu", "lr": 0.5})


@pytest.mark.parametrize("build, configs, mode", [
    (_closure_model, [{"act": "relu"}, {"act": "relu"}, {"act": "tanh"}], "training"),
    (_training_mode_model, [{"p": 0.0}, {"p": 0.5}], "training"),
], ids=["config-read-in-forward", "training-mode-only"])
def test_members_whose_own_forward_differs_are_refused_naming_the_config(build, configs, mode):
    key = pack_key(lambda c: (m := build(c), torch.optim.SGD(m.parameters(), lr=0.1)))
    assert len({key(c) for c in configs}) == 1  # the cheap key cannot see it: the check must
    with pytest.raises(PackError, match=rf"config {10 + len(configs) - 1}'s own forward differs .* in {mode} mode"):
        _train(build, configs)


def test_the_training_mode_check_covers_dropout_while_equal_members_still_fuse():
    pack = _train(_training_mode_model, [{"p": 0.3}, {"p": 0.3}, {"p": 0.3}])
    assert pack.path == "fused" and pack.why_generic is None  # (dropout's draws differ per member; the check's not)


def test_a_forward_that_changes_its_modules_attributes_trains_alone():
    with pytest.raises(PackError, match="changes its module's plain attributes"):
        _train(lambda c: _Counter(), [{}, {}])


def test_equal_members_pass_the_check_and_train_as_they_would_alone():
    configs = [{"act": "relu", "lr": 0.05}, {"act": "relu", "lr": 0.2}]
    pack = _train(_closure_model, configs)
    pack.write_back()
    assert pack.path == "fused"
    for i, config in enumerate(configs):
        torch.manual_seed(0)
        alone = _closure_model(config)
        opt = torch.optim.SGD(alone.parameters(), lr=config["lr"])
        order = torch.randperm(N, generator=torch.Generator().manual_seed(i))
        x, y = _data()
        for ids in order.split(BATCH):
            opt.zero_grad()
            F.cross_entropy(alone(x[ids]), y[ids]).backward()
            opt.step()
        for (name, a), b in zip(alone.state_dict().items(), pack.models[i].state_dict().values(), strict=True):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6, msg=name)


def _closure_model_fn(config: dict):
    m = _closure_model(config)
    return m, torch.optim.SGD(m.parameters(), lr=config["lr"])


def _entries() -> dict:
    x, y = _data()
    return {p: ([(x[p * 32:(p + 1) * 32], y[p * 32:(p + 1) * 32])], [(x[:16], y[:16])]) for p in range(2)}


def _run(pack):
    backend = LocalBackend(UserFunctions(_closure_model_fn, step_fn=classifier_step_fn), _entries(), num_threads=1)
    log = MemoryRunLog()
    space = {"act": ["relu", "tanh"], "lr": [0.05, 0.1], "batch_size": [8]}
    driver = Driver(backend, automl.GridSearch(space, epochs=2), log, {0: [0], 1: [1]}, [0, 1],
                    RunOptions(deterministic=True, seed=1, pack=pack), pack_key=pack_key(_closure_model_fn))
    driver.run()
    weights = {c.id: driver.run_state.backend.get(c.state)["model"] for c in driver.run_state.configs}
    return log, weights


def test_on_the_engine_a_pack_of_differing_forwards_trains_alone_and_the_event_says_why():
    packed, wp = _run(4)
    alone, wa = _run(1)
    why = [d for kind, d in packed.events if kind == "pack_not_fused"]
    assert why and "own forward differs" in why[0]["why"]
    for cid in wa:  # each config ends as it does at pack=1: nothing trained with another's forward
        for name, t in wa[cid].items():
            torch.testing.assert_close(wp[cid][name], t, rtol=1e-4, atol=1e-6, msg=f"config {cid}: {name}")
