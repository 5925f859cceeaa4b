"""obs -> action latency of the trainer through ROS 2, against an echo node; e2e env-steps/s.

The bench process plays the environment of the topic contract for one robot (obs 48,
action 12): it publishes the first ``observation`` alone (again every 0.25 s until an
action comes back), then per step ``reward``, ``done`` and the next ``observation``, and
waits for the ``action``. A step's latency runs from just before the observation is
published (the last of the three) to the action callback (``time.perf_counter``). The
driver, the echo and the nodes all spin the executor ``unilab_ros.ros.executors`` picks (rclpy's
EventsExecutor where rclpy has one; ``UNILAB_EXECUTOR=single`` for the classic one), so
the echo's figures are the ROS + Python overhead the trainer pays too.

Three responders run as processes of their own, each under a namespace on one isolated
graph (localhost discovery, a domain id of the run's own), and are driven in interleaved
blocks so that load from other work on the machine hits them alike:

- ``echo``: a minimal rclpy node (``act_latency.py --echo``) that pairs the three parts
  like the trainer and answers with 12 floats, without a policy: ROS + Python overhead;
- ``act``: ``trainer_node`` with ``training:=false``, the acting path a robot sees
  between updates (actor [512, 256, 128] sampling on 1 x 48): the headline figures;
- ``train``: ``trainer_node`` learning (``num_steps`` per rollout). During an update it
  publishes the safe action (all zeros here) once; the step after it waits for the
  update. Those two steps per update are reported apart from the ordinary steps.

Then end to end: ``gym_env_node`` (Pendulum-v1, 16 envs) and ``trainer_node`` with
config/pendulum.yaml for ``--e2e-iterations``; env-steps/s come from the trainer's
metrics.csv (env steps = vector steps x 16) over the iterations after the first
(collection plus PPO update; the first also holds start-up and discovery).

The last line reads ``act_latency p50_delta_ms=<x> p99_ms=<y> echo_p50_ms=<z>
e2e_env_steps_per_s=<w>``: the acting trainer's p50 minus the echo's, and its p99.
Targets: p50_delta_ms <= 0.3, p99_ms <= 2.
"""

from __future__ import annotations

import argparse
import array
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import rclpy
from rclpy.executors import Executor, ExternalShutdownException
from rclpy.node import Node
from rclpy.utilities import remove_ros_args
from results_page import FLAG_HELP, recording
from std_msgs.msg import Float32MultiArray, String, UInt8MultiArray

from unilab_ros.ros.executors import make_executor, spin
from unilab_ros.tools.sim_train import isolated_ros_env, node_command, stop
from unilab_ros.trainer.metrics_log import read_metrics

REPO = Path(__file__).resolve().parents[1]

OBS_DIM = 48
ACTION_DIM = 12
HIDDEN = "[512,256,128]"
TARGET_P50_DELTA_MS = 0.3
TARGET_P99_MS = 2.0
REPUBLISH_PERIOD = 0.25
TRAINER_STATUS_KEYS = (
    "steps_completed",
    "steps_dropped",
    "stale_messages",
    "duplicate_messages",
    "discarded_during_update",
    "watchdog_trips",
    "safe_actions_published",
)


class BenchError(RuntimeError):
    """The run cannot produce its figures (a responder died or stopped answering)."""


# The echo responder (its own process).


