"""The planner on real architectures (issue 25): a ResNet-18 with in-place ReLUs and a HuggingFace BERT.

Each end-to-end test profiles a few variants that share a frozen prefix, plans them, stores features, and checks
that every variant's prediction from the stored features equals the original model's output in eval mode.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.fx as fx
from torch import nn

from framework.architectures import BertClassifier, resnet18, small_bert
from framework.planner import (
    CostModel,
    FeatureStore,
    KeyedModule,
    build_branch,
    build_extractor,
    build_multimodel,
    plan_transfer,
    profile_model,
)
from framework.planner.execution import boundary_keys

CM = CostModel(1e9, 1e9)


def _trainable_only(model: nn.Module, prefixes: tuple[str, ...]) -> nn.Module:
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith(prefixes))
    return model


def _with_head(model: nn.Module, attr: str, head: nn.Module, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    for m in head.modules():
        if isinstance(m, nn.Linear):
            m.reset_parameters()
    setattr(model, attr, head)
    return model


def _fresh_values(gm: fx.GraphModule, *xs: torch.Tensor) -> dict[str, object]:
    """Each node's value right after it ran (copied, so a later in-place op cannot change it), in eval mode."""

    class Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> object:
            out = super().run_node(n)
            values[n.name] = out.clone() if isinstance(out, torch.Tensor) else out
            return out

    values: dict[str, object] = {}
    gm.eval()
    with torch.no_grad():
        Recorder(gm).run(*xs)
    return values


def _predict_all(models: list[nn.Module], x: torch.Tensor, method: str, mm, tmp_path) -> list[torch.Tensor]:
    """Plan with ``method``, materialize, and predict every model from the stored features (in eval mode)."""
    n = len(models)
    plan = plan_transfer(
        models, x[:1], method=method, batch_sizes=[len(x)] * n, epochs=[1] * n, records=len(x), cost_model=CM, mm=mm
    )
    store, ids = FeatureStore(tmp_path / method), list(range(len(x)))
    plan.materialize(store, ids, x)
    preds: list[torch.Tensor | None] = [None] * n
    for g, group in enumerate(plan.groups):
        seeds = [0] * len(group.members)
        trainer = plan.trainer(g, lambda ps, i: torch.optim.SGD(ps, lr=0.1), nn.functional.cross_entropy, seeds)
        for i, out in zip(group.members, trainer.predict(plan.load(store, g, ids, x)), strict=True):
            preds[i] = out
    return preds


def _eval_outputs(models: list[nn.Module], x: torch.Tensor) -> list[torch.Tensor]:
    outs = []
    for m in models:
        m.eval()
        with torch.no_grad():
            outs.append(m(x))
    return outs


# ResNet-18: variants with 1000 and 10 classes that freeze up to layer3 or layer4 ------------------------------------


@pytest.fixture(scope="module")
def resnets() -> tuple[list[nn.Module], object, torch.Tensor]:
    torch.manual_seed(0)
    base = resnet18(1000)
    models = [
        _trainable_only(copy.deepcopy(base), ("layer4", "fc")),
        _trainable_only(_with_head(copy.deepcopy(base), "fc", nn.Linear(512, 10), seed=1), ("fc",)),
    ]
    x = torch.randn(3, 3, 32, 32)
    mm = build_multimodel([profile_model(m, x[:1]) for m in models])
    return models, mm, x


@pytest.mark.parametrize("method", ["planner", "mat_all"])
def test_resnet18_plan_predicts_the_eval_model_outputs(resnets, method, tmp_path) -> None:
    models, mm, x = resnets
    assert any(mm.layers[k].name == "layer3_1_relu_1" for k in mm.shared)  # the frozen prefix is merged
    for pred, ref in zip(_predict_all(models, x, method, mm, tmp_path), _eval_outputs(models, x), strict=True):
        torch.testing.assert_close(pred, ref)


def test_resnet18_mat_all_stores_every_layer_as_its_node_computed_it(resnets, tmp_path) -> None:
    # in-place ReLUs overwrite the batch-norm output (and the residual sum) they read: the stored value of those
    # layers must still be the value before the ReLU
    models, mm, x = resnets
    plan = plan_transfer(
        models, x[:1], method="mat_all", batch_sizes=[3, 3], epochs=[1, 1], records=3, cost_model=CM, mm=mm
    )
    store = FeatureStore(tmp_path)
    plan.materialize(store, [0, 1, 2], x)
    fresh = [_fresh_values(g.gm, x) for g in mm.models]
    assert len(plan.materialized) > 50
    for k in plan.materialized:
        i, name = mm.owners[k][0]
        torch.testing.assert_close(torch.from_numpy(store.read(k, [0, 1, 2])), fresh[i][name], rtol=0, atol=0)


def test_profile_records_resnet18_in_place_relus(resnets) -> None:
    _, mm, _ = resnets
    g = mm.models[0]
    assert (g.nodes["relu"].mutates, g.nodes["relu"].inplace_of) == (("bn1",), "bn1")
    assert g.nodes["layer1_0_relu_1"].mutates == ("add",) and g.nodes["bn1"].mutates == ()
    assert sum(bool(n.mutates) for n in g.nodes.values()) == 17  # the stem's ReLU and two per basic block


