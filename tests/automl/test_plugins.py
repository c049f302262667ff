from __future__ import annotations

import sys
import textwrap

import pytest

import automl
import simulators

PLUGIN = textwrap.dedent(
    """
    from automl import Decision, Procedure

    class OneShot(Procedure):
        def __init__(self, config, epochs=1):
            self.config, self.epochs, self.started = config, epochs, False

        def step(self, states):
            if not self.started:
                self.started = True
                return Decision(add=[self.config])
            return Decision(stop=[s.id for s in states if s.status == "active" and s.epochs >= self.epochs])
    """
)


@pytest.fixture
def plugin_path(tmp_path, monkeypatch):
    """A user package `my_plugin` on sys.path, registering `oneshot` in the `modelhopper.procedures` group."""
    (tmp_path / "my_plugin.py").write_text(PLUGIN)
    dist = tmp_path / "my_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[modelhopper.procedures]\noneshot = my_plugin:OneShot\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("my_plugin", None)


def test_load_procedure_returns_an_instance_unchanged(space):
    hb = automl.HyperBand(space, max_epochs=9)
    assert automl.load_procedure(hb) is hb


def test_load_procedure_by_module_class_string(space):
    hb = automl.load_procedure("automl.hyperband:HyperBand", space=space, max_epochs=9, eta=3)
    assert isinstance(hb, automl.HyperBand) and hb.eta == 3


def test_load_procedure_by_short_name_for_every_builtin(space):
    assert isinstance(automl.load_procedure("grid", space={"a": [1, 2]}, epochs=1), automl.GridSearch)
    assert isinstance(automl.load_procedure("random", space=space, num_samples=2, epochs=1), automl.RandomSearch)
    assert isinstance(automl.load_procedure("hyperband", space=space, max_epochs=9), automl.HyperBand)
    assert isinstance(automl.load_procedure("asha", space=space, max_epochs=9, max_configs=3), automl.ASHA)
    assert isinstance(automl.load_procedure("tpe", space=space, num_samples=2, epochs=1), automl.TPE)
    pbt = automl.load_procedure("pbt", space=space, population=2, epochs=2, perturbation_interval=1)
    assert isinstance(pbt, automl.PBT)


def test_load_procedure_by_a_class(space):
    assert isinstance(automl.load_procedure(automl.TPE, space=space, num_samples=2, epochs=1), automl.TPE)


def test_load_procedure_user_module_class_string_runs(plugin_path, objective):
    proc = automl.load_procedure("my_plugin:OneShot", config={"lr": 0.01, "act": "relu"}, epochs=2)
    run = simulators.run_procedure_offline(proc, objective)
    assert run.finished and [s.epochs for s in run.states] == [2]


def test_load_procedure_finds_entry_points_of_installed_packages(plugin_path):
    assert automl.available_procedures()["oneshot"] == "my_plugin:OneShot"
    proc = automl.load_procedure("oneshot", config={"x": 1})
    assert type(proc).__name__ == "OneShot"


def test_load_procedure_unknown_name_lists_the_available_ones():
    with pytest.raises(ValueError, match=r"`spec` is 'hyperopt', but must be one of \[.*'asha'.*'hyperband'.*'pbt'"):
        automl.load_procedure("hyperopt")


def test_load_procedure_bad_path_raises():
    with pytest.raises(ValueError, match=r"module 'no_such_module' cannot be imported"):
        automl.load_procedure("no_such_module:X")
    with pytest.raises(ValueError, match=r"module 'automl' has no attribute 'Nope'"):
        automl.load_procedure("automl:Nope")


def test_load_procedure_rejects_non_procedures():
    with pytest.raises(TypeError, match=r"must name a subclass of automl.Procedure"):
        automl.load_procedure("automl.space:SearchSpace")


def test_load_procedure_rejects_unknown_options_listing_the_known_ones(space):
    with pytest.raises(TypeError, match=r"HyperBand got unknown option\(s\) \['grace'\]; its options are \['space'"):
        automl.load_procedure("hyperband", space=space, max_epochs=9, grace=1)


def test_load_procedure_names_the_options_a_class_needs(space):
    with pytest.raises(TypeError, match=r"HyperBand needs the option\(s\) \['max_epochs'\], which were not given"):
        automl.load_procedure("automl.hyperband:HyperBand", space=space)


def test_load_procedure_rejects_options_with_an_instance(space):
    with pytest.raises(TypeError, match=r"options \['eta'\] were given as well"):
        automl.load_procedure(automl.HyperBand(space, max_epochs=9), eta=3)
