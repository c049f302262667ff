from __future__ import annotations

import pytest
import torch
from torch import nn

from framework.freezing import LayerModule, is_sequential_chain, split_by_size, split_children, split_regex


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(self.a(x))


def test_split_children_attaches_parameter_free_children_to_the_module_before():
    model = nn.Sequential(nn.ReLU(), nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1), nn.Sigmoid())
    assert split_children(model) == [
        LayerModule("0+1+2", ("0", "1", "2")),
        LayerModule("3+4", ("3", "4")),
    ]


def test_split_regex_matches_full_names_and_skips_descendants_of_matches(cnn):
    modules = split_regex(cnn, r"2\.\d|0")
    assert [lm.members for lm in modules] == [("0",), ("2.0",), ("2.1",)]


def test_split_regex_matches_every_conv_layer(cnn):
    convs = [n for n, m in cnn.named_modules() if isinstance(m, nn.Conv2d)]
    assert [lm.members[0] for lm in split_regex(cnn, r".*\.0")] != []
    assert [lm.members[0] for lm in split_regex(cnn, "|".join(c.replace(".", r"\.") for c in convs))] == convs


def test_split_by_size_expands_large_stages_and_balances_parameter_counts():
    # stage "1" holds 4 x 16x16 linears (most parameters) and is split finer; small front layers group together
    model = nn.Sequential(
        nn.Linear(2, 2),
        nn.Sequential(*[nn.Linear(16, 16) for _ in range(4)]),
        nn.Linear(16, 2),
    )
    modules = split_by_size(model, 3)
    assert [lm.members for lm in modules] == [("0", "1.0"), ("1.1", "1.2"), ("1.3", "2")]
    assert is_sequential_chain(model, modules)


def test_split_by_size_of_one_gives_the_whole_model(cnn):
    modules = split_by_size(cnn, 1)
    assert len(modules) == 1 and modules[0].members == ("0", "1", "2", "3")


def test_layer_module_parameter_and_state_names(cnn):
    lm = LayerModule("stem", ("0",))
    assert lm.parameter_names(cnn) == ["0.0.weight", "0.0.bias", "0.1.weight", "0.1.bias"]
    assert "0.1.running_mean" in lm.state_keys(cnn)


def test_is_sequential_chain_rejects_gaps_and_non_sequential_parents():
    model = nn.Sequential(nn.Linear(4, 4), _Residual(), nn.Linear(4, 1))
    assert is_sequential_chain(model, split_children(model))
    assert not is_sequential_chain(model, [LayerModule("a", ("0",)), LayerModule("c", ("2",))])
    assert not is_sequential_chain(model, [LayerModule("a", ("0", "1.a", "1.b", "2"))])


def test_split_regex_rejects_a_pattern_matching_nothing(cnn):
    with pytest.raises(ValueError, match=r"`pattern` is 'nope', but must fully match at least one module name"):
        split_regex(cnn, "nope")


def test_split_regex_rejects_an_invalid_pattern(cnn):
    with pytest.raises(ValueError, match=r"`pattern` is '\(', but must be a valid regular expression"):
        split_regex(cnn, "(")


def test_split_by_size_rejects_zero_modules(cnn):
    with pytest.raises(ValueError, match="`num_modules` is 0, but must be >= 1"):
        split_by_size(cnn, 0)


def test_layer_module_rejects_empty_members():
    with pytest.raises(ValueError, match="`members` of layer module 'x' is empty, but must name at least one module"):
        LayerModule("x", ())