class EchoNode(Node):
    """Pairs observation, reward and done like the trainer; answers with the first 12 floats.

    An observation bit-identical to the one last answered is a re-published first
    observation, and is ignored, as the trainer does.
    """

    def __init__(self) -> None:
        super().__init__("act_latency_echo")
        self._action_pub = self.create_publisher(Float32MultiArray, "action", 10)
        self.create_subscription(Float32MultiArray, "observation", self._on_observation, 10)
        self.create_subscription(Float32MultiArray, "reward", self._on_part("reward"), 10)
        self.create_subscription(UInt8MultiArray, "done", self._on_part("done"), 10)
        self._answered: np.ndarray | None = None
        self._observation: np.ndarray | None = None
        self._parts: set[str] = set()

    def _on_part(self, name: str) -> Callable[[Any], None]:
        def callback(_msg: Any) -> None:
            self._parts.add(name)
            self._answer_when_complete()

        return callback

    def _on_observation(self, msg: Float32MultiArray) -> None:
        observation = np.frombuffer(msg.data, np.float32)
        if self._answered is not None and np.array_equal(observation, self._answered):
            return
        self._observation = observation
        self._answer_when_complete()

    def _answer_when_complete(self) -> None:
        first_step = self._answered is None
        if self._observation is None or not (first_step or len(self._parts) == 2):
            return
        action = Float32MultiArray()
        action.data = array.array("f", self._observation[:ACTION_DIM].tobytes())
        self._action_pub.publish(action)
        self._answered, self._observation = self._observation, None
        self._parts.clear()


def run_echo(ros_args: list[str]) -> None:
    rclpy.init(args=ros_args)
    node = EchoNode()
    try:
        executor = make_executor()[0]
        executor.add_node(node)
        spin(executor)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()


# The driver (the bench process).


