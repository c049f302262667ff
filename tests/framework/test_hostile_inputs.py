"""No traceback on any input: odd arguments, run folders whose names are not UTF-8 or hold control characters, and
catalogs that hold such text are one line on stderr with exit code 2 at the command line (a ValueError naming the
parameter, its value and the rule in the API), and a bad run never hides the runs beside it. Runs are made by hand
with the real catalog (no Ray)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from framework.__main__ import main as cli
from framework.cli import printable
from framework.engine.catalog import SQLiteCatalog
from framework.result import CATALOG_FILE, Result
from framework.run_record import writer_lock
from framework.runs import compare_runs, list_runs, run_status
from tests.framework.test_cli_runs import _one_error_line

HUGE = "99999999999999999999"  # no C long: 20 digits
NOT_UTF8 = "bad\udcff"  # the name os.listdir gives a folder made as b"bad\xff"


def _run_dir(path, metric: str = "valid_loss", config: dict | None = None) -> str:
    """A finished-looking run of three configs (epochs 2, 2 and 1), ranked by valid_loss (min); `config` adds a
    fourth config with one epoch, best of all."""
    os.makedirs(path)
    catalog = SQLiteCatalog(os.path.join(path, CATALOG_FILE))
    catalog.set_meta(metric=metric, mode="min", start_time=0.0)
    curves = {0: [0.5, 0.4], 1: [0.3, 0.2], 2: [0.9]}
    if config is not None:
        curves[3] = [0.01]
    for cid, losses in curves.items():
        catalog.add_config(cid, config if cid == 3 else {"lr": 0.1 * (cid + 1)}, "stopped")
        for e, v in enumerate(losses):
            catalog.add_epoch(cid, e, e, {"valid_loss": v, "valid_accuracy": 1 - v})
        catalog.update_config(cid, epochs=len(losses))
    catalog.close()
    return str(path)


def _parser_refuses(capsys, argv: list[str], *words: str) -> str:
    with pytest.raises(SystemExit) as e:
        cli(argv)
    assert e.value.code == 2
    return _one_error_line(capsys, *words)


@pytest.fixture
def root(tmp_path) -> str:
    """A storage root with a good run beside one whose folder name is not UTF-8 (`bad\\xff`), one whose name holds
    a terminal escape sequence, and one made the way `os.mkdir(b"raw\\xfe\\xff")` makes it."""
    good = _run_dir(tmp_path / "good")
    shutil.copytree(good, str(tmp_path / NOT_UTF8))
    shutil.copytree(good, str(tmp_path / "ctl\x1b[31mred"))
    raw = os.path.join(os.fsencode(str(tmp_path)), b"raw\xfe\xff")
    os.mkdir(raw)
    shutil.copyfile(os.path.join(good, CATALOG_FILE), os.path.join(raw, os.fsencode(CATALOG_FILE)))
    return str(tmp_path)


# ---- printable: the one escape every printed name goes through ---------------------------------------------------
@pytest.mark.parametrize("text, shown", [
    ("run-1 ünï 日本", "run-1 ünï 日本"),  # printable text, non-ASCII included, as it is
    ("bad\udcff", "bad\\xff"),  # a byte that is not UTF-8, as Python keeps it: shown as the byte
    ("raw\udcfe\udcff", "raw\\xfe\\xff"),
    ("a\ud800", "a\\ud800"),  # any other lone surrogate
    ("ctl\x1b[31mred\n", "ctl\\x1b[31mred\\n"),  # control characters: no terminal escape, no second line
    ("rtl\u202e", "rtl\\u202e"),  # a format character that reverses what follows it
    ("C:\\runs", "C:\\runs"),  # backslashes as they are
])
def test_printable_escapes_what_a_terminal_would_not_show(text, shown):
    assert printable(text) == shown
    assert printable(text).isprintable() and printable(text).encode()


# ---- --scope last-N-avg --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scope", [f"last-{HUGE}-avg", "last-" + "9" * 5000 + "-avg"])
def test_scope_with_an_n_beyond_every_epoch_averages_all_of_them(tmp_path, scope):
    result = Result(_run_dir(tmp_path / "run"))
    board, avg = result.get_dataframe(scope=scope), result.get_dataframe(scope="avg")
    assert list(board.config_id) == list(avg.config_id) == [1, 0, 2]
    assert list(board.score) == pytest.approx([0.25, 0.45, 0.9])
    assert result.get_best_result(scope=scope).config_id == 1
    assert list(result.get_dataframe(["valid_loss", "valid_accuracy"], ["min", "max"], scope).config_id) == [1, 0, 2]
    assert compare_runs([result.storage_path], scope=scope).value.tolist() == pytest.approx([0.25])


@pytest.mark.parametrize("scope", ["last-\u00b2-avg", "last-\u0663-avg"])  # str.isdigit takes both
def test_scope_with_an_n_not_in_digits_0_to_9_is_refused(tmp_path, scope):
    result = Result(_run_dir(tmp_path / "run"))
    with pytest.raises(ValueError, match=rf"`scope` is '{scope}', but must be one of .* or 'last-N-avg' with N >= 1 "
                                         r"\(in digits 0-9\)"):
        result.get_best_result(scope=scope)


def test_scope_that_is_not_a_str_is_refused(tmp_path):
    result = Result(_run_dir(tmp_path / "run"))
    with pytest.raises(TypeError, match=r"`scope` is 5, but must be a str: one of \['last', 'all'"):
        result.get_dataframe(scope=5)


def test_show_and_compare_with_a_huge_scope_n_rank_as_avg(tmp_path, capsys):
    run = _run_dir(tmp_path / "run")
    assert cli(["show", run, "--scope", f"last-{HUGE}-avg", "--json"]) == 0
    huge = json.loads(capsys.readouterr().out)["leaderboard"]
    assert cli(["show", run, "--scope", "avg", "--json"]) == 0
    assert huge == json.loads(capsys.readouterr().out)["leaderboard"] and [r["config_id"] for r in huge] == [1, 0, 2]
    assert cli(["compare", run, "--scope", f"last-{HUGE}-avg", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["value"] == pytest.approx(0.25)


def test_show_with_a_scope_n_in_other_digits_is_one_line(tmp_path, capsys):
    assert cli(["show", _run_dir(tmp_path / "run"), "--scope", "last-\u00b2-avg"]) == 2
    _one_error_line(capsys, "`scope` is 'last-\u00b2-avg'", "with N >= 1 (in digits 0-9)")


# ---- seconds, and other numbers argparse takes ---------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["watch", "RUN", "--interval", "inf"], ["watch", "RUN", "--interval", "nan"],
    ["watch", "RUN", "--interval", "1e400"], ["watch", "RUN", "--interval", "-1"],
    ["workers", "RUN", "--add", "1", "--timeout", "inf"], ["pause", "RUN", "--timeout", "infinity"],
    ["stop", "RUN", "0", "--timeout", "nan"], ["resume", "RUN", "--unit-timeout-s", "inf"],
])
def test_seconds_that_are_not_finite_are_refused(argv, capsys):
    _parser_refuses(capsys, argv, f"argument {argv[-2]}: '{argv[-1]}' must be a finite number of seconds > 0")


@pytest.mark.parametrize("argv", [["watch", "RUN", "--interval", "86401"], ["unpause", "RUN", "--timeout", "1e10"],
                                  ["extend", "RUN", "--epochs", "1", "--timeout", "1e300"]])
def test_waits_longer_than_a_day_are_refused(argv, capsys):
    _parser_refuses(capsys, argv, f"'{argv[-1]}' must be at most 86400 seconds")


@pytest.mark.parametrize("value", ["inf", "nan", "-inf", "0", "-2"])
def test_a_checkpoint_interval_that_is_not_finite_and_positive_is_refused(value, capsys):
    _parser_refuses(capsys, ["resume", "RUN", f"--checkpoint={value}"],
                    f"'{value}' must be epoch, unit, off or a finite number of seconds > 0")


def test_a_negative_demo_seed_is_refused_by_the_parser(capsys):
    _parser_refuses(capsys, ["demo", "--seed", "-1"], "argument --seed: '-1' must be >= 0")


def test_an_unknown_argument_with_a_newline_or_a_byte_stays_on_one_line(capsys):
    line = _parser_refuses(capsys, ["status", "RUN", "b\nc\udcff\x1b"], "unrecognized arguments")
    assert "b\\nc\\xff\\x1b" in line


# ---- run folders whose names are not UTF-8, or hold control characters ---------------------------------------------
def test_list_shows_the_runs_beside_a_folder_whose_name_is_not_utf8(root, capsys):
    board = list_runs(root)
    assert sorted(zip(board.path, board.status)) == [
        ("bad\\xff", "unreadable"), ("ctl\\x1b[31mred", "running?"), ("good", "running?"),
        ("raw\\xfe\\xff", "unreadable")]
    errors = dict(zip(board.path, board.error))
    assert "`storage_path` is '" in errors["bad\\xff"] and "bad\\xff', but it holds \\xff, which is not UTF-8 text" \
        in errors["bad\\xff"]
    assert cli(["list", root]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "\x1b" not in out and "\udcff" not in out
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[1:]}
    assert rows == {"bad\\xff": "unreadable", "ctl\\x1b[31mred": "running?", "good": "running?",
                    "raw\\xfe\\xff": "unreadable"}
    assert cli(["list", root, "--json"]) == 0
    assert sorted(r["path"] for r in json.loads(capsys.readouterr().out)) == sorted(rows)


@pytest.mark.parametrize("argv", [
    ["status", "{bad}"], ["show", "{bad}"], ["compare", "{good}", "{bad}"], ["export", "{bad}"], ["resume", "{bad}"],
    ["watch", "{bad}", "--once"], ["workers", "{bad}", "--add", "1"], ["pause", "{bad}"], ["stop", "{bad}", "0"],
    ["dashboard", "{bad}", "--port", "99999999"], ["replay", "{bad}"],
    ["export", "{good}", "--out", "{root}/exported\udcff"], ["replay", "{good}", "--out", "{root}/replayed\udcff"],
])
def test_a_run_folder_whose_name_is_not_utf8_is_one_line(root, capsys, argv):
    paths = {"bad": os.path.join(root, NOT_UTF8), "good": os.path.join(root, "good"), "root": root}
    before = sorted(os.listdir(root))
    assert cli([a.format(**paths) for a in argv]) == 2
    _one_error_line(capsys, "is '", "\\xff', but it holds \\xff, which is not UTF-8 text", "SQLite cannot open")
    assert sorted(os.listdir(root)) == before  # nothing written


def test_status_of_a_run_whose_name_holds_control_characters_prints_them_escaped(root, capsys):
    run = os.path.join(root, "ctl\x1b[31mred")
    assert cli(["status", run]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and f"run:           {printable(run)}" in out.splitlines()
    for argv in (["resume", run], ["export", run, "--out", os.path.join(root, "exp\x1b")]):
        cli(argv)
        out, err = capsys.readouterr()
        assert "\x1b" not in out + err and "ctl\\x1b[31mred" in out + err, argv


def test_the_api_names_a_run_path_that_is_not_utf8(root):
    bad = os.path.join(root, NOT_UTF8)
    rule = r"', but it holds \\xff, which is not UTF-8 text .*, so SQLite cannot open a run's catalog there"
    with pytest.raises(ValueError, match=r"`storage_path` is '.*bad\\xff" + rule):
        run_status(bad)
    with pytest.raises(ValueError, match=r"`storage_path` is '.*bad\\xff" + rule):
        compare_runs([os.path.join(root, "good"), bad])


def test_a_catalog_that_holds_text_that_is_not_utf8_is_one_line_and_hides_no_other_run(tmp_path, capsys):
    _run_dir(tmp_path / "good")
    config = _run_dir(tmp_path / "config", config={"name": "\udcff"})  # JSON's "\udcff" escape, read back
    metric = _run_dir(tmp_path / "metric", metric="valid_\udcff\x1b")
    for argv in (["status", config], ["show", config]):
        assert cli(argv) == 2
        _one_error_line(capsys, "holds text that is not UTF-8 (\\xff: a lone surrogate")
    assert cli(["status", metric]) == 0
    assert "metric:        valid_\\xff\\x1b (min)" in capsys.readouterr().out.splitlines()
    assert cli(["list", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    rows = {line.split()[0]: line.split()[1:3] for line in out.splitlines()[1:]}
    assert err == "" and rows == {"config": ["unreadable", "0"], "good": ["running?", "3"],
                                  "metric": ["running?", "3"]}
    assert "valid_\\xff\\x1b (min)" in out


# ---- steering arguments --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, words", [
    (["add", "{run}", '{{"lr": "\\udcff"}}'], ["`config` is", "its text must be UTF-8", "holds a lone surrogate"]),
    (["add", "{run}", '{{"\\udcff": 1}}'], ["`config` is", "its text must be UTF-8"]),
    (["clone", "{run}", "0", "--set", "\udcff=1"], ["`--set` is", "its text must be UTF-8"]),
    (["clone", "{run}", "0", "--set", 'name="\\udcff"'], ["`--set` is", "its text must be UTF-8"]),
    (["add", "{run}", "[" * 100_000], ["`config` is", "must be a JSON object", "nested too deeply"]),
])
def test_a_config_a_run_could_not_hold_is_refused_before_it_is_sent(tmp_path, capsys, argv, words):
    run = _run_dir(tmp_path / "run")
    with writer_lock(run):  # a running run, as far as commands can tell
        assert cli([a.format(run=run) for a in argv] + ["--timeout", "0.5"]) == 2
    _one_error_line(capsys, *words)


# ---- list --------------------------------------------------------------------------------------------------------
def test_list_searches_a_folder_tree_deeper_than_pythons_recursion_limit(tmp_path, capsys):
    deep = str(tmp_path)
    for _ in range(1100):  # os.makedirs would recurse as deep
        deep = os.path.join(deep, "d")
        os.mkdir(deep)
    try:
        assert cli(["list", str(tmp_path), "--depth", HUGE]) == 0
        assert capsys.readouterr().out.strip() == f"No runs under {tmp_path}"
        shutil.copyfile(os.path.join(_run_dir(tmp_path / "run"), CATALOG_FILE), os.path.join(deep, CATALOG_FILE))
        board = list_runs(str(tmp_path), max_depth=2000)
        assert sorted(board.path) == [os.path.join(*["d"] * 1100), "run"]
        # SQLite opens no path of more than 512 bytes: that run is unreadable, in one line
        assert dict(zip(board.path, board.status))[os.path.join(*["d"] * 1100)] == "unreadable"
        assert cli(["status", deep]) == 2
        _one_error_line(capsys, "cannot be opened: SQLite says unable to open database file")
    finally:  # shutil.rmtree, which cleans tmp_path up, would recurse as deep
        if os.path.exists(os.path.join(deep, CATALOG_FILE)):
            os.remove(os.path.join(deep, CATALOG_FILE))
        while deep != str(tmp_path):
            os.rmdir(deep)
            deep = os.path.dirname(deep)
