"""`WandbCallback`'s arguments, checked at construction before any W&B run starts (a run on the engine:
`tests/integration/test_trackers_wandb.py`)."""

from __future__ import annotations

import pytest

import framework

pytest.importorskip("wandb")


def test_wandb_callback_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match="`mode` is 'offlne', but must be one of"):
        framework.WandbCallback(mode="offlne")


def test_wandb_callback_rejects_tags_that_are_not_a_list_of_str():
    with pytest.raises(TypeError, match="`tags` is 'ci', but must be a list of str"):
        framework.WandbCallback(tags="ci")


def test_wandb_callback_rejects_a_project_that_is_not_a_str():
    with pytest.raises(TypeError, match="`project` is 3, but must be a str"):
        framework.WandbCallback(project=3)


def test_wandb_callback_rejects_what_it_sets_per_config():
    with pytest.raises(TypeError, match="`name` is set by WandbCallback for each config's run"):
        framework.WandbCallback(name="mine")


def test_wandb_callback_rejects_keywords_wandb_init_does_not_take():
    with pytest.raises(TypeError, match="`entitiy` is not a keyword of wandb.init: pass one of .*'entity'"):
        framework.WandbCallback(entitiy="me")


def test_wandb_callback_keeps_the_keywords_it_passes_on():
    tracker = framework.WandbCallback(project="p", mode="offline", tags=["a"], entity="me", notes="n")
    assert (tracker.project, tracker.mode, tracker.tags) == ("p", "offline", ["a"])
    assert tracker.init_kwargs == {"entity": "me", "notes": "n"}
