"""No traceback on any input: odd arguments, run folders whose names are not UTF-8 or hold control characters, and
catalogs that hold such text are one line on stderr with exit code 2 at the command line (a ValueError naming the
parameter, its value and the rule in the API), and a bad run never hides the runs beside it; a request the dashboard
cannot read is a one-line 400 or 401. Runs are made by hand with the real catalog (no Ray)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket

import pytest

from framework.__main__ import main as cli
from framework.dashboard import MAX_BODY_DEPTH, serve
from framework.result import CATALOG_FILE, Result
from framework.runs import compare_runs, list_runs, run_status
from framework.store.catalog import SQLiteCatalog, _config_row
from framework.store.lock import writer_lock
from framework.text import printable
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
        if cid == 3:  # as another writer may leave it: the catalog itself refuses text that is not UTF-8
            with catalog._tx():
                catalog._insert("configs", {**_config_row(3, {}, "stopped", None, 0), "config": json.dumps(config)})
        else:
            catalog.add_config(cid, {"lr": 0.1 * (cid + 1)}, "stopped")
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


# ---- the dashboard -------------------------------------------------------------------------------------------------
def _http(port: int, head: bytes, body: bytes = b"") -> tuple[int, str]:
    """(status, body) of one raw HTTP/1.1 request to 127.0.0.1:`port`: `head` is its request line and headers as
    bytes (any bytes, UTF-8 or not); Host, Content-Length and Connection are added."""
    request = head + b"\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(request)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2].decode("utf-8", "replace")


def _post(body: bytes, header: bytes = b"") -> tuple[bytes, bytes]:
    """A command's request: (head, `body`); `header` follows the Content-Type header (`; charset=...` extends it)."""
    return b"POST /api/command HTTP/1.1\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json" + header, body


def _nested(depth: int) -> bytes:
    """An `add_config` body whose config nests lists so that the whole body is `depth` levels deep."""
    inner = depth - 2  # the body's object and the args' object
    return b'{"name": "add_config", "args": {"config": ' + b"[" * inner + b"]" * inner + b"}}"


P = pytest.param


@pytest.mark.parametrize("head, body, status, words", [
    # a token that is not UTF-8, in the header or the query: as no token (it was a 500 and a traceback)
    P(b"GET /api/status HTTP/1.1\r\nAuthorization: Bearer \xff\xfe", b"", 401,
      ["the token given is not UTF-8 text", "needs its token"], id="bearer-not-utf8"),
    P(b"GET /api/status?token=%ff%fe HTTP/1.1", b"", 401, ["needs its token"], id="query-token-not-utf8"),
    # a request line or header aiohttp cannot parse: its own 400, and one line at debug level
    P(b"GET /api/status?token=\xff HTTP/1.1", b"", 400, ["Invalid char in url query"], id="raw-byte-in-url"),
    P(b"GET /api/status HTTP/1.1\r\nAuthorization: Bearer {token}\r\nX-\xff: 1", b"", 400, ["Invalid header"],
      id="header-name-not-a-token"),
    P(b"GET /api/status HTTP/1.1\r\nAuthorization: Bearer {token}\r\nX-Big: " + b"a" * 10_000, b"", 400,
      ["Got more than"], id="header-too-long"),
    P(b"\x16\x03\x01\x02\x00", b"", 400, ["HTTPS traffic"], id="tls-hello"),
    # a header that is not UTF-8, whichever it is
    P(b"GET /api/status HTTP/1.1\r\nAuthorization: Bearer {token}\r\nX-Name: r\xe9sum\xe9", b"", 400,
      ["the header 'X-Name' is not UTF-8 text"], id="header-not-utf8"),
    P(*_post(b'{"name": "pause"}', b"\r\nOrigin: http://\xff"), 400, ["the header 'Origin' is not UTF-8 text"],
      id="origin-not-utf8"),
    # bodies: not UTF-8, an unknown charset (JSON is UTF-8: it is read as such), not JSON, not standard JSON, too
    # deep (900 was a 500 RecursionError and about 3,000 lines of traceback), too long
    P(*_post(b'{"name": "\xff"}'), 400, ["the body must be JSON, in UTF-8, but byte 10 is not UTF-8"],
      id="body-not-utf8"),
    P(*_post(b'{"name": 5}', b"; charset=bogus"), 400, ["`name` is 5"], id="unknown-charset"),
    P(*_post(b"{not json"), 400, ["the body must be JSON: Expecting property name"], id="not-json"),
    P(*_post(b'{"name": "pause", "args": {"x": NaN}}'), 400, ["the body must be JSON: NaN is not JSON"], id="nan"),
    P(*_post(b'{"name": "pause", "args": {"x": 1e400}}'), 400, ["1e400 is out of a float's range"], id="1e400"),
    P(*_post(b'{"name": "pause", "args": {"x": ' + b"9" * 5000 + b"}}"), 400, ["the body must be JSON: Exceeds"],
      id="int-of-5000-digits"),
    P(*_post(_nested(900)), 400, ["the body is nested 900 levels deep, but must be JSON nested at most 32"],
      id="nested-900"),
    P(*_post(_nested(30_000)), 400, ["the body is nested 30000 levels deep"], id="nested-30000"),
    P(*_post(_nested(MAX_BODY_DEPTH + 1)), 400, [f"nested {MAX_BODY_DEPTH + 1} levels deep"], id="nested-33"),
    P(*_post(b"[" * 70_000), 413, ["Maximum request body size"], id="body-too-long"),
])
def test_the_dashboard_answers_what_it_cannot_read_in_one_line_and_logs_no_traceback(tmp_path, caplog, capfd, head,
                                                                                      body, status, words):
    run = _run_dir(tmp_path / "run")
    caplog.set_level(logging.DEBUG)  # every record, aiohttp's included
    with serve(run) as board:
        got, text = _http(board.port, head.replace(b"{token}", board.token.encode()), body)
    assert got == status and all(w in text for w in words), text
    if text.startswith("{"):  # the dashboard's own answer: one line
        assert "\n" not in json.loads(text)["error"]
    out, err = capfd.readouterr()
    assert "Traceback" not in caplog.text + out + err, caplog.text + err
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING], caplog.text


