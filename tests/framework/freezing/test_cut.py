"""Caching a frozen prefix of a ResNet-18 and of a small BERT: the trainable suffix sees the same loss and gradients."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from framework.architectures import BertClassifier, resnet18, small_bert
from framework.freezing import CutError, FreezingController, LayerModule, PrefixCut, split_children, split_regex

BERT_MODULES = r"bert\.embeddings|bert\.encoder\.layer\.\d+|head"


def _frozen_copy(model: nn.Module, controller: FreezingController) -> nn.Module:
    """The full model with the same prefix frozen (no grad, eval mode), run without any cache."""
    other = copy.deepcopy(model)
    for lm in controller.modules[: controller.frozen]:
        for m in lm.members:
            sub = other.get_submodule(m)
            sub.eval()
            for p in sub.parameters():
                p.requires_grad_(False)
    return other


def _loss_and_grads(forward, model: nn.Module, inputs: torch.Tensor, y: torch.Tensor, seed: int = 0):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # the same dropout masks in the suffix of every pass
    loss = F.cross_entropy(forward(inputs), y)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_cached_equals_full(model, modules, frozen, inputs, y, tmp_path):
    controller = FreezingController(model, modules, eval_interval=1000, cache_dir=tmp_path)
    controller.freeze(frozen)
    full_model = _frozen_copy(model, controller)
    ids = torch.arange(inputs.shape[0])
    loss_full, grads_full = _loss_and_grads(full_model, full_model, inputs, y)
    loss_miss, grads_miss = _loss_and_grads(lambda x: controller.forward(x, ids), model, inputs, y)  # computes
    assert len(controller._store) == inputs.shape[0]
    loss_hit, grads_hit = _loss_and_grads(lambda x: controller.forward(x, ids), model, inputs, y)  # from the cache
    assert controller._prefetcher.misses + controller._prefetcher.hits == 2
    frozen_names = set(controller.frozen_parameter_names())
    assert frozen_names and set(grads_hit) == set(grads_full) and not frozen_names & set(grads_hit)
    for loss in (loss_miss, loss_hit):
        torch.testing.assert_close(loss, loss_full, rtol=1e-5, atol=1e-6)
    for grads in (grads_miss, grads_hit):
        for name, g in grads_full.items():
            torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6, msg=name)
    controller.close()


@pytest.mark.parametrize("frozen", [1, 4, 5])  # conv1 | conv1..layer1 | conv1..layer2
def test_resnet18_cached_prefix_gives_the_full_models_loss_and_gradients(tmp_path, frozen):
    torch.manual_seed(0)
    model = resnet18(10, prefer_torchvision=False)
    modules = split_children(model)  # conv1 | bn1+relu+maxpool | layer1 | layer2 | layer3 | layer4+avgpool | fc
    assert [lm.name for lm in modules][:3] == ["conv1", "bn1+relu+maxpool", "layer1"]
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 3, 32, 32, generator=g), torch.randint(0, 10, (6,), generator=g)
    _assert_cached_equals_full(model, modules, frozen, x, y, tmp_path)


def test_resnet18_cached_prefix_at_a_residual_block_boundary(tmp_path):
    torch.manual_seed(0)
    model = resnet18(10, prefer_torchvision=False)
    modules = split_regex(model, r"conv1|bn1|layer\d\.\d|fc")  # blocks are members: cut after layer2.0
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 10, (4,), generator=g)
    _assert_cached_equals_full(model, modules, [lm.name for lm in modules].index("layer2.0") + 1, x, y, tmp_path)


def test_small_bert_cached_prefix_gives_the_full_models_loss_and_gradients(tmp_path):
    model = BertClassifier(small_bert(hidden_size=32, num_layers=3, num_heads=2, vocab_size=100, max_len=16), 3)
    modules = split_regex(model, BERT_MODULES)
    assert [lm.name for lm in modules] == [
        "bert.embeddings",
        "bert.encoder.layer.0",
        "bert.encoder.layer.1",
        "bert.encoder.layer.2",
        "head",
    ]
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 100, (6, 16), generator=g)
    ids[:, 12:] = 0  # padding: the attention mask comes from the token ids, outside the prefix
    y = torch.randint(0, 3, (6,), generator=g)
    _assert_cached_equals_full(model, modules, 2, ids, y, tmp_path)  # embeddings + layer 0 frozen


def test_cut_inside_a_residual_block_is_refused_naming_model_member_and_rule():
    torch.manual_seed(0)
    model = resnet18(10, prefer_torchvision=False).eval()
    members = ["conv1", "bn1", "layer1.0.conv1", "layer1.0.bn1", "layer1.0.conv2", "layer1.1", "fc"]
    cut = PrefixCut(model, members)
    with pytest.raises(CutError, match=r"ResNet run from the cached output of member 'layer1.0.conv1' .*rule 3"):
        cut.verify(torch.randn(2, 3, 32, 32), 3)


def test_cut_refuses_members_out_of_forward_order():
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    cut = PrefixCut(model, ["2", "0"])
    with pytest.raises(CutError, match=r"Sequential's forward ran the members in the order \['0', '2'\].*rule 1"):
        cut.verify(torch.randn(2, 3), 1)


def test_cut_refuses_a_member_returning_a_dict():
    class Dicty(nn.Module):
        def forward(self, x):
            return {"h": x}

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = Dicty(), nn.Linear(3, 2)

        def forward(self, x):
            return self.b(self.a(x)["h"])

    with pytest.raises(CutError, match=r"member 'a' of Model returned dict, but a member must return a tensor"):
        PrefixCut(Model(), ["a", "b"]).verify(torch.randn(2, 3), 1)


def test_cut_rejects_unknown_members():
    with pytest.raises(CutError, match=r"member 'x' is not a sub-module of Sequential"):
        PrefixCut(nn.Sequential(nn.Linear(2, 2)), ["x"])
    with pytest.raises(CutError, match="listed twice"):
        FreezingController(
            nn.Sequential(nn.Linear(2, 2)), [LayerModule("a", ("0",)), LayerModule("b", ("0",))], cache_dir="/tmp/x"
        )


def test_cut_refuses_a_model_whose_forward_needs_the_skipped_values():
    class Inverts(nn.Module):  # code between members inverts the stem's output: a zero placeholder cannot be inverted
        def __init__(self):
            super().__init__()
            self.stem, self.mid, self.head = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2)

        def forward(self, x):
            h = torch.linalg.inv(self.stem(x).view(-1, 2, 2)).reshape(-1, 4)
            return self.head(self.mid(h))

    torch.manual_seed(0)
    cut = PrefixCut(Inverts(), ["stem", "mid", "head"])
    cut.verify(torch.randn(2, 4), 1)  # a cut right after "stem" is fine: the inverse runs on its cached output
    with pytest.raises(CutError, match=r"Inverts run from the cached output of member 'mid' failed \(.*rule 3"):
        cut.verify(torch.randn(2, 4), 2)
