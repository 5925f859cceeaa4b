"""sim_train: the main job without ``ros2 launch`` — gym bridge and trainer as two processes.

    sim_train                       # Pendulum-v1, config/pendulum.yaml
    sim_train --iterations 60 --output runs/pendulum
    sim_train --params-file config/inverted_pendulum.yaml --output runs/inverted_pendulum
    sim_train --seed 2 --output runs/pendulum_seed2

Starts ``gym_env_node`` and ``trainer_node`` on an isolated ROS 2 graph (localhost
discovery, a domain id of its own), relays the trainer's progress lines, stops the
bridge when the trainer finishes ``max_iterations``, then writes the learning curve
next to the checkpoints. In a ROS 2 workspace the same run is
``ros2 launch unilab_ros sim_train.launch.py``.

``--seed`` overrides the params file's ``seed`` of both nodes (the bridge seeds env i
with seed + i, the trainer its network and sampling streams), so a run is repeated on
another seed without editing the file (bench/learning.py runs seeds this way).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from unilab_ros.metrics_log import read_metrics
from unilab_ros.paths import config_file
from unilab_ros.plot import plot_learning_curve
from unilab_ros.rl.checkpoint import Checkpoint


def isolated_ros_env(domain_id: int | None = None) -> dict[str, str]:
    """The environment for child nodes: localhost-only discovery and its own domain."""
    env = dict(os.environ)
    env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    env["ROS_DOMAIN_ID"] = str(domain_id if domain_id is not None else 1 + os.getpid() % 100)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def node_command(module: str, params_file: Path, overrides: dict[str, str]) -> list[str]:
    command = [sys.executable, "-m", module, "--ros-args", "--params-file", str(params_file)]
    for name, value in overrides.items():
        command += ["-p", f"{name}:={value}"]
    return command


PR_SET_PDEATHSIG = 1
"""prctl option (linux/prctl.h): the signal a process gets when its parent dies."""


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the child sent SIGTERM (the nodes save and exit on it)
    when this process dies, even by SIGKILL, so no node is left training an orphaned run.
    Linux only: None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    # Loaded here, in the parent: a child between fork and exec must not load libraries.
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before prctl: no signal would come
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def stop(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGINT (the trainer saves on it), then SIGKILL if it does not exit."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params-file", type=Path, default=None)
    parser.add_argument("--env-id", default=None, help="overrides the params file's env_id")
    parser.add_argument("--iterations", type=int, default=None, help="max_iterations")
    parser.add_argument("--output", type=Path, default=Path("runs/pendulum"))
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before giving up")
    parser.add_argument("--domain-id", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None,
                        help="overrides the seed of both nodes (bridge and trainer)")
    args = parser.parse_args(argv)

    params_file = args.params_file or config_file("pendulum.yaml")
    output = args.output.resolve()
    output.mkdir(parents=True, exist_ok=True)
    (output / "metrics.csv").unlink(missing_ok=True)
    env = isolated_ros_env(args.domain_id)
    trainer_overrides = {"checkpoint_dir": str(output)}
    if args.iterations is not None:
        trainer_overrides["max_iterations"] = str(args.iterations)
    bridge_overrides = {"env_id": args.env_id} if args.env_id else {}
    if args.seed is not None:
        trainer_overrides["seed"] = str(args.seed)
        bridge_overrides["seed"] = str(args.seed)
    bridge = subprocess.Popen(
        node_command("unilab_ros.gym_env_node", params_file, bridge_overrides), env=env,
        preexec_fn=die_with_parent(),
    )
    trainer = subprocess.Popen(
        node_command("unilab_ros.trainer_node", params_file, trainer_overrides), env=env,
        preexec_fn=die_with_parent(),
    )
    start = time.monotonic()
    # SIGTERM (systemd, docker stop, a launch system) stops the run as Ctrl-C does: the
    # nodes are stopped and save, rather than left orphaned and training on.
    previous_handler = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        while trainer.poll() is None and bridge.poll() is None:
            if time.monotonic() - start > args.timeout:
                print(f"sim_train: no result after {args.timeout:.0f}s, stopping", flush=True)
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        stop(trainer, timeout=60.0)
        stop(bridge)
        signal.signal(signal.SIGTERM, previous_handler)
    elapsed = time.monotonic() - start
    if trainer.returncode != 0:
        print(f"sim_train: trainer exited with code {trainer.returncode}", flush=True)
        return trainer.returncode or 1
    if not (output / "metrics.csv").is_file():
        print(f"sim_train: stopped after {elapsed:.0f}s, before the first update", flush=True)
        return 0
    metrics = read_metrics(output / "metrics.csv")
    best = best_policy(output / "best.safetensors")
    png = plot_learning_curve(
        metrics, output / "learning_curve.png", title=params_file.stem, best=best
    )
    final_return = metrics["mean_return"][-1]
    best_line = (
        f"best mean return {best[1]:.1f} at iteration {best[0]}: {output / 'best.safetensors'}"
        if best is not None
        else "best: none yet (fewer finished episodes than best_min_episodes)"
    )
    print(
        f"sim_train: {len(metrics['iteration'])} iterations, {int(metrics['env_steps'][-1])} env "
        f"steps in {elapsed:.0f}s; final mean return {final_return:.1f}\n"
        f"  {best_line}\n"
        f"  final checkpoint: {output / 'latest.safetensors'}\n  learning curve: {png}",
        flush=True,
    )
    return 0


def best_policy(path: Path) -> tuple[int, float] | None:
    """(iteration, mean return) of the kept best policy, if the run kept one."""
    if not path.is_file():
        return None
    checkpoint = Checkpoint(path)
    return checkpoint.iteration, float(checkpoint.extra["best_mean_return"])


if __name__ == "__main__":
    sys.exit(main())
