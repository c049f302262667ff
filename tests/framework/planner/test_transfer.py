from __future__ import annotations

import pytest
import torch

from framework.planner import CostModel, TransferSelection
from tests.framework.planner.conftest import Head, data, frozen_encoder

CM = CostModel(1e9, 1e9)
CONFIGS = [{"batch_size": 8, "lr": 1e-2}, {"batch_size": 8, "lr": 3e-3}, {"batch_size": 16, "lr": 1e-2}]


def _selection(tmp_path, method: str = "planner", **kw) -> TransferSelection:
    enc = frozen_encoder()
    return TransferSelection(
        lambda c: Head(enc), CONFIGS, store_dir=tmp_path / method, method=method, epochs=2, cost_model=CM, **kw
    )


def test_transfer_methods_give_the_same_metrics(tmp_path) -> None:
    results = {}
    for method in ("current_practice", "mat_all", "planner"):
        sel = _selection(tmp_path, method)
        results[method] = sel.fit(data(32, 1), data(16, 2)).metrics
    cols = ["train_loss", "valid_loss", "valid_acc"]
    for method in ("mat_all", "planner"):
        assert list(results[method].config_id) == list(results["current_practice"].config_id)
        torch.testing.assert_close(
            torch.tensor(results[method][cols].to_numpy()),
            torch.tensor(results["current_practice"][cols].to_numpy()),
            rtol=1e-4,
            atol=1e-5,
        )
    assert len(results["planner"]) == len(CONFIGS) * 2


def test_transfer_incremental_cycles_extract_only_new_records(tmp_path) -> None:
    sel = _selection(tmp_path, initial_records=1000)
    res = sel.fit(data(32, 1), data(16, 2))
    assert res.plan.materialized and sel.extracted_records == 48
    res = sel.fit(data(24, 3), data(8, 4))
    assert sel.extracted_records == 48 + 32  # old records are read back, never recomputed
    assert sel.replans == 1 and res.metrics.cycle.unique().tolist() == [1]
    key = res.plan.materialized[0]
    assert len(sel.store.ids(key)) == 80


def test_transfer_r_doubling_replans(tmp_path) -> None:
    sel = _selection(tmp_path, initial_records=40)
    sel.fit(data(32, 1), data(8, 2))
    assert sel.records == 40 and sel.replans == 1
    sel.fit(data(32, 3), data(8, 4))  # 64 training records > r = 40
    assert sel.records == 80 and sel.replans == 2


def test_transfer_hop_carries_only_trainable_state(tmp_path) -> None:
    sel = _selection(tmp_path)
    res = sel.fit(data(16, 1), data(8, 2))
    before, after = res.plan.hop_bytes(0)
    assert after == (16 * 8 + 8 + 8 * 3 + 3) * 4 and before > 10 * after
    assert all("enc" not in k for k in res.plan.hop_state(0))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"method": "magic"}, "method"),
        ({"disk_budget": -1}, "disk_budget"),
        ({"memory_budget": -5.0}, "memory_budget"),
        ({"initial_records": 0}, "initial_records"),
        ({"epochs": 0}, "epochs"),
        ({"configs": [{"lr": 1.0}]}, "batch_size"),
        ({"configs": []}, "configs"),
    ],
)
def test_transfer_rejects_bad_arguments(tmp_path, kwargs: dict, name: str) -> None:
    args = {"store_dir": tmp_path, "configs": CONFIGS, **kwargs}
    configs = args.pop("configs")
    with pytest.raises(ValueError, match=name):
        TransferSelection(lambda c: Head(frozen_encoder()), configs, **args)


def test_transfer_zero_disk_budget_stores_nothing_and_only_fuses(tmp_path) -> None:
    sel = _selection(tmp_path, disk_budget=0)
    res = sel.fit(data(32, 1), data(16, 2))
    assert res.plan.materialized == () and sel.store.nbytes() == 0 and sel.extracted_records == 0
    assert len(res.plan.groups) < len(CONFIGS)  # the two batch-size-8 configs share the frozen encoder per batch
    ref = _selection(tmp_path, "current_practice").fit(data(32, 1), data(16, 2)).metrics
    cols = ["train_loss", "valid_loss", "valid_acc"]
    torch.testing.assert_close(torch.tensor(res.metrics[cols].to_numpy()), torch.tensor(ref[cols].to_numpy()),
                               rtol=1e-4, atol=1e-5)


def test_transfer_mat_all_loads_only_the_stored_layer_each_model_reads(tmp_path) -> None:
    sel = _selection(tmp_path, "mat_all")
    res = sel.fit(data(16, 1), data(8, 2))
    plan = res.plan
    assert len(plan.materialized) > 1  # every frozen layer is stored ...
    for g in range(len(plan.groups)):  # ... but each model reads just the encoder's output, never the raw records
        assert [plan.mm.layers[k].name for k in plan.loaded_keys(g)] == ["enc_l2"]


def test_transfer_staged_extraction_gives_the_same_metrics(tmp_path) -> None:
    eager = _selection(tmp_path, "mat_all").fit(data(24, 1), data(8, 2)).metrics
    staged = _selection(tmp_path / "staged", "mat_all", extraction="staged")
    cols = ["train_loss", "valid_loss", "valid_acc"]
    torch.testing.assert_close(torch.tensor(staged.fit(data(24, 1), data(8, 2)).metrics[cols].to_numpy()),
                               torch.tensor(eager[cols].to_numpy()), rtol=0, atol=0)


def test_transfer_rejects_an_unknown_extraction(tmp_path) -> None:
    with pytest.raises(ValueError, match="`extraction` is 'lazy', but must be one of"):
        TransferSelection(lambda c: Head(frozen_encoder()), CONFIGS, store_dir=tmp_path, extraction="lazy")
