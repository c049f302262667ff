from __future__ import annotations

import torch

from framework.planner import build_multimodel, profile_model
from tests.framework.planner.conftest import Head, frozen_encoder


def test_multimodel_merges_exactly_the_shared_frozen_layers() -> None:
    enc = frozen_encoder()
    x = torch.randint(0, 20, (1, 6))
    mm = build_multimodel([profile_model(Head(enc), x), profile_model(Head(enc, hidden=4), x)])
    shared = sorted(mm.layers[k].name for k in mm.shared)
    assert shared == ["enc_emb", "enc_l1", "enc_l2", "x"]
    assert len(mm.layers) == 4 + 2 * 5  # 5 private layers each: fc, relu, drop, mean, out


def test_multimodel_keeps_layers_apart_when_frozen_weights_differ() -> None:
    x = torch.randint(0, 20, (1, 6))
    other = frozen_encoder(seed=1)
    mm = build_multimodel([profile_model(Head(frozen_encoder()), x), profile_model(Head(other), x)])
    assert sorted(mm.layers[k].name for k in mm.shared) == ["x"]


def test_multimodel_does_not_merge_trainable_copies() -> None:
    enc = frozen_encoder()
    for p in enc.l2.parameters():
        p.requires_grad_(True)
    x = torch.randint(0, 20, (1, 6))
    mm = build_multimodel([profile_model(Head(enc), x), profile_model(Head(enc), x)])
    assert sorted(mm.layers[k].name for k in mm.shared) == ["enc_emb", "enc_l1", "x"]
