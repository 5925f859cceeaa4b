"""A trainer stopped by SIGTERM or SIGINT mid-training saves what it learned and exits 0."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from unilab_ros.rl.checkpoint import Checkpoint
from unilab_ros.tools.sim_train import node_command, stop
from unilab_ros.trainer.metrics_log import read_metrics

PENDULUM_YAML = Path(__file__).resolve().parents[1] / "config" / "pendulum.yaml"
SMALL = {
    "num_envs": "2",
    "num_steps": "8",
    "ppo.num_mini_batches": "2",
    "ppo.num_learning_epochs": "1",
    "checkpoint_interval": "0",
    "tensorboard": "false",
}

pytestmark = pytest.mark.ros


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_saves_the_training_and_exits_0(tmp_path, ros_domain_env, sig):
    output = tmp_path / "run"
    trainer_args = {**SMALL, "checkpoint_dir": str(output)}
    bridge = subprocess.Popen(
        node_command("unilab_ros.sims.gym_env_node", PENDULUM_YAML, {"num_envs": "2"}),
        env=ros_domain_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    trainer = subprocess.Popen(
        node_command("unilab_ros.trainer", PENDULUM_YAML, trainer_args),
        env=ros_domain_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120.0
        csv_path = output / "metrics.csv"
        while time.monotonic() < deadline and trainer.poll() is None:
            if csv_path.exists() and len(read_metrics(csv_path).get("iteration", [])) >= 2:
                break
            time.sleep(0.2)
        assert trainer.poll() is None, "the trainer exited early"
        assert not (output / "latest.safetensors").exists(), "no interval checkpoints here"
        trainer.send_signal(sig)
        output_text, _ = trainer.communicate(timeout=30.0)
    finally:
        stop(trainer)
        stop(bridge)
    text = output_text.decode(errors="replace")
    assert trainer.returncode == 0, text[-2000:]
    # Callbacks the executor still runs after the signal must not publish into the dead
    # context (a FATAL and a traceback), nor log to /rosout.
    for symptom in ("FATAL", "Traceback", "context is invalid"):
        assert symptom not in text, text[-2000:]
    checkpoint = Checkpoint(output / "latest.safetensors")
    assert checkpoint.iteration >= 2
    assert checkpoint.extra["reason"] == "shutdown"
    assert sorted(p.name for p in output.glob("*.tmp*")) == [], "no temporary file left"


def test_sigterm_without_training_exits_0_and_writes_nothing(tmp_path, ros_domain_env):
    output = tmp_path / "idle"
    trainer = subprocess.Popen(
        node_command("unilab_ros.trainer", PENDULUM_YAML, {"checkpoint_dir": str(output)}),
        env=ros_domain_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60.0
        lines = b""
        while time.monotonic() < deadline and b"ready:" not in lines:
            lines += trainer.stdout.readline()
        trainer.send_signal(signal.SIGTERM)
        trainer.communicate(timeout=30.0)
    finally:
        stop(trainer)
    assert trainer.returncode == 0
    assert not list(output.glob("*.safetensors"))


@pytest.mark.parametrize("module", ["trainer", "deploy.policy_node", "sims.gym_env_node"])
@pytest.mark.parametrize("content", [None, "a: [b\n"], ids=["missing", "malformed"])
def test_a_bad_params_file_exits_2_with_a_reason_not_a_traceback(
    ros_domain_env, tmp_path, module, content
):
    params_file = tmp_path / "params.yaml"
    if content is not None:
        params_file.write_text(content)
    result = subprocess.run(
        [sys.executable, "-m", f"unilab_ros.{module}", "--ros-args", "--params-file",
         str(params_file)],
        capture_output=True, text=True, timeout=60, env=ros_domain_env, cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    fatal = [line for line in result.stderr.splitlines() if "[FATAL]" in line]
    assert len(fatal) == 1 and "params file" in fatal[0] and str(params_file) in fatal[0]


def test_sigterm_stops_sim_train_and_both_nodes_and_keeps_the_training(
    ros_domain_env, tmp_path
):
    output = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "unilab_ros.tools.sim_train", "--iterations", "1000", "--output",
         str(output), "--domain-id", ros_domain_env["ROS_DOMAIN_ID"]],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ros_domain_env, cwd=tmp_path,
    )
    children: list[int] = []
    try:
        deadline = time.monotonic() + 120.0
        while time.monotonic() < deadline and not _rows(output / "metrics.csv") >= 2:
            time.sleep(0.2)
        assert _rows(output / "metrics.csv") >= 2, "training did not start"
        children += _children(process.pid)
        assert len(children) == 2
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=90.0) == 0
        assert not [pid for pid in children if Path(f"/proc/{pid}").exists()], "orphans"
        assert Checkpoint(output / "latest.safetensors").iteration >= 2
    finally:
        _kill(process, children)


def test_the_nodes_of_a_killed_sim_train_stop(ros_domain_env, tmp_path):
    """SIGKILL leaves sim_train no chance to stop its nodes: they must stop themselves."""
    process = subprocess.Popen(
        [sys.executable, "-m", "unilab_ros.tools.sim_train", "--iterations", "1000", "--output",
         str(tmp_path / "run"), "--domain-id", ros_domain_env["ROS_DOMAIN_ID"]],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ros_domain_env, cwd=tmp_path,
    )
    children: list[int] = []
    try:
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline and len(children) < 2:
            time.sleep(0.2)
            children = _children(process.pid)
        assert len(children) == 2, "sim_train did not start its nodes"
        time.sleep(3.0)  # into their start-up, past the imports
        process.kill()
        process.wait()
        deadline = time.monotonic() + 15.0
        while time.monotonic() < deadline and [pid for pid in children if _running(pid)]:
            time.sleep(0.2)
        assert not [pid for pid in children if _running(pid)], "the nodes outlived sim_train"
    finally:
        _kill(process, children)


def _kill(process: subprocess.Popen[bytes], children: list[int]) -> None:
    """SIGKILL whatever a test left running of sim_train and its nodes."""
    for pid in [process.pid, *children]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _rows(csv_path: Path) -> int:
    return len(read_metrics(csv_path)["iteration"]) if csv_path.is_file() else 0


def _children(pid: int) -> list[int]:
    """Pids of the processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found
