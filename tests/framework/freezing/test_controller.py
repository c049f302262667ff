from __future__ import annotations

import copy
import json
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from framework.freezing import (
    CutError,
    FreezingController,
    FreezingPolicyConfig,
    LayerModule,
    frozen_parameter_names,
    split_children,
    split_regex,
)


def _train(controller: FreezingController, model: nn.Module, x, y, steps: int, lr: float = 0.1, batch: int = 8):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    n = x.shape[0]
    for step in range(steps):
        ids = torch.arange(step * batch, (step + 1) * batch) % n
        loss = F.cross_entropy(controller.forward(x[ids], ids), y[ids])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        controller.after_step(loss, optimizer.param_groups[0]["lr"])


def test_controller_frozen_prefix_params_do_not_change_and_have_no_grads(cnn, data, tmp_path):
    x, y = data
    controller = FreezingController(cnn, eval_interval=1000, cache_dir=tmp_path)
    _train(controller, cnn, x, y, steps=3)
    controller.freeze(2, lr=0.1)
    before = {k: v.clone() for k, v in cnn.state_dict().items()}
    _train(controller, cnn, x, y, steps=8)
    frozen = set(controller.frozen_parameter_names())
    assert frozen == {n for lm in controller.modules[:2] for n in lm.parameter_names(cnn)}
    for name, p in cnn.named_parameters():
        if name in frozen:
            assert p.grad is None and not p.requires_grad
            assert torch.equal(p, before[name])
        else:
            assert not torch.equal(p, before[name])
    # batch-norm statistics of the frozen prefix are not updated either (eval mode)
    assert torch.equal(cnn.state_dict()["1.1.running_mean"], before["1.1.running_mean"])
    assert not cnn[1].training and cnn[2].training
    controller.close()


def test_controller_cached_activations_equal_recomputed_ones_bit_for_bit(cnn, data, tmp_path):
    x, y = data
    controller = FreezingController(cnn, eval_interval=1000, cache_dir=tmp_path)
    _train(controller, cnn, x, y, steps=2)
    controller.freeze(2, lr=0.1)
    _train(controller, cnn, x, y, steps=8)  # 64 samples seen: every id of the 32 is cached, then read back
    ids = torch.tensor([5, 0, 31, 17, 8, 9, 10, 11])
    with torch.no_grad():
        recomputed = cnn[1](cnn[0](x[ids]))  # (8, 8, 4, 4)
    assert torch.equal(controller._store.get(ids), recomputed)
    assert controller._prefetcher.misses > 0  # the first pass over the data filled the cache
    controller.close()


def test_controller_cached_forward_equals_full_forward(cnn, data, tmp_path):
    x, _ = data
    controller = FreezingController(cnn, eval_interval=1000, cache_dir=tmp_path)
    controller.freeze(3)
    ids = torch.arange(8)
    first = controller.forward(x[ids], ids)  # fills the cache
    cached = controller.forward(x[ids], ids)  # starts from the cached activations of modules 0-2
    assert torch.equal(first, cached)
    assert torch.equal(cnn(x[ids]), cached)
    controller.close()


def test_controller_prefetches_announced_batches(cnn, data, tmp_path):
    x, y = data
    controller = FreezingController(cnn, eval_interval=1000, cache_dir=tmp_path)
    controller.freeze(1)
    batches = [torch.arange(i, i + 8) for i in range(0, 32, 8)]
    for _ in range(2):  # epoch 1 fills the cache, epoch 2 reads it ahead
        controller.set_upcoming(batches)
        for ids in batches:
            controller.forward(x[ids], ids)
    assert controller._prefetcher.hits == 4
    controller.close()


def test_controller_reference_never_blocks_a_training_step(cnn, data):
    x, y = data
    release = threading.Event()

    def block_on_reference_thread(_module, _inputs):
        # hooks are copied into the reference snapshot; only the reference (background thread) waits
        if threading.current_thread() is not threading.main_thread():
            release.wait(timeout=30)

    cnn[0].register_forward_pre_hook(block_on_reference_thread)
    controller = FreezingController(cnn, eval_interval=2, reference_mode="float")
    controller.freeze(0)
    _train(controller, cnn, x, y, steps=2)  # builds the reference
    assert controller._runner.wait_idle(timeout=10)
    _train(controller, cnn, x, y, steps=12)  # every eval during these steps meets a reference stuck in its forward
    assert controller.readings == [] and controller._runner.dropped >= 4
    release.set()
    assert controller._runner.wait_idle(timeout=10)
    _train(controller, cnn, x, y, steps=1)
    assert len(controller.readings) == 1
    submitted_at, module, value = controller.readings[0]
    assert submitted_at < controller.step - 10 and module == 0 and value >= 0  # the reading lags the training
    controller.close()


