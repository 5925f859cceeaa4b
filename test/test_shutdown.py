"""A trainer stopped by SIGTERM or SIGINT mid-training saves what it learned and exits 0."""

import signal
import subprocess
import time
from pathlib import Path

import pytest

from unilab_ros.metrics_log import read_metrics
from unilab_ros.rl.checkpoint import Checkpoint
from unilab_ros.sim_train import node_command, stop

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
        node_command("unilab_ros.gym_env_node", PENDULUM_YAML, {"num_envs": "2"}),
        env=ros_domain_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    trainer = subprocess.Popen(
        node_command("unilab_ros.trainer_node", PENDULUM_YAML, trainer_args),
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
    assert trainer.returncode == 0, output_text.decode(errors="replace")[-2000:]
    checkpoint = Checkpoint(output / "latest.safetensors")
    assert checkpoint.iteration >= 2
    assert checkpoint.extra["reason"] == "shutdown"
    assert sorted(p.name for p in output.glob("*.tmp*")) == [], "no temporary file left"


def test_sigterm_without_training_exits_0_and_writes_nothing(tmp_path, ros_domain_env):
    output = tmp_path / "idle"
    trainer = subprocess.Popen(
        node_command("unilab_ros.trainer_node", PENDULUM_YAML, {"checkpoint_dir": str(output)}),
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