@dataclass
class Responder:
    """One process answering on ``/<name>/action``, and what the driver measured of it."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    pubs: dict[str, Any] = field(default_factory=dict)
    waiting: bool = False
    arrival: float | None = None
    action: np.ndarray | None = None
    last_safe: bool = False
    stray_actions: int = 0
    status: dict[str, Any] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    safe: list[bool] = field(default_factory=list)

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise BenchError(
                f"{self.name} exited with code {self.process.returncode}; "
                f"log tail:\n{_tail(self.log)}"
            )


class Driver(Node):
    """Plays the environment for every responder; measures obs -> action latency."""

    def __init__(self, responders: list[Responder], seed: int, executor: Executor) -> None:
        super().__init__("act_latency_driver")
        self._spinner = executor
        self._spinner.add_node(self)
        self._rng = np.random.default_rng(seed)
        for responder in responders:
            ns = f"/{responder.name}"
            responder.pubs = {
                "reward": self.create_publisher(Float32MultiArray, f"{ns}/reward", 10),
                "done": self.create_publisher(UInt8MultiArray, f"{ns}/done", 10),
                "observation": self.create_publisher(Float32MultiArray, f"{ns}/observation", 10),
            }
            self.create_subscription(
                Float32MultiArray, f"{ns}/action", self._on_action(responder), 10
            )
            self.create_subscription(
                String, f"{ns}/unilab_trainer/status", self._on_status(responder), 10
            )

    @staticmethod
    def _on_action(responder: Responder) -> Callable[[Float32MultiArray], None]:
        def callback(msg: Float32MultiArray) -> None:
            arrival = time.perf_counter()
            if not responder.waiting:
                responder.stray_actions += 1
                return
            responder.arrival, responder.waiting = arrival, False
            responder.action = np.frombuffer(msg.data, np.float32)

        return callback

    @staticmethod
    def _on_status(responder: Responder) -> Callable[[String], None]:
        def callback(msg: String) -> None:
            responder.status = json.loads(msg.data)

        return callback

    def _observation_msg(self) -> Float32MultiArray:
        # Every observation differs: the trainer drops a bit-identical one as a duplicate.
        msg = Float32MultiArray()
        values = self._rng.standard_normal(OBS_DIM, dtype=np.float32)
        msg.data = array.array("f", values.tobytes())
        return msg

    def connect(self, responder: Responder, timeout: float) -> None:
        """The first observation alone, re-published until the first action."""
        first = self._observation_msg()
        responder.waiting = True
        deadline = time.monotonic() + timeout
        while responder.waiting:
            responder.check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"no first action from {responder.name} within {timeout:.0f}s")
            responder.pubs["observation"].publish(first)
            self._spin_until_answered(responder, time.monotonic() + REPUBLISH_PERIOD)

    def step(self, responder: Responder, timeout: float) -> float:
        """One step: reward, done, observation; returns the latency in seconds."""
        reward = Float32MultiArray()
        reward.data = array.array("f", [float(self._rng.standard_normal())])
        done = UInt8MultiArray()
        done.data = bytes(1)
        observation = self._observation_msg()
        responder.arrival, responder.waiting = None, True
        responder.pubs["reward"].publish(reward)
        responder.pubs["done"].publish(done)
        start = time.perf_counter()
        responder.pubs["observation"].publish(observation)
        if not self._spin_until_answered(responder, time.monotonic() + timeout):
            responder.check_alive()
            raise BenchError(f"no action from {responder.name} within {timeout:.0f}s")
        assert responder.arrival is not None
        return responder.arrival - start

    def _spin_until_answered(self, responder: Responder, deadline: float) -> bool:
        while responder.waiting:
            start = time.monotonic()
            if start >= deadline:
                return False
            self._spinner.spin_once(timeout_sec=min(deadline - start, 1.0))
            if responder.waiting and time.monotonic() - start >= 1.0:
                responder.check_alive()
        return True

    def spin_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0.0:
            self._spinner.spin_once(timeout_sec=remaining)


def run_block(driver: Driver, responder: Responder, steps: int, timeout: float,
              record: bool) -> None:
    """``steps`` steps; a block never ends on a safe action (the update's pause follows it)."""
    done = 0
    while done < steps or responder.last_safe:
        latency = driver.step(responder, timeout)
        responder.last_safe = responder.action is not None and not responder.action.any()
        if record:
            responder.latencies.append(latency)
            responder.safe.append(responder.last_safe)
        done += 1


def trainer_command(name: str, folder: Path, training: bool, num_steps: int) -> list[str]:
    params = {
        "num_envs": "1",
        "obs_dim": str(OBS_DIM),
        "action_dim": str(ACTION_DIM),
        "model.actor_hidden_dims": HIDDEN,
        "model.critic_hidden_dims": HIDDEN,
        "num_steps": str(num_steps),
        "training": str(training).lower(),
        "checkpoint_dir": str(folder / name),
        "checkpoint_interval": "0",
        "tensorboard": "false",
        # Interleaving leaves a responder idle for a few blocks: neither the step deadline
        # nor the watchdog may fire in between.
        "step_timeout": "30.0",
        "obs_timeout": "30.0",
    }
    command = [sys.executable, "-m", "unilab_ros.trainer", "--ros-args",
               "-r", f"__ns:=/{name}"]
    for key, value in params.items():
        command += ["-p", f"{key}:={value}"]
    return command


def start(name: str, command: list[str], env: dict[str, str], folder: Path) -> Responder:
    log = folder / f"{name}.log"
    with open(log, "wb") as handle:
        process = subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT)
    return Responder(name, process, log)


def measure_latencies(args: argparse.Namespace, env: dict[str, str], folder: Path
                      ) -> dict[str, Responder]:
    responders = [
        start("echo", [sys.executable, str(Path(__file__).resolve()), "--echo", "--ros-args",
                       "-r", "__ns:=/echo"], env, folder),
        start("act", trainer_command("act", folder, False, args.num_steps), env, folder),
        start("train", trainer_command("train", folder, True, args.num_steps), env, folder),
    ]
    rclpy.init()
    executor = make_executor()[0]
    print(f"act_latency: driver executor {type(executor).__name__}", flush=True)
    driver = Driver(responders, args.seed, executor)
    try:
        for responder in responders:
            driver.connect(responder, args.startup_timeout)
        for responder in responders:
            run_block(driver, responder, args.warmup, args.step_timeout, record=False)
        while any(len(r.latencies) < args.steps for r in responders):
            for responder in responders:
                left = args.steps - len(responder.latencies)
                if left > 0:
                    run_block(driver, responder, min(args.block, left), args.step_timeout,
                              record=True)
        driver.spin_for(1.5)  # one more ~/status of each trainer, with the final counters
        return {r.name: r for r in responders}
    finally:
        driver.destroy_node()
        rclpy.try_shutdown()
        for responder in responders:
            stop(responder.process)


