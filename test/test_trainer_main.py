"""The trainer's ``main()`` as a subprocess: the shipped YAML files, exit codes, a bad
parameter's one-line reason, the run folder, and memory under huge observations.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import rclpy
from rclpy.executors import SingleThreadedExecutor
from ros_helpers import spin_until
from std_msgs.msg import Float32MultiArray, String
from trainer_harness import PACKAGE_ROOT

from unilab_ros.rl import heap
from unilab_ros.ros.messages import to_float32_msg

pytestmark = pytest.mark.ros


# main(): YAML files and bad parameters, as subprocesses.


def _trainer_command(*ros_args: str) -> list[str]:
    return [sys.executable, "-m", "unilab_ros.trainer", "--ros-args", *ros_args]


def _subprocess_env(ros_domain_env: dict) -> dict:
    return dict(
        ros_domain_env,
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(
            filter(None, [str(PACKAGE_ROOT), ros_domain_env.get("PYTHONPATH")])
        ),
    )


@pytest.mark.parametrize(
    ("yaml_name", "sizes"),
    [
        ("pendulum.yaml", "16 envs x obs 3 -> action 1, rollout 192 steps"),
        ("trainer.yaml", "1 envs x obs 48 -> action 12, rollout 24 steps"),
    ],
)
def test_main_starts_from_the_yaml_and_exits_0_on_sigint(
    ros_domain_env, tmp_path, yaml_name, sizes
):
    command = _trainer_command(
        "--params-file",
        str(PACKAGE_ROOT / "config" / yaml_name),
        "-p",
        f"checkpoint_dir:={tmp_path}",
        "-p",
        "tensorboard:=false",
    )
    with _trainer_process(command, ros_domain_env, tmp_path) as (process, lines):
        _wait_for_lines(process, lines, "ready:", 1)
        ready = [line for line in lines if "ready:" in line]
        assert ready, "".join(lines)
        assert sizes in ready[0]
        # What computes the policy, said at start: device, backend, matmul precision.
        assert "on Device(cpu, 0) (cpu), float32" in ready[0]
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=5.0) == 0, "".join(lines)
    assert "Traceback" not in "".join(lines)


@contextlib.contextmanager
def _trainer_process(command: list[str], ros_domain_env: dict, cwd: Path):
    """The trainer as a subprocess and the list its output lines arrive in; killed on
    the way out if still running."""
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=_subprocess_env(ros_domain_env), cwd=cwd,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
    reader.start()
    try:
        yield process, lines
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(timeout=5.0)


def _wait_for_lines(process: subprocess.Popen, lines: list[str], text: str, count: int) -> None:
    """Until ``count`` lines hold ``text``, the process exits, or 30 s pass."""
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline and process.poll() is None:
        if sum(text in line for line in lines) >= count:
            return
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("argument", "reason"),
    [
        ("num_envs:=-1", "num_envs must be >= 1"),
        ("model.activation:=foo", "activation 'foo' unknown"),
        ("ppo.learning_rate:=1", "'ppo.learning_rate' must be a float"),
        ("update_trigger:=sometimes", "update_trigger must be one of"),
        ("resume_from:=/nonexistent.safetensors", "no checkpoint at"),
        ("model.actor_hidden_dims:=[]", "has no value"),
        ("robot_spec:=walker", "robot_spec 'walker' is neither a file nor a shipped spec "
                               "(cartpole, quadruped, reacher)"),
        ("obs_dim:=7", "obs_dim is 7, but robot spec 'cartpole' makes it 4"),
    ],
)
def test_main_exits_2_with_a_one_line_reason_on_a_bad_parameter(
    ros_domain_env, tmp_path, argument, reason
):
    spec = ("-p", "robot_spec:=cartpole") if argument.startswith("obs_dim") else ()
    result = subprocess.run(
        _trainer_command("-p", argument, *spec, "-p", f"checkpoint_dir:={tmp_path}"),
        capture_output=True,
        text=True,
        timeout=60,
        env=_subprocess_env(ros_domain_env),
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    output = (result.stdout + result.stderr).strip().splitlines()
    assert "Traceback" not in result.stderr
    assert len(output) == 1 and reason in output[0], output


def test_main_says_what_it_waits_for_and_writes_to_a_run_folder_of_its_own(
    ros_domain_env, tmp_path
):
    """No checkpoint_dir: a folder per run under runs/<namespace>/; with no robot, a
    throttled line names the resolved topics it waits on."""
    command = _trainer_command(
        "--params-file", str(PACKAGE_ROOT / "config" / "trainer.yaml"),
        "-r", "__ns:=/robot7", "-p", "warm_up_update:=false", "-p", "tensorboard:=false",
        "-p", "wait_report_period:=0.5",
    )
    with _trainer_process(command, ros_domain_env, tmp_path) as (process, lines):
        _wait_for_lines(process, lines, "waiting for the first observation", 2)
        waiting = [line for line in lines if "waiting for the first observation" in line]
        assert len(waiting) >= 2, "".join(lines)
        for topic in ("observation", "reward", "done"):
            assert f"/robot7/{topic} (0 publishers)" in waiting[0]
        assert "actions go to /robot7/action" in waiting[0]
        # Throttled: one line a period, not one per check.
        assert len(waiting) <= 3, "".join(lines)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=10.0) == 0, "".join(lines)
    runs = tmp_path / "runs" / "robot7"
    folders = [path for path in runs.iterdir() if path.name != "latest"]
    assert len(folders) == 1 and folders[0].name.endswith(f"-{process.pid}")
    # It wrote nothing: latest does not move to an empty folder (here there was none).
    assert not (runs / "latest").exists()
    assert f"output: {folders[0]}" in "".join(lines)
    # The start-up line says what decides the update's speed.
    assert f"heap: {heap.status}; output:" in "".join(lines)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise AssertionError(f"no VmRSS for pid {pid}")


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads RSS from /proc")
def test_huge_observations_are_rejected_without_growing_memory(
    context, ros_domain_env, tmp_path
):
    """Bursts of 10-million-float observations are refused and leave no memory behind:
    the package's Fast DDS profile frees each sample's buffer (rmw_fastrtps' default kept
    one of the largest size per queued sample, +150 MB for good after a burst of four)."""
    command = _trainer_command(
        "--params-file", str(PACKAGE_ROOT / "config" / "trainer.yaml"),
        "-p", f"checkpoint_dir:={tmp_path}", "-p", "tensorboard:=false",
        "-p", "warm_up_update:=false",
    )
    node = rclpy.create_node("huge_probe", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    statuses: list[dict] = []
    node.create_subscription(
        String, "/unilab_trainer/status", lambda msg: statuses.append(json.loads(msg.data)), 10
    )
    publisher = node.create_publisher(Float32MultiArray, "observation", 10)
    huge = to_float32_msg(np.zeros((1, 10_000_000), np.float32), ("env", "obs"))
    message_mb = 10_000_000 * 4 / 2**20

    def rejected() -> int:
        return statuses[-1]["rejected_observations"] if statuses else -1

    with _trainer_process(command, ros_domain_env, tmp_path) as (process, lines):
        _wait_for_lines(process, lines, "ready:", 1)
        assert spin_until(executor, lambda: publisher.get_subscription_count() > 0
                          and rejected() == 0, 30.0), "".join(lines)
        before = _rss_mb(process.pid)
        publisher.publish(huge)
        assert spin_until(executor, lambda: rejected() == 1, 30.0), "".join(lines)
        after_one = _rss_mb(process.pid)
        for _ in range(3):
            publisher.publish(huge)
        assert spin_until(executor, lambda: rejected() == 4, 30.0), "".join(lines)
        after_four = _rss_mb(process.pid)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20.0) == 0, "".join(lines)
    executor.shutdown()
    node.destroy_node()
    assert after_one - before < 0.25 * message_mb, (before, after_one)
    assert after_four - before < 0.25 * message_mb, (before, after_four)
