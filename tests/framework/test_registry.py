"""The one table type of every extension point found by name (`framework.registry.Registry`)."""

import pytest

from framework.command_specs import COMMAND_ENTRIES
from framework.engine.faults import FAULT_KINDS, Fault
from framework.registry import Registry
from framework.scheduling import SCHEDULERS, SOLVERS, make_scheduler
from framework.sources import Source
from framework.stoppers import STOPPERS


def test_a_registry_keeps_the_order_and_refuses_a_name_twice():
    colours = Registry("colour", [("red", 1), ("green", 2)])
    assert list(colours) == ["red", "green"] and colours.lookup("green", "colour") == 2

    @colours.register("blue")
    def blue():
        return 3

    assert colours["blue"] is blue and blue() == 3  # the decorator leaves the definition as it was
    with pytest.raises(ValueError, match="colour 'red' is defined twice"):
        colours.add("red", 4)
    with pytest.raises(ValueError, match="colour 'red' is defined twice"):
        Registry("colour", [("red", 1), ("red", 2)])
    assert colours["red"] == 1


@pytest.mark.parametrize("name", ["purple", None, 3, ["red"]])
def test_a_lookup_of_a_name_not_there_names_the_parameter_the_value_and_the_choices(name):
    colours = Registry("colour", {"red": 1, "green": 2})
    with pytest.raises(ValueError, match=r"^`paint` is .*, but must be one of \['red', 'green'\] or a brush$"):
        colours.lookup(name, "paint", " or a brush")


def test_every_extension_point_found_by_name_is_a_registry():
    for table in (SCHEDULERS, SOLVERS, STOPPERS, FAULT_KINDS, COMMAND_ENTRIES, Source.registry):
        assert isinstance(table, Registry), table
    with pytest.raises(ValueError, match=r"`scheduler` is 'fifo', but must be one of \['randomized', .* or a "
                                         r"Scheduler instance"):
        make_scheduler("fifo")
    with pytest.raises(ValueError, match=r"`action` is 'explode', but must be one of \['raise', "):
        Fault("explode")


def test_a_source_class_whose_kind_is_taken_is_refused_where_it_is_defined():
    with pytest.raises(ValueError, match="source kind 'parquet' is defined twice"):
        class Mine(Source):
            kind = "parquet"
    assert Source.registry["parquet"].__name__ != "Mine"


def test_a_source_class_defined_again_under_its_own_name_replaces_itself():
    def define():
        class NotebookSource(Source):  # (a notebook cell run twice defines the class twice)
            kind = "notebook-test"
        return NotebookSource

    first, again = define(), define()
    assert first is not again and Source.registry["notebook-test"] is again
    del Source.registry["notebook-test"]
