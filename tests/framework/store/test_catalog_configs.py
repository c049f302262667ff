"""How the catalog writes a config (`framework.store.catalog`): as the JSON it reads back exactly, never as text it
made up (`default=str` once wrote `np.float32(0.05)` as the string '0.05', which a replay handed to model_fn). What
JSON would lose is refused and the transaction writes nothing."""

from __future__ import annotations

import numpy as np
import pytest

from framework.store.catalog import SQLiteCatalog


@pytest.fixture
def catalog(tmp_path):
    c = SQLiteCatalog(str(tmp_path / "run.db"))
    yield c
    c.close()


def test_a_config_is_written_as_the_json_it_reads_back_exactly(catalog):
    catalog.add_config(0, {"lr": np.float32(0.05), "n": np.int64(3), "on": np.bool_(True), "shape": (2, 2)}, "active")
    [config] = catalog.configs().config
    assert config == {"lr": 0.05000000074505806, "n": 3, "on": True, "shape": [2, 2]}
    assert [type(v) for v in config.values()] == [float, int, bool, list]


@pytest.mark.parametrize("value, error, words", [
    ({1, 2}, TypeError, "`configs[0]['x']` is {1, 2}, a set, but a config holds JSON values only"),
    (b"ab", TypeError, "`configs[0]['x']` is b'ab', a bytes"),
    (float("nan"), ValueError, "`configs[0]['x']` is nan, but a float in a config must be finite"),
    (10**400, ValueError, "`configs[0]['x']` is 1.00000e+400 (an int), but an int in a config must be in"),
])
def test_a_config_json_would_lose_is_refused_and_nothing_is_written(catalog, value, error, words):
    with pytest.raises(error) as e:
        catalog.add_config(0, {"x": value}, "active")
    assert str(e.value).startswith(words) and "\n" not in str(e.value)
    with pytest.raises(error):
        catalog.commit_round(0, epochs=[], statuses=[], new_configs=[(0, {"lr": 0.1}, None, 0), (1, {"x": value}, None, 0)],
                             procedure=None)
    assert catalog.configs().empty  # neither the config nor the round's other one
