"""Shared fixtures: one local Ray cluster per test session, small real datasets, a CPU hog."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# every process the tests start (xdist workers, Ray's workers, subprocess drivers, CLI calls) compiles our modules once
# and reads the cached bytecode after, even where the environment asks for no bytecode (PYTHONDONTWRITEBYTECODE):
# otherwise each of the suite's ~230 Python processes compiles what it imports of our code again, and pytest rewrites
# every test module's asserts again in each xdist process (measured over a whole run on 2 cores: 1,417 s of CPU before,
# 1,252 s after; a worker actor's start 8.0 s of CPU before, 6.9 s after)
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
# the tests' runs never attach to a local service the developer started (`modelhopper up`): an empty record folder,
# removed when this process exits
os.environ["MODELHOPPER_SERVICE_DIR"] = tempfile.mkdtemp(prefix="modelhopper-test-service-")
atexit.register(shutil.rmtree, os.environ["MODELHOPPER_SERVICE_DIR"], ignore_errors=True)


@pytest.fixture(scope="session")
def ray_cluster():
    """A real local Ray instance shared by every integration test of the session."""
    import ray

    from framework.cluster import spares

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    # the worker actors a run leaves (spares) wait for the next run of this process however many other tests come
    # between (files run in random order): a new actor costs seconds of CPU, an idle one none; tests that make
    # actors of their own free them first (`ray_actors`), and a run that must make a new actor kills them first
    spares.SPARE_TTL_S = 3600.0
    yield ray
    ray.shutdown()


@pytest.fixture
def ray_actors(ray_cluster):
    """The session's Ray for a test that makes actors of its own (two at most, of one CPU each): of the worker actors
    earlier runs of this process keep as spares (`RayBackend(reuse_workers=True)`, up to `SPARE_TTL_S`), as many are
    killed first as it takes for two CPUs to be free, so the test's actors start at once (a gang's rendezvous would
    otherwise wait out its timeout for a member still pending)."""
    from framework.engine.ray_backend import release_spare_workers

    release_spare_workers({"CPU": 2})
    return ray_cluster


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


@contextlib.contextmanager
def _hog(n: int | None = None):
    """`n` (default: one per core) Python processes in a busy loop for the duration of the block, killed after it."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n or os.cpu_count() or 2)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


@pytest.fixture
def cpu_hog():
    """`with cpu_hog(): ...` runs the block beside a process spinning on every core, as on a busy CI runner or
    laptop."""
    return _hog


@pytest.fixture(autouse=True)
def _seeded_torch(request):
    """torch's global generator seeded for each test from the order's seed and the test's id, as pytest-randomly
    seeds `random` and NumPy's: a test's unseeded draws change from one seed to the next (so a test that passes by
    luck shows) and repeat with `make test TEST_SEED=N`. Without pytest-randomly the seed is 0."""
    import zlib

    from framework.engine.runner import seed_torch

    try:
        seed = request.config.getoption("randomly_seed")
    except ValueError:  # -p no:randomly
        seed = 0
    seed = (seed if isinstance(seed, int) else 0) + zlib.crc32(request.node.nodeid.encode())
    seed_torch(seed % 2**32)  # (not `torch.manual_seed`, which formats this deep stack: seconds a run)


CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def _headless_chrome(width: int, height: int):
    """A headless Debian Chromium driven by Selenium, its window `width` x `height`, or a skip that says what is
    missing (the dashboard's and the docs site's browser tests)."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed: apt-get install chromium chromium-driver (.ci/run does)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed: pip install -e '.[dev]'")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}", "--disable-extensions", "--no-first-run"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


@pytest.fixture(scope="session")
def headless_chrome():
    """`headless_chrome(width, height)`: a new headless Chromium (the caller quits it), or a skip naming what is
    missing."""
    return _headless_chrome
