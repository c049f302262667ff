"""`framework.driver.observers`: the progress bar writes status lines, not redraws, to a file or a pipe (a job log);
`RunClock`'s parts add up; and `ensure_ray`'s line beside Ray's token-authentication warning."""

from __future__ import annotations

import io
import os
import tempfile
import time

import pytest

from framework.cluster.ray_start import _readable_by_others, token_auth_notice
from framework.driver.observers import TIME_PARTS, ProgressBar, RunClock


def _bar_lines(text: str) -> list[str]:
    return [line for line in text.split("\n") if line.startswith("model selection:")]


def test_progress_bar_to_a_file_writes_one_last_status_line_and_no_redraws(capsys):
    log = io.StringIO()  # not a terminal
    bar = ProgressBar(True, 40, lambda seconds: f"round board after {seconds:.0f}s", heading="Run directory: /r",
                      file=log, status_every_s=3600)
    for _ in range(30):
        bar.on_unit_end()
    bar.on_round_end(0)
    bar.on_notice("worker 1 lost")
    bar.close()
    text = log.getvalue()
    assert "\r" not in text  # nothing redrawn in place
    assert text.split("\n")[0] == "Run directory: /r"  # the heading comes first, on a line of its own
    assert _bar_lines(text) == [text.split("\n")[1]] and " 30/30 units " in text  # the planned 40 shrank to the 30
    assert capsys.readouterr().out.split("\n")[:2] == ["round board after 0s", "worker 1 lost"]  # still on stdout


def test_progress_bar_to_a_file_writes_at_most_one_status_line_per_interval():
    log, every = io.StringIO(), 0.05
    start = time.monotonic()
    bar = ProgressBar(True, None, lambda seconds: "", file=log, status_every_s=every)
    bar.on_units_opened(12)
    for _ in range(12):
        time.sleep(0.02)
        bar.on_unit_end()
    bar.close()
    elapsed = time.monotonic() - start
    lines = _bar_lines(log.getvalue())
    assert 2 <= len(lines) <= elapsed / every + 1  # throttled, plus the last line
    assert " 12/12 units " in lines[-1]
    everything = io.StringIO()
    bar = ProgressBar(True, 5, lambda seconds: "", file=everything, status_every_s=0.0)
    for _ in range(5):
        bar.on_unit_failed()
    bar.close()
    assert len(_bar_lines(everything.getvalue())) == 6  # interval 0: a line per unit, and the last one


def test_progress_bar_not_shown_writes_nothing(capsys):
    log = io.StringIO()
    bar = ProgressBar(False, 3, lambda seconds: "board", heading="Run directory: /r", file=log)
    bar.on_unit_end()
    bar.on_round_end(0)
    bar.close()
    assert log.getvalue() == "" and "board" not in capsys.readouterr().out


def test_run_clock_parts_are_consecutive_and_add_up():
    start = time.perf_counter()
    clock = RunClock()
    time.sleep(0.02)
    clock.lap("ray")
    clock.lap("set_up")
    clock.on_run_start(None)
    time.sleep(0.01)
    clock.on_unit_end()
    clock.lap("training")
    clock.lap("results")
    wall = time.perf_counter() - start
    split = clock.split()
    measured = {k: v for k, v in split.items() if k in TIME_PARTS and k != "before_run"}
    assert list(measured) == ["ray", "set_up", "workers", "training", "results"]
    assert measured["ray"] >= 0.02 and sum(measured.values()) <= wall + 0.01
    assert split["total"] == pytest.approx(sum(v for k, v in split.items() if k in TIME_PARTS), abs=0.01)
    assert 0.01 <= split["first_unit"] <= measured["training"] + 0.001
    line = clock.line()
    assert line.startswith(f"time: {sum(clock.parts.values()):.1f} s: start-up ") and "Ray " in line
    assert "training " in line and "(first unit " in line and "results " in line


def test_run_clock_rejects_an_unknown_part():
    with pytest.raises(ValueError, match=r"`part` is 'imports', but must be one of"):
        RunClock().lap("imports")


def test_token_auth_notice_only_when_ray_warns_and_names_the_token_and_the_setting(tmp_path):
    assert token_auth_notice("token") is None and token_auth_notice("disabled") is None  # Ray says nothing then
    token = tmp_path / "token"
    token.write_text("x")
    line = token_auth_notice(None, {"RAY_AUTH_TOKEN_PATH": str(token)})
    assert f"the token in {token}," in line and "other users of this machine cannot attach" in line
    assert "set RAY_AUTH_MODE=token to keep it on without the warning" in line and "\n" not in line
    assert "readable by others" not in line  # (pytest's tmp_path is private)
    assert "the token in ~/.ray" not in token_auth_notice(None, {"RAY_AUTH_TOKEN": "x"})
    default = token_auth_notice(None, {})
    assert os.path.join(os.path.expanduser("~"), ".ray", "auth_token") in default


def test_a_token_file_others_can_read_is_named():
    shared = tempfile.mkdtemp(dir="/tmp")  # /tmp lets every user through
    try:
        os.chmod(shared, 0o755)
        path = os.path.join(shared, "auth_token")
        with open(path, "w") as f:
            f.write("x")
        os.chmod(path, 0o644)
        assert _readable_by_others(path)
        assert f"(but {path} is readable by others: chmod 600 it)" in token_auth_notice(
            None, {"RAY_AUTH_TOKEN_PATH": path})
        os.chmod(path, 0o600)
        assert not _readable_by_others(path)
        os.chmod(path, 0o644)
        os.chmod(shared, 0o700)  # a private folder: nobody else gets to the file
        assert not _readable_by_others(path)
    finally:
        os.chmod(shared, 0o700)
        os.remove(os.path.join(shared, "auth_token"))
        os.rmdir(shared)


def test_time_before_the_first_run_is_start_up_only_in_a_young_process(monkeypatch):
    """A process's first run counts the time since the process started, unless that is longer than start-up can be
    (a service that starts a selection an hour later): then the part is left out, not reported as hours."""
    from framework.driver import observers

    monkeypatch.setattr(observers, "_runs_timed", 0)
    monkeypatch.setattr(observers, "BEFORE_RUN_MAX_S", 1e9)
    before = observers._time_before_first_run()
    assert before is not None and before > 0
    assert observers._time_before_first_run() is None  # the second run of a process has no start-up before it
    monkeypatch.setattr(observers, "_runs_timed", 0)
    monkeypatch.setattr(observers, "BEFORE_RUN_MAX_S", before / 2)
    assert observers._time_before_first_run() is None
