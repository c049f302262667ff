"""A run directory is data from a possibly untrusted source: a copy from a colleague, a shared file system, a
download. Whatever is edited in it (rows, paths, files), `Result`, `show`, `resume` and `replay` never run code it
names, never read or write outside it, and either verify it or say clearly that it does not verify.

The fuzz test edits random rows and files of a finished and of a crashed run; `make fuzz` runs it with many more
examples (`MODELHOPPER_FUZZ_EXAMPLES`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import sys
import urllib.parse
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import automl
import framework
from framework.__main__ import main as cli
from framework.store.catalog import CatalogError, SQLiteCatalog, UnverifiedRunError, UnverifiedRunWarning
from framework.store.signing import SignatureError
from tests.integration.ft_functions import classifier_eval_fn, classifier_train_fn, mlp_model_fn

pytestmark = pytest.mark.ray
FNS = {"model_fn": mlp_model_fn, "train_fn": classifier_train_fn, "eval_fn": classifier_eval_fn}
#: a pickle that imports tests.integration.planted (which runs code on import) and calls its `touch`
PAYLOAD = b"ctests.integration.planted\ntouch\n)R."
PLANTED_REF = "tests.integration.planted:model_fn"
TABLES = ("meta", "configs", "units", "epochs", "checkpoints", "events", "rounds", "digests")


@pytest.fixture(scope="module")
def finished_run(crashed_run, digits, tmp_path_factory):
    # made after the crashed run (whose subprocess driver frees this process's spare workers as it starts): its one
    # worker is left as a spare for the resume of the crashed run, which then starts no actor of its own
    x, y = digits
    ds = framework.PartitionedDataset.from_arrays(x[:300], y[:300], num_partitions=2, seed=0)
    storage = str(tmp_path_factory.mktemp("integrity") / "finished")
    framework.ModelSelection(
        *FNS.values(), ds, automl.GridSearch({"hidden": [16], "lr": [0.05, 0.1], "batch_size": [64]}, epochs=2),
        num_workers=1, storage_path=storage, progress=False).run()
    return storage


@pytest.fixture(scope="module")
def crashed_run(ray_cluster, tmp_path_factory):
    from tests.integration.ft_helpers import _crash_driver

    return _crash_driver(tmp_path_factory.mktemp("integrity"), "unit")


def _copy(run: str, where) -> str:
    return shutil.copytree(run, str(where / "run"))


def _sql(run: str, statement: str, args: tuple = ()) -> None:
    conn = sqlite3.connect(os.path.join(run, "run.db"), isolation_level=None)
    try:
        conn.execute(statement, args)
    finally:
        conn.close()


def _resume(run: str, **kw):
    return framework.ModelSelection.resume(run, *FNS.values(), progress=False, **kw)


# ---- the audit's cases --------------------------------------------------------------------------------------------
def test_planted_checkpoint_rows_outside_the_run_are_refused_and_no_file_is_deleted(crashed_run, tmp_path):
    run = _copy(crashed_run, tmp_path)
    victims = [tmp_path / "victim.txt", tmp_path / "victim2.txt"]
    for v in victims:
        v.write_text("keep me")
    for units, path in ((-2, str(victims[0])), (-1, os.path.relpath(victims[1], run))):  # older than any: pruned first
        _sql(run, "INSERT INTO checkpoints VALUES (1, 0, ?, ?, 'x', 1, 0, NULL)", (units, path))
    with pytest.raises(UnverifiedRunError, match=r"checkpoints \(config 1, units -2\) does not verify"):
        _resume(run)
    # a caller who accepts the run anyway: it trains to the end, and still deletes nothing outside it
    with pytest.warns(UnverifiedRunWarning):
        result = _resume(run, trust_unverified=True).run()
    assert all(v.read_text() == "keep me" for v in victims)
    assert not result.verified and any("checkpoints (config 1, units -1)" in p for p in result.unverified)
    assert set(result.status.status) == {"completed"}


@pytest.mark.parametrize("statement, named", [
    ("UPDATE epochs SET metrics = json_set(metrics, '$.valid_accuracy', 1.0) WHERE config_id = 0 AND epoch = 1",
     "epochs (config 0, epoch 1)"),
    ("UPDATE configs SET status = 'failed' WHERE id = 1", "config 1"),
    ("UPDATE configs SET config = json_set(config, '$.lr', 5.0) WHERE id = 0", "config 0"),
    ("UPDATE meta SET value = '7' WHERE key = 'seed'", "meta 'seed'"),
    ("DELETE FROM units WHERE seq = 3", "units: rows were deleted"),
])
def test_an_edited_run_is_reported_by_result_and_refused_by_resume_and_replay(finished_run, tmp_path, capsys,
                                                                              statement, named):
    run = _copy(finished_run, tmp_path)
    _sql(run, statement)
    with pytest.warns(UnverifiedRunWarning, match="is not verified") as seen:
        result = framework.Result.open(run)
    assert not result.verified and any(p.startswith(named) for p in result.unverified), result.unverified
    assert named in str(seen[0].message)
    with pytest.raises(UnverifiedRunError, match="resume refuses"):
        _resume(run)
    with pytest.raises(UnverifiedRunError, match="replay refuses"):
        framework.replay(run, **FNS, out_path=str(tmp_path / "replay"))
    with warnings.catch_warnings():
        warnings.simplefilter("always", UnverifiedRunWarning)
        assert cli(["show", run]) == 0
    err = capsys.readouterr().err
    assert "warning: the run in" in err and named in err
    assert cli(["replay", run, "--out", str(tmp_path / "r2")]) == 2
    assert "replay refuses" in capsys.readouterr().err


def test_the_dashboard_and_watch_say_a_run_does_not_verify_and_which_configs(finished_run, tmp_path, capsys):
    import json
    import urllib.request

    from framework.dashboard import serve

    def leaderboard(run: str) -> dict:
        with serve(run) as board:
            with urllib.request.urlopen(board.url.replace("/?", "/api/leaderboard?"), timeout=30) as r:
                return json.loads(r.read())

    clean = leaderboard(finished_run)
    assert (clean["unverified"], clean["unverified_count"], clean["suspect_configs"]) == ([], 0, [])
    run = _copy(finished_run, tmp_path)
    _sql(run, "UPDATE epochs SET metrics = json_set(metrics, '$.valid_loss', 0.0) WHERE config_id = 1 AND epoch = 1")
    # a better loss than it had: the page must not just show it
    edited = leaderboard(run)
    assert edited["unverified_count"] >= 1 and edited["suspect_configs"] == [1], edited
    assert any(line.startswith("epochs (config 1, epoch 1) does not verify") for line in edited["unverified"])
    assert cli(["watch", finished_run, "--once"]) == 0 and "NOT VERIFIED" not in capsys.readouterr().out
    assert cli(["watch", run, "--once"]) == 0
    out = capsys.readouterr().out
    assert "NOT VERIFIED (" in out and "epochs (config 1, epoch 1) does not verify" in out, out
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.split()[:1] in (["0"], ["1"])}
    assert rows == {"0": rows["0"], "1": "NO"} and rows["0"] != "NO", out


def test_an_unedited_run_verifies_everywhere(finished_run, assert_complete):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnverifiedRunWarning)
        assert framework.Result.open(finished_run).verified
        assert_complete(finished_run)
        assert _resume(finished_run) is not None


def test_a_trusted_replay_of_an_edited_run_imports_nothing_and_signs_nothing(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    _sql(run, "UPDATE meta SET value = json_set(value, '$.model_fn', ?) WHERE key = 'functions'", (PLANTED_REF,))
    with pytest.raises(SignatureError, match="imports nothing it cannot verify"), pytest.warns(UnverifiedRunWarning):
        framework.replay(run, out_path=str(tmp_path / "replay"), trust_unverified=True)
    with pytest.warns(UnverifiedRunWarning):
        replayed = framework.replay(run, **FNS, out_path=str(tmp_path / "replay2"), trust_unverified=True)
    assert not replayed.verified  # the replay of an unverified run is itself unverified: nothing was re-signed
    assert "tests.integration.planted" not in sys.modules


def test_an_edited_data_file_is_refused_by_resume_and_replay(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    with open(os.path.join(run, "data", "train_0_1.npy"), "r+b") as f:
        f.seek(-1, os.SEEK_END)
        f.write(b"\x07")  # one label changed
    with pytest.raises(CatalogError, match="train_0_1.npy is not the one the run wrote"):
        _resume(run)
    with pytest.raises(CatalogError, match="train_0_1.npy is not the one the run wrote"):
        framework.replay(run, **FNS, out_path=str(tmp_path / "replay"))


def test_result_files_planted_as_links_out_of_the_run_are_replaced_not_written_through(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    for name in ("metrics.csv", "learning_curves.png", "configs.json"):
        os.remove(os.path.join(run, name))
        os.symlink(victim, os.path.join(run, name))
    framework.Result.open(run).write()
    assert victim.read_text() == "keep me" and not os.path.islink(os.path.join(run, "metrics.csv"))
    # replay writes next to the run, never into it: a folder planted in the run cannot redirect it
    os.symlink(tmp_path, os.path.join(run, "replay"))
    before = sorted(os.listdir(run))
    again = framework.replay(run, **FNS)
    assert again.storage_path == os.path.normpath(run) + "-replay" and sorted(os.listdir(run)) == before
    assert not (tmp_path / "run.db").exists()


# ---- the fuzz test ------------------------------------------------------------------------------------------------
_values = st.one_of(
    st.none(), st.integers(-3, 2**40), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.binary(max_size=8),
    st.sampled_from(["/tmp/victim", "../victim", "checkpoints/../../victim", PLANTED_REF, '{"x": 1}', "[]", "{",
                     "null", '"os:system"', "NaN"]),
)
_edits = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(TABLES), st.integers(0, 10**6), st.integers(0, 20), _values),
    st.tuples(st.just("delete"), st.sampled_from(TABLES), st.integers(0, 10**6)),
    st.tuples(st.just("drop"), st.sampled_from(TABLES)),
    st.tuples(st.just("plant_checkpoint"), st.sampled_from(["abs", "rel", "link"])),
    st.tuples(st.just("plant_functions")),
    st.tuples(st.just("plant_pickle")),
    st.tuples(st.just("trigger")),
    st.tuples(st.just("truncate"), st.integers(0, 10**6), st.integers(0, 8192)),
    st.tuples(st.just("link"), st.integers(0, 10**6)),
)


class _Guard:
    """Watches the process (an audit hook, installed once) for what a reader must never do: open a victim file
    outside the run, write, rename or delete anything outside the run, or run planted code."""

    installed: _Guard | None = None

    def __init__(self) -> None:
        self.root: str | None = None
        self.victims: set[str] = set()
        self.violations: list[str] = []
        sys.addaudithook(self._hook)

    @classmethod
    def get(cls) -> _Guard:
        cls.installed = cls.installed or cls()
        return cls.installed

    def _hook(self, event: str, args: tuple) -> None:
        if self.root is None:
            return
        if event in ("os.system", "subprocess.Popen", "os.exec", "os.posix_spawn"):
            self.violations.append(f"{event} {args[:2]}")
        elif event in ("open", "sqlite3.connect") and isinstance(args[0], (str, bytes, os.PathLike)):
            name = os.fsdecode(args[0])
            if name.startswith("file:"):  # an SQLite URI
                name = urllib.parse.unquote(name[5:].split("?")[0])
            path = os.path.realpath(name)
            mode, flags = (args[1], args[2]) if event == "open" else ("w", 0)
            writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(
                flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
            if path in self.victims:
                self.violations.append(f"opened {path}")
            elif writes and not self._inside(path):
                self.violations.append(f"{event} {path} for writing")
        elif event in ("os.remove", "os.rename", "os.replace", "os.rmdir", "shutil.rmtree", "os.mkdir", "os.symlink",
                       "os.truncate", "os.link", "os.chmod"):
            paths = [a for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))]
            for p in paths:
                if not self._inside(os.path.realpath(os.fsdecode(p))):
                    self.violations.append(f"{event} {p}")

    def _inside(self, path: str) -> bool:
        return path == self.root or path.startswith(self.root + os.sep) or path.endswith(".pyc")


def _apply(run: str, edit: tuple, victim: str) -> None:
    """One edit of the run directory, as an attacker (or a careless copy) would make it; some do nothing."""
    db = os.path.join(run, "run.db")
    kind = edit[0]
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(run) for f in fs)
    with contextlib.suppress(sqlite3.DatabaseError, OSError):
        conn = sqlite3.connect(db, isolation_level=None)
        try:
            if kind in ("set", "delete"):
                table, row = edit[1], edit[2]
                rowids = [r[0] for r in conn.execute(f"SELECT rowid FROM {table} ORDER BY rowid")]
                if rowids:
                    rowid = rowids[row % len(rowids)]
                    if kind == "delete":
                        conn.execute(f"DELETE FROM {table} WHERE rowid = ?", (rowid,))
                    else:
                        cols = [c[1] for c in conn.execute(f"PRAGMA table_info({table})")]
                        conn.execute(f'UPDATE {table} SET "{cols[edit[3] % len(cols)]}" = ? WHERE rowid = ?',
                                     (edit[4], rowid))
            elif kind == "drop":
                conn.execute(f"DROP TABLE {edit[1]}")
            elif kind == "plant_checkpoint":
                path = {"abs": victim, "rel": os.path.relpath(victim, run), "link": "checkpoints/link.pt"}[edit[1]]
                if edit[1] == "link":
                    os.symlink(victim, os.path.join(run, path))
                for cid in (0, 1):
                    conn.execute("INSERT OR REPLACE INTO checkpoints VALUES (?, 9, 999, ?, 'x', 1, 0, 'f' )",
                                 (cid, path))
            elif kind == "plant_functions":
                conn.execute("UPDATE meta SET value = json_set(value, '$.model_fn', ?, '$.train_fn', ?) "
                             "WHERE key = 'functions'", (PLANTED_REF, PLANTED_REF))
            elif kind == "plant_pickle":
                conn.execute("UPDATE rounds SET procedure = ?", (PAYLOAD,))
            elif kind == "trigger":
                conn.execute("CREATE TRIGGER planted AFTER INSERT ON events BEGIN DELETE FROM units; END")
        finally:
            conn.close()
        if kind == "truncate" and files:
            path = files[edit[1] % len(files)]
            with open(path, "r+b") as f:
                f.truncate(min(edit[2], os.path.getsize(path)))
        elif kind == "link" and files:
            path = files[edit[1] % len(files)]
            os.remove(path)
            os.symlink(victim, path)


def _catalog_verifies(run: str) -> bool | None:
    try:
        catalog = SQLiteCatalog(os.path.join(run, "run.db"), readonly=True)
    except CatalogError:
        return None
    try:
        return not catalog.verify()
    finally:
        catalog.close()


def _check_edited_run(run: str, victim: str, tmp: str) -> None:
    verified = _catalog_verifies(run)
    # Result: verifies, or warns and says it is not verified, or refuses with a CatalogError
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            result = framework.Result.open(run)
            assert result.verified is bool(verified)
            assert verified or any(issubclass(w.category, UnverifiedRunWarning) for w in seen)
        except (CatalogError, SignatureError):
            assert not verified
        # show: a table, or one line on stderr and exit code 2; never a traceback
        assert cli(["show", run]) in (0, 2)
    if verified:
        return  # the edit missed the catalog (a file elsewhere): what resume and replay do then is tested elsewhere
    with pytest.raises((CatalogError, SignatureError)):
        _resume(run)
    with pytest.raises((CatalogError, SignatureError)):
        framework.replay(run, **FNS, out_path=os.path.join(tmp, "replay"))
    assert not os.path.exists(os.path.join(tmp, "replay", "run.db"))


def _fuzz(base: str, tmp_path_factory, edits: list[tuple]) -> None:
    guard = _Guard.get()
    tmp = str(tmp_path_factory.mktemp("fuzz"))
    run = shutil.copytree(base, os.path.join(tmp, "run"))
    victim = os.path.join(tmp, "victim.pt")
    with open(victim, "w") as f:
        f.write("keep me")
    marker = os.path.join(tmp, "planted-code-ran")
    for edit in edits:
        _apply(run, edit, victim)
    os.environ["MODELHOPPER_PLANTED_MARKER"] = marker
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        guard.root, guard.victims, guard.violations = os.path.realpath(run), {os.path.realpath(victim)}, []
        try:
            _check_edited_run(run, victim, tmp)
        finally:
            guard.root = None
            del os.environ["MODELHOPPER_PLANTED_MARKER"]
    assert guard.violations == [], edits
    assert not os.path.exists(marker), f"planted code ran after {edits}"
    assert open(victim).read() == "keep me"
    assert "tests.integration.planted" not in sys.modules
    shutil.rmtree(tmp)


_EXAMPLES = int(os.environ.get("MODELHOPPER_FUZZ_EXAMPLES", "100"))
_fuzz_settings = settings(max_examples=_EXAMPLES, deadline=None, derandomize="MODELHOPPER_FUZZ_EXAMPLES" not in os.environ,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@_fuzz_settings
@given(edits=st.lists(_edits, min_size=1, max_size=3))
def test_fuzz_an_edited_finished_run_never_runs_code_or_leaves_the_run(finished_run, tmp_path_factory, edits):
    _fuzz(finished_run, tmp_path_factory, edits)


@_fuzz_settings
@given(edits=st.lists(_edits, min_size=1, max_size=3))
def test_fuzz_an_edited_crashed_run_never_runs_code_or_leaves_the_run(crashed_run, tmp_path_factory, edits):
    _fuzz(crashed_run, tmp_path_factory, edits)


def test_load_model_builds_with_the_model_fn_a_verified_run_records(finished_run, tmp_path):
    result = framework.Result.open(_copy(finished_run, tmp_path))
    model = result.load_model()  # no model_fn: the signed one the run names (framework.examples:mlp_model_fn)
    assert isinstance(model, torch.nn.Module)
    state = result.load_state(result.best_config_id)["model"]
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_load_model_imports_nothing_a_run_that_does_not_verify_names(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    _sql(run, "UPDATE configs SET config = json_set(config, '$.lr', 5.0) WHERE id = 0")  # a hand edit
    with pytest.warns(UnverifiedRunWarning):
        result = framework.Result.open(run)
    with pytest.raises(ValueError, match="does not verify, so the model_fn it names .* is not imported: pass model_fn="):
        result.load_model(0)