def test_profile_resnet18_flops_and_sizes_match_the_published_counts(resnets) -> None:
    # FLOPs are 2 x MACs; ResNet-18 at 224 x 224 is 1.82 GMACs, so 3.64 GFLOPs. At 32 x 32 every feature map is
    # 7 x 7 times smaller (112/16, 56/8, ..., 7/1), so the spatial layers' FLOPs scale by exactly 49
    _, mm, _ = resnets
    g = mm.models[0]
    flat = ("avgpool", "flatten", "fc")  # the same at any input size
    at_224 = 49 * sum(n.flops for k, n in g.nodes.items() if k not in flat) + sum(g.nodes[k].flops for k in flat)
    assert at_224 == pytest.approx(2 * 1.82e9, rel=0.1)
    assert g.nodes["fc"].flops == 2 * 512 * 1000
    assert sum(n.param_bytes for n in g.nodes.values()) == 4 * 11_689_512  # torchvision's parameter count
    assert g.nodes["x"].out_bytes == 3 * 32 * 32 * 4 and g.nodes["layer1_1_relu_1"].out_bytes == 64 * 8 * 8 * 4
    assert g.nodes["layer3_1_relu_1"].materializable and not g.nodes["layer4_0_conv1"].materializable


# BERT: three classifiers over copies of one BERT, freezing one or two encoder blocks, with different heads ---------


def _token_ids(n: int, seq: int = 16) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 1000, (n, seq), generator=g)
    ids[0, 10:] = 0  # padding: the attention mask is not all ones
    ids[2, 5:] = 0
    return ids


@pytest.fixture(scope="module")
def berts() -> tuple[list[nn.Module], object, torch.Tensor]:
    bert = small_bert(hidden_size=32, num_layers=2, num_heads=2)
    one_block, all_blocks = ("bert.embeddings", "bert.encoder.layer.0"), ("bert.embeddings", "bert.encoder.layer.")
    frozen = [one_block, all_blocks, all_blocks]  # the last two differ in their heads only
    models = []
    for i, prefixes in enumerate(frozen):
        torch.manual_seed(i)
        m = BertClassifier(copy.deepcopy(bert), num_classes=3)
        for name, p in m.named_parameters():
            p.requires_grad_(not name.startswith(prefixes))
        models.append(m)
    x = _token_ids(4)
    mm = build_multimodel([profile_model(m, x[:1]) for m in models])
    return models, mm, x


def test_profile_bert_traces_hf_blocks_as_leaves(berts) -> None:
    _, mm, _ = berts
    g = mm.models[1]
    assert [n.name for n in g.nodes.values() if n.op == "call_module"][:3] == [
        "bert_embeddings",
        "bert_encoder_layer_0",
        "bert_encoder_layer_1",
    ]
    assert g.nodes["bert_encoder_layer_1"].materializable and g.nodes["bert_encoder_layer_1"].storable
    assert g.nodes["bert_encoder_layer_0"].flops > 2 * 16 * 4 * 32 * 32  # at least the Q, K, V, O projections
    mask = next(n for n in g.nodes.values() if n.parents and "long" in n.parents)
    assert mask.materializable and not mask.storable  # the mask builder may return None: always recomputed
    shared = {mm.layers[k].name for k in mm.shared}
    assert {"bert_embeddings", "bert_encoder_layer_0", "bert_encoder_layer_1"} <= shared


@pytest.mark.parametrize("method", ["planner", "mat_all"])
def test_bert_plan_predicts_the_eval_model_outputs(berts, method, tmp_path) -> None:
    models, mm, x = berts
    for pred, ref in zip(_predict_all(models, x, method, mm, tmp_path), _eval_outputs(models, x), strict=True):
        torch.testing.assert_close(pred, ref)


def test_bert_extractor_and_branch_pickle(berts) -> None:
    # the engine ships extractors and branches to workers: the mask builder's config must survive the round trip
    models, mm, x = berts
    extractor = build_extractor(mm, boundary_keys(mm, 0))
    branch = build_branch(mm, 0)
    extractor2, branch2 = pickle.loads(pickle.dumps((extractor, branch)))
    for module in (extractor, branch, extractor2, branch2):
        module.eval()
    with torch.no_grad():
        ref = branch(*extractor(x))[0]
        got = branch2(*extractor2(x))[0]
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(ref, _eval_outputs(models[:1], x)[0])


