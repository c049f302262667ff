from __future__ import annotations

import pytest

from framework.planner import ExtractionRequest, choose_extraction_batch_sizes, choose_split_index


def test_split_picks_earliest_smaller_layer_that_fits_bandwidth() -> None:
    sizes = [800, 300, 500, 100, 50]  # per record; input is 400
    assert choose_split_index(sizes, 400, 4, batch_size=10, bandwidth_bytes_per_s=4000) == 1
    assert choose_split_index(sizes, 400, 4, batch_size=10, bandwidth_bytes_per_s=2000) == 3  # 300*10 too slow
    assert choose_split_index(sizes, 400, 2, batch_size=10, bandwidth_bytes_per_s=100) == 2  # none fits: freeze index


def test_split_rejects_freeze_index_out_of_range() -> None:
    with pytest.raises(ValueError, match="`freeze_index` is 5"):
        choose_split_index([1, 2], 4, 5, batch_size=1, bandwidth_bytes_per_s=1)


def test_batch_sizes_maximise_memory_use_within_budget() -> None:
    reqs = [ExtractionRequest(100, 1000, 1, 50), ExtractionRequest(300, 0, 1, 10)]
    b = choose_extraction_batch_sizes(reqs, memory_total=6000)
    used = b[0] * 100 + 1000 + b[1] * 300
    assert used <= 6000 and used >= 5900  # optimum uses all but < one record of the cheapest request


def test_batch_sizes_reject_infeasible_minimum() -> None:
    with pytest.raises(ValueError, match="cannot fit"):
        choose_extraction_batch_sizes([ExtractionRequest(100, 0, 50, 60)], memory_total=1000)


def test_extraction_request_rejects_bad_bounds() -> None:
    with pytest.raises(ValueError, match="`min_batch` is 5"):
        ExtractionRequest(1, 0, 5, 2)