def test_a_body_nested_at_most_max_body_depth_is_read(tmp_path):
    """Read, and refused by the check of its arguments after (`timeout` is the sender's): no command is sent."""
    run = _run_dir(tmp_path / "run")
    inner = MAX_BODY_DEPTH - 2
    nested = b'{"name": "pause", "args": {"timeout": ' + b"[" * inner + b"]" * inner + b"}}"
    quoted = b'{"name": "pause", "args": {"timeout": "' + b"[{" * 1000 + b'\\""}}'  # brackets in a string
    with serve(run) as board:
        for body in (nested, quoted):
            got, text = _http(board.port, _post(body)[0].replace(b"{token}", board.token.encode()), body)
            assert got == 400 and "`args` names ['timeout'], which cannot be a command's arguments" in text, text


# ---- numbers no float or int64 holds, config values a run could not record, a stopper that raises ------------------
def _returns_a_set(config):
    return {1, 2}


def _returns_a_tensor(config):
    import torch

    return torch.ones(3)


def _returns_bytes(config):
    return b"\x00\xff"


def _returns_nan(config):
    return float("nan")


def _returns_10_to_the_400(config):
    return 10**400


def _draw(fn):
    """RandomSearch's first draw of a space whose `x` is `sample_from(fn)`."""
    import automl

    return lambda: automl.RandomSearch({"lr": [0.1], "x": automl.sample_from(fn)}, num_samples=1, epochs=1).step([])


def _hostile_numbers():
    import automl
    from framework.options import RunOptions
    from framework.stoppers import TimeoutStopper

    return [
        P(lambda: TimeoutStopper(10**400), ValueError, "TimeoutStopper: `timeout` is 1.00000e+400 (an int), but must "
          "be a finite number of seconds > 0", id="TimeoutStopper(10**400)"),
        P(lambda: RunOptions(stop={"valid_acc": 10**400}, metric="valid_acc", mode="max"), ValueError,
          "`stop['valid_acc']` is 1.00000e+400 (an int), but must be a finite number", id="stop={m: 10**400}"),
        P(lambda: automl.uniform(0, 10**400), ValueError, "`hi` is 1.00000e+400 (an int), but must be a finite real "
          "number", id="uniform(0, 10**400)"),
        P(lambda: automl.randint(0, 2**70), ValueError, "`hi` is 1.18059e+21 (an int), but must be an int in "
          "[-2**63, 2**63 - 1]", id="randint(0, 2**70)"),
        P(lambda: automl.quniform(0, 1, 1e-300), ValueError, "`q` is 1e-300, but [`lo`, `hi`] = [0, 1] reaches its "
          "multiple k * q for k = 1.00000e+300 (an int), and |k| must be <= 2**53", id="quniform(0, 1, 1e-300)"),
        P(lambda: automl.BOHB({"lr": automl.uniform(0, 1)}, max_epochs=2**70), ValueError,
          "`max_epochs` is 1.18059e+21 (an int), but must be <= 9223372036854775807", id="BOHB(max_epochs=2**70)"),
        P(_draw(_returns_a_set), TypeError, "`space['x']` is {1, 2}, a set, but a config holds JSON values only",
          id="sample_from-set"),
        P(_draw(_returns_a_tensor), TypeError, "`space['x']` is a torch.Tensor of shape (3,)", id="sample_from-tensor"),
        P(_draw(_returns_bytes), TypeError, "`space['x']` is b'\\x00\\xff', a bytes", id="sample_from-bytes"),
        P(_draw(_returns_nan), ValueError, "`space['x']` is nan, but a float in a config must be finite",
          id="sample_from-nan"),
        P(_draw(_returns_10_to_the_400), ValueError, "`space['x']` is 1.00000e+400 (an int), but an int in a config "
          "must be in [-2**63, 2**63 - 1]", id="sample_from-10**400"),
    ]


@pytest.mark.parametrize("build, error, words", _hostile_numbers())
def test_numbers_and_config_values_a_run_could_not_hold_are_one_line_before_any_work(capfd, build, error, words):
    with pytest.raises(error) as e:
        build()
    line = str(e.value)
    assert line.startswith(words) and "\n" not in line and len(line) < 400, line
    assert e.value.__cause__ is None and (e.value.__suppress_context__ or e.value.__context__ is None)  # no chain
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err


def test_a_stopper_that_raises_is_one_line_and_its_traceback_stays_in_the_run(capfd):
    from tests.framework.test_stoppers import FunctionStopper, _events, _failing_run, divides_by_zero_after_epoch_one

    driver, notices = _failing_run(FunctionStopper(divides_by_zero_after_epoch_one))
    assert driver.run() is True
    [line] = [n for n in notices.lines if "stopper" in n]
    assert "\n" not in line and line.startswith("the run stops: the stopper failed: FunctionStopper("
                                                "divides_by_zero_after_epoch_one) raised ZeroDivisionError")
    [failed] = _events(driver.run_state.log, "stopper_failed")
    assert "Traceback" in failed["traceback"]
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err