def test_profile_bert_model_with_dict_input_and_model_output() -> None:
    bert = small_bert(hidden_size=32, num_layers=2, num_heads=2)
    for name, p in bert.named_parameters():
        p.requires_grad_(not name.startswith(("embeddings", "encoder.layer.0")))
    ids = _token_ids(3)
    mask = (ids != 0).long()
    g = profile_model(bert, {"input_ids": ids[:1], "attention_mask": mask[:1]})
    assert [g.nodes[n].op for n in g.inputs] == ["placeholder", "placeholder"] and len(g.inputs) == 2
    mm = build_multimodel([g])
    extractor = KeyedModule(mm, [mm.keys[0][n] for n in g.inputs], boundary_keys(mm, 0))
    branch = build_branch(mm, 0)
    branch.eval()
    bert.eval()
    with torch.no_grad():
        (out,) = branch(*extractor(ids, mask))
        ref = bert(input_ids=ids, attention_mask=mask)
    assert type(out) is type(ref)
    torch.testing.assert_close(out.last_hidden_state, ref.last_hidden_state)
    torch.testing.assert_close(out.pooler_output, ref.pooler_output)


# in-place ops that are not idempotent, through a view, on a shared boundary ----------------------------------------


class ScaledConv(nn.Module):
    """A frozen convolution, then (``mode``) nothing, ``h = h.mul_(2)`` or the statement ``h.add_(1)``."""

    def __init__(self, conv: nn.Conv2d, mode: str, seed: int) -> None:
        super().__init__()
        self.conv, self.mode = conv, mode
        torch.manual_seed(seed)
        self.fc = nn.Linear(4 * 6 * 6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)  # (B, 4, 6, 6)
        if self.mode == "mul":
            h = h.mul_(2)
        elif self.mode == "add":
            h.add_(1)  # the result is not used: `h` itself changed
        return self.fc(h.flatten(1))


def _scaled_convs() -> list[nn.Module]:
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3).requires_grad_(False)
    return [ScaledConv(conv, mode, seed) for seed, mode in enumerate(["plain", "mul", "add"])]


def test_profile_keys_a_layer_changed_in_place_by_its_value_before_the_change() -> None:
    models = _scaled_convs()
    x = torch.randn(2, 3, 8, 8)
    graphs = [profile_model(m, x[:1]) for m in models]
    assert graphs[1].nodes["mul_"].mutates == ("conv",) and graphs[1].nodes["mul_"].inplace_of == "conv"
    assert graphs[2].nodes["flatten"].parents == ("add_",)  # the reader of `h` after `h.add_(1)` reads the change
    mm = build_multimodel(graphs)
    assert sorted(mm.layers[k].name for k in mm.shared) == ["conv", "x"]  # the three `flatten`s differ


@pytest.mark.parametrize("method", ["mat_all", "planner", "current_practice"])
def test_non_idempotent_in_place_ops_keep_stored_features_and_predictions_exact(method, tmp_path) -> None:
    models = _scaled_convs()
    x = torch.randn(4, 3, 8, 8)
    mm = build_multimodel([profile_model(m, x[:1]) for m in models])
    for pred, ref in zip(_predict_all(models, x, method, mm, tmp_path), _eval_outputs(models, x), strict=True):
        torch.testing.assert_close(pred, ref)
    conv = next(k for k in mm.layers if mm.layers[k].name == "conv")
    (stored,) = build_extractor(mm, [conv, *(mm.keys[i]["mul_" if i == 1 else "add_"] for i in (1, 2))])(x)[:1]
    torch.testing.assert_close(stored, models[0].conv(x))


class ViewInPlace(nn.Module):
    """Changes the frozen convolution's output through a view: ``h[:, :2].mul_(2)``, then reads ``h``."""

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        self.conv, self.fc = conv, nn.Linear(4 * 6 * 6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)  # (B, 4, 6, 6)
        h[:, :2].mul_(2)
        return self.fc(h.flatten(1))


def test_a_change_through_a_view_keeps_the_base_private_and_exact(tmp_path) -> None:
    plain = _scaled_convs()[0]
    models = [plain, ViewInPlace(plain.conv)]
    x = torch.randn(4, 3, 8, 8)
    graphs = [profile_model(m, x[:1]) for m in models]
    g = graphs[1]
    assert g.nodes["mul_"].mutates_views == ("conv",) and not g.nodes["conv"].materializable
    assert "mul_" in g.nodes["flatten"].parents  # read after the change: it depends on it
    mm = build_multimodel(graphs)
    assert sorted(mm.layers[k].name for k in mm.shared) == ["x"]
    for pred, ref in zip(_predict_all(models, x, "mat_all", mm, tmp_path), _eval_outputs(models, x), strict=True):
        torch.testing.assert_close(pred, ref)


def test_keyed_module_leaves_its_inputs_unchanged() -> None:
    # a branch whose first layer is an in-place op on a boundary tensor other branches also read
    models = _scaled_convs()
    x = torch.randn(2, 3, 8, 8)
    mm = build_multimodel([profile_model(m, x[:1]) for m in models])
    conv = next(k for k in mm.layers if mm.layers[k].name == "conv")
    h = models[0].conv(x)
    before = h.clone()
    mul_branch = KeyedModule(mm, [conv], [mm.output_key(1)])
    mul_branch(h)
    torch.testing.assert_close(h, before, rtol=0, atol=0)