def measure_e2e(args: argparse.Namespace, env: dict[str, str], folder: Path) -> dict[str, float]:
    params_file = REPO / "config" / "pendulum.yaml"
    output = folder / "e2e"
    bridge_log, trainer_log = folder / "e2e_bridge.log", folder / "e2e_trainer.log"
    trainer_params = {
        "max_iterations": str(args.e2e_iterations),
        "checkpoint_dir": str(output),
        "tensorboard": "false",
    }
    with open(bridge_log, "wb") as bridge_out, open(trainer_log, "wb") as trainer_out:
        bridge = subprocess.Popen(
            node_command("unilab_ros.sims.gym_env_node", params_file, {}),
            env=env, stdout=bridge_out, stderr=subprocess.STDOUT,
        )
        trainer = subprocess.Popen(
            node_command("unilab_ros.trainer", params_file, trainer_params),
            env=env, stdout=trainer_out, stderr=subprocess.STDOUT,
        )
    try:
        trainer.wait(args.e2e_timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"e2e: trainer not done within {args.e2e_timeout:.0f}s; log tail:\n"
                         f"{_tail(trainer_log)}") from None
    finally:
        stop(trainer)
        stop(bridge)
    if trainer.returncode != 0 or not (output / "metrics.csv").is_file():
        raise BenchError(f"e2e: trainer exited with {trainer.returncode}; log tail:\n"
                         f"{_tail(trainer_log)}")
    metrics = read_metrics(output / "metrics.csv")
    env_steps = np.array(metrics["env_steps"])
    steps = np.diff(env_steps, prepend=0.0)
    seconds = steps / np.array(metrics["steps_per_s"])
    updates = np.array(metrics["update_time"])
    later = slice(1, None) if len(steps) > 1 else slice(None)
    return {
        "iterations": float(len(steps)),
        "env_steps": float(env_steps[-1]),
        "steps_per_iteration": float(steps[-1]),
        "env_steps_per_s": float(steps[later].sum() / seconds[later].sum()),
        "collect_env_steps_per_s": float(
            steps[later].sum() / (seconds[later] - updates[later]).sum()),
        "first_iteration_s": float(seconds[0]),
        "update_s_median": float(np.median(updates[later])),
    }


# Report.


def _ms(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q) * 1e3) if values.size else float("nan")


