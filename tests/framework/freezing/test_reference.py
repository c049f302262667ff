from __future__ import annotations

import pytest
import torch
from torch import nn

from framework.freezing import AsyncReferenceRunner, capture_activation, make_reference, sp_loss


def test_make_reference_quantizes_linear_layers_and_keeps_convolutions_float(cnn):
    reference, info = make_reference(cnn, "dynamic")
    assert info.quantized
    assert "quantized" in type(reference[3][2]).__module__  # the Linear head is int8
    assert set(info.float_modules) == {"0.0", "0.1", "1.0", "1.1", "2.0.0", "2.0.1", "2.1.0", "2.1.1"}
    assert not reference.training and cnn.training  # a snapshot: the training model is untouched


def test_make_reference_float_mode_is_an_exact_snapshot(cnn, data):
    x, _ = data
    cnn.eval()
    reference, info = make_reference(cnn, "float")
    assert not info.quantized
    assert torch.equal(reference(x), cnn(x))


def test_make_reference_int8_activations_stay_close_to_float():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    reference, _ = make_reference(mlp, "dynamic")
    x = torch.randn(16, 32)
    a_float = capture_activation(mlp, "3", x)
    a_int8 = capture_activation(reference, "3", x)
    assert sp_loss(a_float, a_int8).item() < 1e-3


def test_capture_activation_skips_the_rest_of_the_forward_pass(cnn, data):
    x, _ = data
    ran = []
    cnn[3].register_forward_pre_hook(lambda *_: ran.append(True))
    activation = capture_activation(cnn, "1", x)
    assert activation.shape == (32, 8, 4, 4) and ran == []


def test_reference_runner_drops_requests_while_busy_and_reports_readings(cnn, data):
    x, _ = data
    runner = AsyncReferenceRunner(build=lambda snap: make_reference(snap, "float")[0])
    assert not runner.submit(0, 0, "0", x, x)  # no reference yet: dropped
    assert runner.refresh(cnn)
    assert runner.wait_idle(timeout=10) and runner.ready
    train_activation = capture_activation(cnn.eval(), "0", x)
    assert runner.submit(3, 0, "0", x, train_activation)
    assert runner.wait_idle(timeout=10)
    (reading,) = runner.poll()
    assert (reading.step, reading.module) == (3, 0) and reading.value == pytest.approx(0.0, abs=1e-6)
    assert runner.dropped == 1
    runner.close()


def test_make_reference_rejects_unknown_mode(cnn):
    with pytest.raises(ValueError, match=r"`mode` is 'int4', but must be one of \('dynamic', 'float'\)"):
        make_reference(cnn, "int4")


def test_reference_runner_rejects_zero_threads():
    with pytest.raises(ValueError, match="`num_threads` is 0, but must be an int >= 1"):
        AsyncReferenceRunner(num_threads=0)
