"""sim_train: the main job without ``ros2 launch`` — gym bridge and trainer as two processes.

    sim_train                       # Pendulum-v1, config/pendulum.yaml
    sim_train --iterations 60
    sim_train --params-file config/inverted_pendulum.yaml
    sim_train --seed 2 --output runs/pendulum_seed2

Each run writes to a folder of its own, ``runs/<params file stem, or --env-id>/
<YYYYmmdd-HHMMSS>-<pid>/`` (``--output`` names one instead), and ``runs/<...>/latest``
links to the newest run once it has written a metrics row or a checkpoint. An
``--output`` that holds a run is resumed from its ``latest.safetensors``, or refused with
one line (the trainer's rule, ``run_folder.restart_plan``), never trained over.

A disk that refuses a file (full, read-only) costs that file, not the run: the trainer
counts its failed checkpoints and metrics rows, and this process logs the learning curve
or ``latest`` link it could not write, each once with its path and error, and still
exits 0 when training succeeded.

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

from unilab_ros.config.paths import config_file
from unilab_ros.rl.checkpoint import Checkpoint, CheckpointError
from unilab_ros.tools.plot import plot_learning_curve
from unilab_ros.trainer.metrics_log import read_metrics
from unilab_ros.trainer.run_folder import LATEST_LINK, new_run_folder, point_latest

RUNS_ROOT = Path("runs")
"""Where runs go without ``--output`` (relative to the working directory)."""


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params-file", type=Path, default=None,
                        help="ROS 2 params file of both nodes (default: the package's "
                             "config/pendulum.yaml)")
    parser.add_argument("--env-id", default=None,
                        help="overrides the params file's env_id (Gymnasium id)")
    parser.add_argument("--iterations", type=int, default=None,
                        help="overrides max_iterations: updates before the run ends")
    parser.add_argument("--output", type=Path, default=None,
                        help="the run folder (checkpoints, metrics.csv, learning curve); "
                             "default: a new one, runs/<params file stem, or env id>/"
                             "<YYYYmmdd-HHMMSS>-<pid>/, with a latest link beside it")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds before giving up (default: %(default)s)")
    parser.add_argument("--domain-id", type=int, default=None,
                        help="ROS_DOMAIN_ID of the nodes' isolated graph (default: 1 + "
                             "pid %% 100)")
    parser.add_argument("--seed", type=int, default=None,
                        help="overrides the seed of both nodes (bridge and trainer)")
    return parser


def output_folder(output: Path | None, task: str) -> tuple[Path, bool]:
    """The run folder, and whether ``latest`` is to point at it once it is written:
    ``output`` as given (a run it holds is the trainer's to resume or refuse), or else a
    new folder under ``RUNS_ROOT/<task>/``."""
    if output is None:
        return new_run_folder(RUNS_ROOT, task, link_latest=False), True
    output = output.resolve()
    output.mkdir(parents=True, exist_ok=True)
    return output, False


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    params_file = args.params_file or config_file("pendulum.yaml")
    # Checked here, each in one line: nodes started on a missing file fail one by one,
    # in a race with each other and with this process's stop.
    if not params_file.is_file():
        return _error(f"params file {params_file} does not exist")
    try:
        output, link = output_folder(args.output, args.env_id or params_file.stem)
    except OSError as error:
        return _error(f"cannot create the run folder: {error}")
    print(f"sim_train: output {output}", flush=True)
    env = isolated_ros_env(args.domain_id)
    trainer_overrides = {"checkpoint_dir": str(output)}
    if args.iterations is not None:
        trainer_overrides["max_iterations"] = str(args.iterations)
    bridge_overrides = {"env_id": args.env_id} if args.env_id else {}
    if args.seed is not None:
        trainer_overrides["seed"] = str(args.seed)
        bridge_overrides["seed"] = str(args.seed)
    bridge = subprocess.Popen(
        node_command("unilab_ros.sims.gym_env_node", params_file, bridge_overrides), env=env,
        preexec_fn=die_with_parent(),
    )
    trainer = subprocess.Popen(
        node_command("unilab_ros.trainer", params_file, trainer_overrides), env=env,
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
            link = link and not _point_latest_once_written(output)
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        stop(trainer, timeout=60.0)
        stop(bridge)
        signal.signal(signal.SIGTERM, previous_handler)
        if link:
            _point_latest_once_written(output)
    elapsed = time.monotonic() - start
    if trainer.returncode != 0:
        print(f"sim_train: trainer exited with code {trainer.returncode}", flush=True)
        return trainer.returncode or 1
    report(output, params_file.stem, elapsed)
    return 0


def report(output: Path, title: str, elapsed: float) -> list[str]:
    """Print the run's summary and write its learning curve; returns the files that could
    not be written, each logged once with its path and error (the run still succeeded)."""
    metrics = read_metrics(output / "metrics.csv") if (output / "metrics.csv").is_file() else {}
    if not metrics:
        print(f"sim_train: stopped after {elapsed:.0f}s with no metrics row in "
              f"{output / 'metrics.csv'} (before the first update, or its disk refused "
              "them)", flush=True)
        return []
    best = best_policy(output / "best.safetensors")
    png = output / "learning_curve.png"
    failed = []
    try:
        plot_learning_curve(metrics, png, title=title, best=best)
    except OSError as error:
        failed.append(_write_failed(png, error))
    final_return = metrics["mean_return"][-1]
    best_line = (
        f"best mean return {best[1]:.1f} at iteration {best[0]}: {output / 'best.safetensors'}"
        if best is not None
        else "best: none saved (fewer finished episodes than best_min_episodes, or the disk "
        "refused it)"
    )
    latest = output / "latest.safetensors"
    print(
        f"sim_train: {int(metrics['iteration'][-1])} iterations, "
        f"{int(metrics['env_steps'][-1])} env steps in {elapsed:.0f}s; final mean return "
        f"{final_return:.1f}\n"
        f"  {best_line}\n"
        f"  final checkpoint: {latest if latest.is_file() else 'none saved (see above)'}\n"
        f"  learning curve: {'not written' if failed else png}"
        + (f"\n  files not written: {len(failed)} ({', '.join(failed)})" if failed else ""),
        flush=True,
    )
    return failed


def _write_failed(path: Path, error: OSError) -> str:
    print(f"sim_train: error: cannot write {path}: {error} (training itself is not "
          "affected)", file=sys.stderr, flush=True)
    return str(path)


def _error(message: str) -> int:
    print(f"sim_train: error: {message}", file=sys.stderr, flush=True)
    return 2


def _point_latest_once_written(output: Path) -> bool:
    """Point ``latest`` at ``output`` if the run wrote a metrics row or a checkpoint; True
    once that was tried (a disk that refuses the link is logged, and not tried again)."""
    if (output / "metrics.csv").is_file() or any(output.glob("*.safetensors")):
        try:
            point_latest(output)
        except OSError as error:
            _write_failed(output.parent / LATEST_LINK, error)
        return True
    return False


def best_policy(path: Path) -> tuple[int, float] | None:
    """(iteration, mean return) of the kept best policy, if the run kept one it can read."""
    try:
        checkpoint = Checkpoint(path)
        return checkpoint.iteration, float(checkpoint.extra["best_mean_return"])
    except (CheckpointError, KeyError, TypeError, ValueError):
        return None


if __name__ == "__main__":
    sys.exit(main())
