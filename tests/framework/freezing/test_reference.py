from __future__ import annotations

import pytest
import torch
from torch import nn

from framework.architectures import resnet18
from framework.freezing import AsyncReferenceRunner, capture_activation, make_reference, sp_loss, time_forward


def test_make_reference_dynamic_quantizes_linear_layers_and_keeps_convolutions_float(cnn):
    reference, info = make_reference(cnn, "dynamic")
    assert info.quantized and info.int8_modules == (("3.2", "dynamic"),)
    assert "quantized" in type(reference[3][2]).__module__  # the Linear head is int8
    assert set(info.float_modules) == {"0.0", "0.1", "1.0", "1.1", "2.0.0", "2.0.1", "2.1.0", "2.1.1"}
    assert not reference.training and cnn.training  # a snapshot: the training model is untouched


def test_make_reference_static_makes_every_convolution_int8(cnn, data):
    x, _ = data
    reference, info = make_reference(cnn, "static", calibration=x)
    convs = ("0.0", "1.0", "2.0.0", "2.1.0")
    assert info.int8_modules == (*((c, "static") for c in convs), ("3.2", "dynamic"))
    assert info.fallbacks == ()  # each batch norm is fused into the convolution before it
    assert sum("quantized" in type(m).__module__ and "Conv" in type(m).__name__ for m in reference.modules()) == 4
    cnn.eval()
    for member in ("1", "2.1"):  # module names are kept, so plasticity hooks find the members
        assert sp_loss(capture_activation(cnn, member, x), capture_activation(reference, member, x)).item() < 1e-3


def test_make_reference_static_does_not_fuse_a_batch_norm_applied_elsewhere():
    class BnFirst(nn.Module):  # registered conv then bn, but the bn normalises the input, not the conv's output
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn = nn.Conv2d(2, 2, 3, padding=1), nn.BatchNorm2d(2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(self.bn(x))

    torch.manual_seed(0)
    model = BnFirst()
    model.bn.running_mean.fill_(0.5)
    x = torch.randn(4, 2, 6, 6)
    reference, info = make_reference(model, "static", calibration=x)
    assert info.int8_modules == (("conv", "static"),)
    assert ("bn", "batch norm not registered right after a convolution: not fused, float32") in info.fallbacks
    assert any("fusion by registration order changed the output" in r for n, r in info.fallbacks if n == "*")
    model.eval()
    assert sp_loss(model(x), reference(x)).item() < 1e-3


def test_make_reference_static_without_calibration_keeps_convolutions_float(cnn):
    _, info = make_reference(cnn, "static")
    assert info.fallbacks[0] == ("*", "static: no calibration batch, so convolutions stay float32")
    assert info.int8_modules == (("3.2", "dynamic"),) and "0.0" in info.float_modules


def test_make_reference_static_quantizes_every_resnet18_convolution():
    torch.manual_seed(0)
    model = resnet18(10, prefer_torchvision=False).eval()
    x = torch.randn(8, 3, 32, 32)
    reference, info = make_reference(model, "static", calibration=x)
    assert len([n for n, kind in info.int8_modules if kind == "static"]) == 20  # every convolution of ResNet-18
    assert time_forward(reference, x, repeats=3) > 0  # the ratio is measured by experiments/layer_freezing.py


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
    runner = AsyncReferenceRunner(build=lambda snap, _calibration: make_reference(snap, "float"))
    assert not runner.submit(0, 0, "0", x, x)  # no reference yet: dropped
    assert runner.refresh(cnn)
    assert runner.wait_idle(timeout=10) and runner.ready
    train_activation = capture_activation(cnn.eval(), "0", x)
    assert runner.submit(3, 0, "0", x, train_activation)
    assert runner.wait_idle(timeout=10)
    (reading,) = runner.poll()
    assert (reading.step, reading.module) == (3, 0) and reading.value == pytest.approx(0.0, abs=1e-6)
    assert runner.dropped == 1 and runner.builds == 1 and runner.info.mode == "float" and runner.cpu_seconds > 0
    runner.close()


def test_make_reference_rejects_unknown_mode(cnn):
    with pytest.raises(ValueError, match=r"`mode` is 'int4', but must be one of \('static', 'dynamic', 'float'\)"):
        make_reference(cnn, "int4")


def test_reference_runner_rejects_zero_threads():
    with pytest.raises(ValueError, match="`num_threads` is 0, but must be an int >= 1"):
        AsyncReferenceRunner(num_threads=0)
