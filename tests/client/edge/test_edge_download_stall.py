"""`fedveil client --download-stall-seconds S` (EdgeOptions.task_pull_stall_s): how long a
device waits on a message download that has gone silent before it gives the message up.
Before, a constant 60 s. The default is unchanged; a NaN, an infinity, zero, a negative
or a limit past Flower's own two hours is refused by name before anything is loaded.
(The give-up itself at the device's limit: test_edge_given_up_message.py.)"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fedveil.cli.main import main
from fedveil.client.edge.edge import TASK_PULL_STALL_S, EdgeOptions


def _client(state: Path, *extra: str) -> int:
    argv = ["client", "--server", "127.0.0.1:9092", "--client-id", "0", "--insecure"]
    return main([*argv, "--task", "tiny_task:make", "--state-dir", str(state), *extra])


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1", "7200.5"])
def test_a_stall_limit_out_of_range_is_refused_naming_it(tmp_path, capsys, value):
    assert _client(tmp_path / "state", f"--download-stall-seconds={value}") == 2
    err = capsys.readouterr().err
    expected = f"--download-stall-seconds {float(value)!r}: must be a number in (0, 7200]"
    assert expected in err, err
    assert not (tmp_path / "state").exists()  # refused before anything was written


@pytest.mark.parametrize("value", [math.nan, 0.0, True])
def test_edge_options_refuse_a_bad_stall_limit_whoever_builds_them(tmp_path, value):
    opts = EdgeOptions("127.0.0.1:9092", 0, tmp_path, insecure=True, task_pull_stall_s=value)
    with pytest.raises(ValueError, match=r"^--download-stall-seconds "):
        opts.check()


def test_the_default_is_unchanged_and_the_help_says_it(capsys):
    assert EdgeOptions("127.0.0.1:9092", 0, Path(".")).task_pull_stall_s == 60.0
    assert TASK_PULL_STALL_S == 60.0
    with pytest.raises(SystemExit):
        main(["client", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--download-stall-seconds S give a message up when nothing of its download" in text
    assert "In (0, 7200] [60]" in text
