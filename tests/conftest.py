"""Shared fixtures: one local Ray cluster per test session, small real datasets."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_DEDUP_LOGS", "0")


@pytest.fixture(scope="session")
def ray_cluster():
    """A real local Ray instance shared by every integration test of the session."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def digits():
    from framework.examples import digits_arrays

    return digits_arrays()


def _assert_complete(result_or_path):
    """Check a finished run's completeness proof (`Result.assert_complete`): every config's latest verified state
    records exactly the visits the schedule log has, each finished epoch every partition once. Returns the Result."""
    from framework.result import Result

    result = result_or_path if isinstance(result_or_path, Result) else Result.open(str(result_or_path))
    assert (result.schedule.kind == "train").any(), f"nothing trained in {result.storage_path}: nothing to check"
    result.assert_complete()
    return result


@pytest.fixture(scope="session")
def assert_complete():
    """`assert_complete(result_or_path)`: raises `IncompleteRunError` naming each config whose visit record (in its
    latest verified checkpoint) disagrees with the schedule log or its committed epochs."""
    return _assert_complete

