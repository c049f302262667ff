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
