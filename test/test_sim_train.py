"""sim_train's command line: help for every argument, one-line errors, a folder per run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from unilab_ros import sim_train


def test_every_argument_has_help():
    parser = sim_train.build_parser()
    actions = [a for a in parser._actions if a.option_strings != ["-h", "--help"]]
    assert {a.dest for a in actions} >= {"params_file", "output", "domain_id", "timeout", "seed"}
    assert not [a.dest for a in actions if not a.help]


def test_a_missing_params_file_is_exit_2_with_one_line(tmp_path):
    missing = tmp_path / "missing.yaml"
    for _ in range(3):
        result = subprocess.run(
            [sys.executable, "-m", "unilab_ros.sim_train", "--params-file", str(missing)],
            capture_output=True, text=True, timeout=60, cwd=tmp_path,
        )
        assert result.returncode == 2
        assert result.stderr.splitlines() == [
            f"sim_train: error: params file {missing} does not exist"
        ]
    assert not (tmp_path / "runs").exists()  # no run folder for a run that never started


def test_each_run_gets_a_folder_per_task_and_latest_follows_written_runs(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    written, _ = sim_train.output_folder(None, "pendulum")
    other, _ = sim_train.output_folder(None, "inverted_pendulum")
    assert written.parent == tmp_path / "runs" / "pendulum"
    assert other.parent == tmp_path / "runs" / "inverted_pendulum"
    assert written.name.endswith(f"-{os.getpid()}")
    assert not sim_train._point_latest_once_written(written)
    assert not (written.parent / "latest").exists()
    (written / "metrics.csv").write_text("iteration\r\n1\r\n")
    assert sim_train._point_latest_once_written(written)
    assert (written.parent / "latest").resolve() == written.resolve()
    given, link = sim_train.output_folder(tmp_path / "mine", "pendulum")
    assert given == tmp_path / "mine" and not link


@pytest.mark.ros
def test_a_short_run_writes_to_its_own_folder_and_links_it(ros_domain_env, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "unilab_ros.sim_train", "--iterations", "1", "--domain-id",
         ros_domain_env["ROS_DOMAIN_ID"], "--timeout", "240"],
        capture_output=True, text=True, timeout=300, env=ros_domain_env, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    [run] = [p for p in (tmp_path / "runs" / "pendulum").iterdir() if p.name != "latest"]
    assert (tmp_path / "runs" / "pendulum" / "latest").resolve() == run
    assert (run / "metrics.csv").is_file() and (run / "latest.safetensors").is_file()
