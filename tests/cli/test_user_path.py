"""The command line as a new user meets it (issue 30): --help shows the defaults, a log
gets plain progress lines, and an error the user can fix is one line with exit 2."""

from __future__ import annotations

import pytest
from loopback_ports import free_port

from fedveil.cli.main import main


def test_simulate_help_shows_the_defaults(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # no line break inside 'fashion-mnist'
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for shown in (
        "[server.rounds, default 60]",
        "[data.num_clients, default 100; digits: 20]",
        "[server.per_round, default 20]",
        "[data.dataset, default fashion-mnist]",
        # The default job's own settings beside the schema's (a bare `fedveil simulate`
        # runs FedAvgM at lr 0.1; --help used to say only fedavg and 0.05).
        "[server.optimizer, default fedavg; fashion-mnist: fedavgm]",
        "[client.lr, default 0.05; fashion-mnist: 0.1]",
        "[model.name, default cnn; digits: mlp; synthetic: mlp]",
    ):
        assert shown in text, shown


def test_progress_in_a_log_is_plain_lines_without_carriage_returns(capsys, tmp_path):
    # stderr captured by pytest is not a terminal, as a log file or CI is not.
    args = ["simulate", "--task", "tiny_task:make", "--rounds", "3", "--per-round", "3"]
    code = main([*args, "--out", str(tmp_path / "run"), "--set", "simulation.workers=1"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "\r" not in err
    lines = [line for line in err.splitlines() if line.startswith("round ")]
    assert [line.split()[1] for line in lines] == ["1/3", "2/3", "3/3"]
    assert all("test_acc" in line for line in lines)


@pytest.mark.procs
def test_an_unreachable_ray_address_is_one_line_and_exit_2(capsys, tmp_path):
    # Used to print a 24-line traceback and exit 1.
    port = free_port()  # nothing listens once closed
    code = main(
        [
            "simulate",
            "--quiet",
            "--task",
            "tiny_task:make",
            "--rounds",
            "1",
            "--transport",
            "flower",
            "--out",
            str(tmp_path / "run"),
            "--set",
            f"simulation.ray_address=127.0.0.1:{port}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert lines[-1].startswith(
        f"fedveil: error: simulation.ray_address = '127.0.0.1:{port}': cannot reach a Ray cluster"
    ), err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "command", "near"),
    [
        (["simulate", "--rouns", "3"], "fedveil simulate", "did you mean --rounds (not --rouns)?"),
        (["simulate", "--per-roud=3"], "fedveil simulate", "did you mean --per-round"),
        (["privacy", "report", "run", "--hepl"], "fedveil privacy report", "did you mean --help"),
    ],
)
def test_an_unknown_flag_is_named_with_its_command_and_the_nearest_option(
    capsys, argv, command, near
):
    # argparse used to print the top-level usage (`fedveil [-h] [-v] ... COMMAND`),
    # naming none of the command's options, and no suggestion.
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{command}: error: unrecognized arguments: "), err
    assert near in err and f"`{command} --help` lists every option" in err
    assert "COMMAND" not in err and "Traceback" not in err


def test_a_typo_in_a_config_key_names_the_key_it_resembles(capsys, tmp_path):
    config = tmp_path / "typo.toml"
    config.write_text("[server]\nrouds = 3\n")
    assert main(["simulate", "--config", str(config), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "unknown key server.rouds in [server]; did you mean server.rounds?" in err, err
    assert not (tmp_path / "r").exists()


def test_ctrl_c_before_the_first_round_says_there_is_nothing_to_resume(capsys, tmp_path):
    # It printed "fedveil: interrupted" alone: no word on what was kept or what to do.
    argv = ["simulate", "--task", "tiny_task:make_interrupted", "--rounds", "3", "--quiet"]
    code = main([*argv, "--out", str(tmp_path / "run"), "--set", "simulation.workers=1"])
    err = capsys.readouterr().err
    assert code == 130, err
    assert "stopped before its first round completed: nothing to resume" in err, err
    assert "--resume" not in err and "Traceback" not in err


def test_a_second_simulate_on_a_run_directory_in_use_is_refused(capsys, tmp_path):
    # A --resume typed while the run still trained (its Ctrl-C had not reached it) went
    # ahead: two processes wrote the same metrics.jsonl and checkpoint, rounds interleaved.
    import fcntl
    import os

    out = tmp_path / "run"
    out.mkdir()
    held = os.open(out / ".lock", os.O_RDWR | os.O_CREAT, 0o600)  # the first run's lock
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    argv = ["simulate", "--task", "tiny_task:make", "--rounds", "1", "--quiet"]
    try:
        code = main([*argv, "--out", str(out), "--set", "simulation.workers=1"])
    finally:
        os.close(held)
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"--out {out}: another fedveil simulate is writing this run directory" in err
    assert not (out / "metrics.jsonl").exists() and "Traceback" not in err
    # Once it has ended, the directory is free again.
    assert main([*argv, "--out", str(out), "--set", "simulation.workers=1"]) == 0
    assert (out / "metrics.jsonl").exists()