def _row(label: str, values: np.ndarray) -> str:
    return (f"  {label:<30s} {values.size:6d} {_ms(values, 50):8.3f} {_ms(values, 90):8.3f} "
            f"{_ms(values, 99):8.3f} {_ms(values, 100):8.3f}")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def report(args: argparse.Namespace, responders: dict[str, Responder],
           e2e: dict[str, float] | None, folder: Path) -> None:
    echo = np.array(responders["echo"].latencies)
    act = np.array(responders["act"].latencies)
    train = responders["train"]
    train_lat = np.array(train.latencies)
    safe = np.array(train.safe, bool)
    after_safe = np.concatenate([[False], safe[:-1]])
    ordinary = train_lat[~safe & ~after_safe]
    print(f"act_latency: 1 env, obs {OBS_DIM} -> action {ACTION_DIM}, actor and critic "
          f"{HIDDEN}; {args.steps} steps per responder after {args.warmup} warm-up, "
          f"interleaved in blocks of {args.block}; ms from just before the observation is "
          "published to the action callback")
    print(f"  {'responder':<30s} {'steps':>6s} {'p50':>8s} {'p90':>8s} {'p99':>8s} {'max':>8s}")
    print(_row("echo (no policy)", echo))
    print(_row("trainer acting (training off)", act))
    print(_row("trainer learning, ordinary", ordinary))
    print(_row("  safe action at update start", train_lat[safe]))
    print(_row("  step waiting for the update", train_lat[after_safe]))
    metrics_csv = folder / "train" / "metrics.csv"
    if metrics_csv.is_file():
        update_times = np.array(read_metrics(metrics_csv)["update_time"])
        print(f"  trainer-reported update_time over {update_times.size} updates "
              f"(rollout {args.num_steps} steps): first {update_times[0] * 1e3:.1f} ms, "
              f"p50 {np.median(update_times) * 1e3:.1f} ms, max {update_times.max() * 1e3:.1f} ms")
    for name in ("act", "train"):
        status = responders[name].status
        counters = ", ".join(f"{k} {status[k]}" for k in TRAINER_STATUS_KEYS if k in status)
        print(f"  {name} trainer counters: {counters or 'no status received'}; "
              f"stray actions {responders[name].stray_actions}")
    print(f"  echo stray actions {responders['echo'].stray_actions}")
    if e2e is not None:
        print(f"e2e: gym_env_node Pendulum-v1 x 16 + trainer_node (config/pendulum.yaml), "
              f"{e2e['iterations']:.0f} iterations x {e2e['steps_per_iteration']:.0f} env "
              f"steps: {e2e['env_steps_per_s']:.0f} env-steps/s over iterations 2.. "
              f"(collection + PPO update, median update {e2e['update_s_median']:.2f} s); "
              f"collection alone {e2e['collect_env_steps_per_s']:.0f} env-steps/s; "
              f"iteration 1 with start-up {e2e['first_iteration_s']:.1f} s")
    p50_delta = _ms(act, 50) - _ms(echo, 50)
    p99 = _ms(act, 99)
    print(f"targets (acting path): p50 delta {p50_delta:.3f} ms <= {TARGET_P50_DELTA_MS}: "
          f"{'met' if p50_delta <= TARGET_P50_DELTA_MS else 'MISSED'}; p99 {p99:.3f} ms <= "
          f"{TARGET_P99_MS}: {'met' if p99 <= TARGET_P99_MS else 'MISSED'}")
    e2e_rate = e2e["env_steps_per_s"] if e2e is not None else float("nan")
    print(f"act_latency p50_delta_ms={p50_delta:.3f} p99_ms={p99:.3f} "
          f"echo_p50_ms={_ms(echo, 50):.3f} e2e_env_steps_per_s={e2e_rate:.0f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--echo", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=2000, help="measured steps per responder")
    parser.add_argument("--warmup", type=int, default=200, help="unmeasured steps per responder")
    parser.add_argument("--block", type=int, default=100, help="steps per interleaved block")
    parser.add_argument("--num-steps", type=int, default=24, help="rollout of the learning pass")
    parser.add_argument("--e2e-iterations", type=int, default=5, help="0 skips the e2e run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--domain-id", type=int, default=None)
    parser.add_argument("--startup-timeout", type=float, default=120.0)
    parser.add_argument("--step-timeout", type=float, default=30.0)
    parser.add_argument("--e2e-timeout", type=float, default=600.0)
    parser.add_argument("--results-page", action="store_true", help=FLAG_HELP)
    args = parser.parse_args(remove_ros_args(sys.argv)[1:])
    if args.echo:
        run_echo(sys.argv)
        return 0
    with recording("act_latency", args.results_page) as record:
        code = _bench(args)
        record.keep = code == 0
    return code


def _bench(args: argparse.Namespace) -> int:
    """Measure the responders and the end-to-end run, then report (1: a bench error)."""
    env = isolated_ros_env(args.domain_id)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    os.environ.update(env)
    with tempfile.TemporaryDirectory(prefix="act_latency_") as tmp:
        folder = Path(tmp)
        try:
            responders = measure_latencies(args, env, folder)
            e2e = measure_e2e(args, env, folder) if args.e2e_iterations > 0 else None
        except BenchError as error:
            print(f"act_latency: {error}", file=sys.stderr)
            return 1
        report(args, responders, e2e, folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