def test_controller_freezes_modules_in_a_real_training_run(data):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 3))
    x, y = data
    controller = FreezingController(model, eval_interval=2, policy=FreezingPolicyConfig(window=2), reference_refresh=5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(300):
        ids = torch.arange(step * 8, step * 8 + 8) % 32
        loss = F.cross_entropy(controller.forward(x[ids], ids), y[ids])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        controller.after_step(loss, 0.05)
        controller._runner is not None and controller._runner.wait_idle(timeout=10)  # deterministic lag for the test
        if controller.frozen:
            break
    kinds = [kind for _, kind, _ in controller.events]
    assert kinds[:2] == ["bootstrap_end", "freeze"] and controller.frozen == 1
    assert not any(p.requires_grad for p in model[1].parameters())
    controller.close()


def _train_with_reading_lag(data, lag: int, reference_delay: float = 0.0) -> FreezingController:
    """80 steps of a seeded MLP with readings every 2 steps used `lag` steps later; the reference's forward passes
    sleep `reference_delay` seconds each on its background thread (a slow or starved reference)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 3))

    def slow_reference(_module, _inputs):
        # hooks are copied into the reference snapshot; only the background thread sleeps
        if threading.current_thread() is not threading.main_thread():
            time.sleep(reference_delay)

    model[0].register_forward_pre_hook(slow_reference)
    x, y = data
    controller = FreezingController(
        model, eval_interval=2, policy=FreezingPolicyConfig(window=2), reference_refresh=5, reading_lag=lag
    )
    _train(controller, model, x, y, steps=80, lr=0.05)
    controller.close()
    return controller


def test_controller_reading_lag_freezes_at_the_same_steps_beside_a_cpu_hog(data, cpu_hog):
    quiet = _train_with_reading_lag(data, lag=2)
    with cpu_hog():  # every core busy with another process, and the reference 5 ms slower per batch
        loaded = _train_with_reading_lag(data, lag=2, reference_delay=0.005)
    freezes = [(step, module) for step, kind, module in quiet.events if kind == "freeze"]
    assert len(freezes) >= 2 and len(quiet.readings) >= 20
    assert loaded.events == quiet.events and loaded.readings == quiet.readings
    assert loaded.reference_stats()["dropped"] == quiet.reference_stats()["dropped"] == 0
    # each freeze happens exactly `lag` steps after the batch of the reading that triggered it
    submitted = {step: module for step, module, _ in quiet.readings}
    assert all(submitted.get(step - 2) == module for step, module in freezes)


def test_controller_reading_lag_state_carries_a_reading_not_yet_due(cnn, data):
    x, y = data
    controller = FreezingController(cnn, eval_interval=2, reference_mode="float", reading_lag=5)
    controller.freeze(0)  # leaves bootstrapping: the reference is built at step 2, the first batch read at step 3
    _train(controller, cnn, x, y, steps=4)
    state = controller.state_dict()  # waits for the reading of step 3, due at step 8
    assert controller.readings == [] and [s for s, _, _ in state["pending_readings"]] == [3]
    controller.close()

    other = FreezingController(copy.deepcopy(cnn), eval_interval=2, reference_mode="float", reading_lag=5)
    other.load_state_dict(state)
    assert other.state_dict() == state
    _train(other, other.model, x, y, steps=3)
    assert other.step == 7 and other.readings == []
    _train(other, other.model, x, y, steps=1)
    assert [(s, m) for s, m, _ in other.readings] == [(3, 0)]
    assert other.readings[0][2] == state["pending_readings"][0][2]
    other.close()


def test_controller_unfreezes_when_lr_drops_tenfold(cnn, data):
    x, y = data
    controller = FreezingController(cnn, eval_interval=4, reference_mode="float")
    controller.freeze(2, lr=0.1)
    _train(controller, cnn, x, y, steps=4, lr=0.05)
    assert controller.frozen == 2
    _train(controller, cnn, x, y, steps=4, lr=0.01)
    assert controller.events[-1] == (8, "unfreeze", 0)
    assert all(p.requires_grad for p in cnn.parameters()) and controller.policy.window == 5
    controller.close()


def test_controller_state_dict_round_trip(cnn, data, tmp_path):
    x, y = data
    controller = FreezingController(cnn, eval_interval=3, cache_dir=tmp_path / "a")
    _train(controller, cnn, x, y, steps=7)
    controller.freeze(2, lr=0.1)
    _train(controller, cnn, x, y, steps=5)
    state = controller.state_dict()
    assert json.loads(json.dumps(state)) == state  # plain numbers / strings / lists only

    clone = copy.deepcopy(cnn)
    for p in clone.parameters():
        p.requires_grad_(True)
    other = FreezingController(clone, eval_interval=3, cache_dir=tmp_path / "a")
    other.load_state_dict(state)
    assert other.state_dict() == state
    assert other.frozen == 2 and not any(p.requires_grad for p in clone[0].parameters())
    assert len(other._store) == 32  # the cache flushed on this worker is reused by the next visit
    controller.close()
    other.close()


def test_frozen_parameter_names_from_state(cnn):
    controller = FreezingController(cnn, split_children(cnn))
    controller.freeze(1)
    state = controller.state_dict()
    assert frozen_parameter_names(cnn, state) == ["0.0.weight", "0.0.bias", "0.1.weight", "0.1.bias"]
    with_buffers = frozen_parameter_names(cnn, state, include_buffers=True)
    assert set(with_buffers) == {k for k in cnn.state_dict() if k.startswith("0.")}
    controller.close()


def test_controller_load_rejects_state_of_other_modules(cnn):
    state = FreezingController(cnn).state_dict()
    other = FreezingController(cnn, [LayerModule("all", ("0", "1", "2", "3"))])
    with pytest.raises(ValueError, match=r"`state\['modules'\]` is .*, but must equal this controller's"):
        other.load_state_dict(state)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"eval_interval": 0}, ValueError, "`eval_interval` is 0, but must be >= 1"),
        ({"reference_refresh": -1}, ValueError, "`reference_refresh` is -1, but must be >= 1"),
        ({"reference_threads": 1.5}, TypeError, "`reference_threads` is 1.5, but must be an int"),
        ({"prefetch_depth": 0}, ValueError, "`prefetch_depth` is 0, but must be >= 1"),
        ({"reading_lag": 0}, ValueError, r"`reading_lag` is 0, but must be >= 1 \(or None\)"),
        ({"reading_lag": 2.0}, TypeError, "`reading_lag` is 2.0, but must be an int or None"),
        (
            {"reference_mode": "int4"},
            ValueError,
            r"`reference_mode` is 'int4', but must be one of \('static', 'dynamic', 'float'\)",
        ),
        ({"policy": {"window": 3}}, TypeError, "`policy` is dict, but must be a FreezingPolicyConfig or None"),
        ({"modules": []}, ValueError, "`modules` is empty, but must hold at least one LayerModule"),
        (
            {"modules": [LayerModule("x", ("9",))]},
            ValueError,
            "`modules` names member '9' of 'x', but it must be a module",
        ),
    ],
)
def test_controller_validation_names_parameter_value_and_rule(cnn, kwargs, error, message):
    with pytest.raises(error, match=message):
        FreezingController(cnn, **kwargs)


def test_controller_rejects_cache_for_nested_members(cnn, tmp_path):
    modules = [LayerModule("a", ("2",)), LayerModule("b", ("2.0",))]
    with pytest.raises(CutError, match=r"member '2.0' of Sequential lies inside member '2', but members must not nest"):
        FreezingController(cnn, modules, cache_dir=tmp_path)


def test_controller_caches_across_a_gap_in_the_members(cnn, data, tmp_path):
    # module "1" is no member: it runs as usual on the cached output of "0"
    x, y = data
    modules = [LayerModule("a", ("0",)), LayerModule("c", ("2",)), LayerModule("d", ("3",))]
    controller = FreezingController(cnn, modules, eval_interval=1000, cache_dir=tmp_path)
    controller.freeze(1)
    _train(controller, cnn, x, y, steps=8)
    assert controller._prefetcher.hits + controller._prefetcher.misses == 8 and len(controller._store) == 32
    controller.close()


class _SkipAcross(nn.Module):
    """A residual connection around `a`: a cut after `b` must not be allowed (rule 3), a cut after `a` is fine."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return self.c(self.b(h) + h)


def test_controller_names_the_model_and_rule_when_a_cut_reads_across_the_boundary(tmp_path):
    torch.manual_seed(0)
    model = _SkipAcross()
    controller = FreezingController(model, split_children(model), cache_dir=tmp_path)
    controller.freeze(2)
    with pytest.raises(CutError, match=r"_SkipAcross run from the cached output of member 'b' differs .*rule 3"):
        controller.forward(torch.randn(4, 4), torch.arange(4))
    controller.close()


def test_controller_reads_bert_plasticity_against_an_int8_reference(tmp_path):
    from framework.architectures import BertClassifier, small_bert

    model = BertClassifier(small_bert(hidden_size=32, num_layers=2, num_heads=2, vocab_size=100, max_len=16), 3)
    modules = split_regex(model, r"bert\.embeddings|bert\.encoder\.layer\.\d+|head")
    controller = FreezingController(model, modules, eval_interval=1, cache_dir=tmp_path)
    controller.freeze(1)  # embeddings frozen and cached; layer 0 is monitored
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01)
    g = torch.Generator().manual_seed(0)
    ids, y = torch.randint(1, 100, (8, 16), generator=g), torch.randint(0, 3, (8,), generator=g)
    for _ in range(4):
        loss = F.cross_entropy(controller.forward(ids, torch.arange(8)), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        controller.after_step(loss, 0.01)
        assert controller.wait_reference(timeout=10)
    stats = controller.reference_stats()
    assert controller.readings and {m for _, m, _ in controller.readings} == {1}
    assert ("bert.encoder.layer.0.attention.self.query", "dynamic") in stats["info"].int8_modules
    assert "bert.embeddings.word_embeddings" in stats["info"].float_modules and len(controller._store) == 8
    controller.close()
