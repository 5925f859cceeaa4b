"""The trainer's control loop on a robot spec: period jitter at 50 and 200 Hz with the
[512, 256, 128] network, and the cost of assembling one observation.

    python bench/control_loop.py                   # 50 and 200 Hz, 20 s each
    python bench/control_loop.py --rates 200 --seconds 60
    python bench/control_loop.py --spin-margins 0.001 0.0005 0

Jitter: ``trainer_node`` runs as a process of its own on an isolated graph (localhost
discovery, a domain id of the run's own) with the quadruped's spec (joint states, IMU and
odometry in, 8 joint positions out) at each control rate, on the wall clock, acting with
a [512, 256, 128] actor-critic; this process plays the robot, publishing all three
sources at twice the control rate (stamped) and answering the reset service. The
trainer's ``~/status`` reports |period - 1/rate| over its last 2,000 control periods
(``RobotLink``'s ``PeriodJitter``): p50, p99 and max. Rollouts are long enough that no
update falls in the measurement (an update holds the robot by design). The trainer runs
once per ``control_spin_margin`` given (default: the shipped value and 0, off): how long a
tick waits, spinning, after its timer's scheduled time; its ``timer_wake`` status says how
late the timer woke (p50, p99), which is what the margin has to cover.

The floor, measured in the same run: a bare node beside the same robot (subscribed to the
same three sources with callbacks that do nothing, a timer at the rate on the same
executor kind, no work) gives the same figures: what this machine's scheduler and rclpy
allow any Python node. The trainer and the bare node alternate, ``--trials`` runs each
(default 3): a p99 over 2,000 periods is its 20 worst, and one busy second of the
machine moves it by a millisecond, so the bench prints the median and the range.

Assembly: ``RobotSteps.tick`` on the quadruped spec, in process: building the observation,
the reward and the termination of one step from the newest samples, per step (us), and
``ObservationBuilder.build_from`` alone.

Prints the CPU model; the last line is ``control_loop p99_ms_50hz_margin_<m>ms=<x> ...
floor_p99_ms_50hz=<x> p99_ms_200hz_margin_<m>ms=<x> ... floor_p99_ms_200hz=<x> tick_us=<x>
observation_us=<x>`` (medians; one figure per margin).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import rclpy
import yaml
from nav_msgs.msg import Odometry
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from sensor_msgs.msg import Imu, JointState
from std_msgs.msg import String
from std_srvs.srv import Empty

from unilab_ros.robot.samples import ImuSample, JointStateSample, OdometrySample
from unilab_ros.robot.spec import load_spec, spec_to_dict
from unilab_ros.robot.steps import RobotSteps
from unilab_ros.robot.terms import TermContext
from unilab_ros.tools.sim_train import die_with_parent, isolated_ros_env, node_command, stop
from unilab_ros.trainer.config import TrainerNodeConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from results_page import FLAG_HELP, cpu_model, recording  # noqa: E402  (bench: no package)

SPEC = ROOT / "config" / "robot_specs" / "quadruped.yaml"


class _Robot(Node):
    """Publishes the quadruped's sources at ``rate`` Hz, stamped with the wall clock."""

    def __init__(self, joints: list[str], rate: float) -> None:
        super().__init__("bench_robot")
        self.joints = joints
        self.status: dict = {}
        self.js = self.create_publisher(JointState, "joint_states", 10)
        self.imu = self.create_publisher(Imu, "imu", 10)
        self.odom = self.create_publisher(Odometry, "odom", 10)
        self.create_service(Empty, "reset", lambda _req, res: res)
        self.create_subscription(String, "/unilab_trainer/status", self._on_status, 10)
        self.rng = np.random.default_rng(0)
        self.create_timer(1.0 / rate, self._publish)

    def _on_status(self, msg: String) -> None:
        self.status = json.loads(msg.data)

    def _publish(self) -> None:
        stamp = self.get_clock().now().to_msg()
        n = len(self.joints)
        js = JointState(name=self.joints)
        js.header.stamp = stamp
        js.position = self.rng.normal(0.0, 0.1, n).tolist()
        js.velocity = self.rng.normal(0.0, 0.1, n).tolist()
        js.effort = [0.0] * n
        self.js.publish(js)
        imu = Imu()
        imu.header.stamp = stamp
        imu.orientation.w = 1.0
        self.imu.publish(imu)
        odom = Odometry()
        odom.header.stamp = stamp
        odom.pose.pose.orientation.w = 1.0
        odom.pose.pose.position.z = 0.3
        self.odom.publish(odom)


def _spec_file(rate: float, out: Path) -> tuple[Path, list[str]]:
    data = spec_to_dict(load_spec(SPEC))
    data["control_rate"] = rate
    # Long episodes, no termination: only the control loop is measured.
    data["terminations"] = [{"kind": "episode_length", "max_steps": 10 ** 7}]
    spec_path = out / f"spec_{rate:g}.yaml"
    spec_path.write_text(yaml.safe_dump(data))
    return spec_path, list(data["actions"]["joints"])


def _window(rate: float, seconds: float) -> float:
    """Seconds to measure: the figures cover the last 2,000 periods, so at least that."""
    return max(seconds, 2000.0 / rate + 2.0)


def _with_robot(command: list[str], log: Path, joints: list[str], rate: float, domain: int,
                measure) -> dict:
    """Run ``command`` (a node process on an isolated graph) while this process plays the
    robot at twice ``rate``; ``measure(robot, spin, process)`` returns the figures."""
    env = isolated_ros_env(domain)
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                               stderr=log.open("w"), preexec_fn=die_with_parent())
    os.environ.update({k: env[k] for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE")})
    rclpy.init()
    robot = _Robot(joints, 2.0 * rate)
    executor = SingleThreadedExecutor()
    executor.add_node(robot)

    def spin(until: float, done=lambda: False) -> None:
        while time.monotonic() < until and not done():
            executor.spin_once(timeout_sec=0.05)

    try:
        return measure(robot, spin, process)
    finally:
        robot.destroy_node()
        rclpy.shutdown()
        stop(process)


def jitter(rate: float, seconds: float, out: Path, domain: int, margin: float) -> dict:
    """The trainer's period jitter at ``rate`` Hz with ``control_spin_margin`` ``margin``
    (its ~/status figures)."""
    spec_path, joints = _spec_file(rate, out)
    params = out / f"trainer_{rate:g}_{margin:g}.yaml"
    params.write_text(yaml.safe_dump({"/**/unilab_trainer": {"ros__parameters": {
        "robot_spec": str(spec_path), "num_steps": int(rate * (seconds + 60)),
        "control_spin_margin": margin,
        "checkpoint_dir": str(out / f"run_{rate:g}_{margin:g}"), "tensorboard": False,
        "model": {"actor_hidden_dims": [512, 256, 128], "critic_hidden_dims": [512, 256, 128]},
    }}}))

    def measure(robot: _Robot, spin, _process) -> dict:
        # Start-up (the warm-up update compiles) and the first steps, then a fresh window.
        spin(time.monotonic() + 120.0, lambda: robot.status.get("env_steps", 0) > rate)
        started = robot.status.get("env_steps", 0)
        spin(time.monotonic() + _window(rate, seconds))
        status = robot.status
        link = status.get("robots", {}).get("quadruped", {})
        if status.get("iteration", 0) or not link:
            raise RuntimeError(f"{rate} Hz: an update ran or no status ({status})")
        return {**link["period_jitter"], **link["timer_wake"],
                "steps": status.get("env_steps", 0) - started,
                "dropped": link.get("steps_dropped"), "stale": link.get("stale_ticks")}

    return _with_robot(node_command("unilab_ros.trainer", params, {}),
                       out / f"trainer_{rate:g}_{margin:g}.log", joints, rate, domain, measure)


def floor(rate: float, seconds: float, out: Path, domain: int) -> dict:
    """The same figures for a bare node beside the same robot: subscribed to the same
    sources (callbacks that do nothing), a timer at ``rate`` on the same executor kind, no
    work. What the machine's scheduler and rclpy give any Python node here."""
    _, joints = _spec_file(rate, out)
    command = [sys.executable, __file__, "--bare", str(rate), str(_window(rate, seconds))]

    def measure(_robot: _Robot, spin, process) -> dict:
        spin(time.monotonic() + _window(rate, seconds) + 60.0, lambda: process.poll() is not None)
        output = process.stdout.read().decode() if process.poll() is not None else ""
        if not output.strip():
            raise RuntimeError(f"{rate} Hz: the bare node gave no figures")
        return json.loads(output.strip().splitlines()[-1])

    return _with_robot(command, out / f"bare_{rate:g}.log", joints, rate, domain, measure)


def _bare(rate: float, seconds: float) -> None:
    """The bare node of ``floor``: prints its PeriodJitter summary as JSON."""
    from unilab_ros.ros.executors import make_executor
    from unilab_ros.ros.spec_link import PeriodJitter

    rclpy.init()
    node = rclpy.create_node("bare_loop")
    for msg_type, topic in ((JointState, "joint_states"), (Imu, "imu"), (Odometry, "odom")):
        node.create_subscription(msg_type, topic, lambda _msg: None, 10)
    period = PeriodJitter(1.0 / rate)
    node.create_timer(1.0 / rate,
                      lambda: period.tick(node.get_clock().now().nanoseconds * 1e-9))
    executor, _ = make_executor()
    executor.add_node(node)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        executor.spin_once(timeout_sec=0.2)
    print(json.dumps(period.summary()), flush=True)
    node.destroy_node()
    rclpy.shutdown()


def assembly_cost(repeats: int) -> tuple[float, float, int]:
    """us per RobotSteps tick (observation, reward, termination) and per observation, and
    the observation's size."""
    spec = load_spec(SPEC)
    steps = RobotSteps(spec, np.random.default_rng(0))
    joints = tuple(spec.actions.joints)
    rng = np.random.default_rng(1)
    n = len(joints)
    samples = {
        "joints": JointStateSample(joints[::-1], rng.normal(size=n), rng.normal(size=n),
                                   rng.normal(size=n), stamp=None),
        "imu": ImuSample(np.array([0.0, 0.0, 0.0, 1.0]), rng.normal(size=3),
                         rng.normal(size=3), stamp=None),
        "odom": OdometrySample(np.array([0.0, 0.0, 0.3]), np.array([0.0, 0.0, 0.0, 1.0]),
                               rng.normal(size=3), rng.normal(size=3), stamp=None),
    }
    for name, sample in samples.items():
        steps.on_sample(name, sample, 0.0)
    action = np.zeros(n, np.float32)
    began = time.perf_counter()
    for i in range(repeats):
        now = 0.001 * i
        for name, sample in samples.items():
            steps.on_sample(name, sample, now)
        event = steps.tick(now)
        if steps.needs_reset:
            steps.start_episode(-1.0)
        if event is not None:
            steps.action_sent(event.obs if hasattr(event, "obs") else event.next_obs, action,
                              0, now)
    tick_us = (time.perf_counter() - began) / repeats * 1e6
    ctx = TermContext(samples=samples, previous=samples, commands=steps.commands,
                      default_pose=spec.default_pose, action=action, previous_action=action,
                      dt=spec.dt)
    began = time.perf_counter()
    for _ in range(repeats):
        steps.observation.build_from(ctx)
    return tick_us, (time.perf_counter() - began) / repeats * 1e6, steps.observation.dim


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[50.0, 200.0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--trials", type=int, default=3,
                        help="runs of the trainer and of the bare node per rate, alternated")
    parser.add_argument("--spin-margins", type=float, nargs="+",
                        default=[TrainerNodeConfig.control_spin_margin, 0.0],
                        help="the trainer's control_spin_margin (s), a run set each")
    parser.add_argument("--repeats", type=int, default=20_000)
    parser.add_argument("--results-page", action="store_true", help=FLAG_HELP)
    parser.add_argument("--bare", type=float, nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare:
        _bare(*args.bare)
        return
    with recording("control_loop", args.results_page):
        _bench(args)


def _bench(args: argparse.Namespace) -> None:
    """The tick's cost, then trainer and bare-node runs per rate, then the last line."""
    print(f"cpu: {cpu_model()}")
    tick_us, obs_us, dim = assembly_cost(args.repeats)
    print(f"quadruped spec (obs {dim}, 3 sources): RobotSteps.tick {tick_us:.1f} us per step "
          f"(observation, reward, termination), observation alone {obs_us:.1f} us")
    out = Path(tempfile.mkdtemp(prefix="control_loop_"))
    figures = {}
    domains = iter(range(40, 90))
    for rate in args.rates:
        ours: dict[float, list[dict]] = {margin: [] for margin in args.spin_margins}
        bare = []
        for _ in range(args.trials):
            for margin, runs in ours.items():
                runs.append(jitter(rate, args.seconds, out, next(domains), margin))
            bare.append(floor(rate, args.seconds, out, next(domains)))
        for margin, runs in ours.items():
            print(f"{rate:g} Hz, trainer, [512, 256, 128], control_spin_margin "
                  f"{margin * 1e3:g} ms: {_summary(runs)}; timer woke late by p50 "
                  f"{_range([run['late_p50_ms'] for run in runs])} ms, p99 "
                  f"{_range([run['late_p99_ms'] for run in runs])} ms; "
                  f"{sum(run['steps'] for run in runs)} steps, dropped "
                  f"{sum(run['dropped'] or 0 for run in runs)}, stale ticks "
                  f"{sum(run['stale'] or 0 for run in runs)}")
        print(f"{rate:g} Hz, bare node (floor): {_summary(bare)}")
        figures[rate] = ({margin: float(np.median([r["p99_ms"] for r in runs]))
                          for margin, runs in ours.items()},
                         float(np.median([r["p99_ms"] for r in bare])))
    line = " ".join(
        " ".join(f"p99_ms_{rate:g}hz_margin_{margin * 1e3:g}ms={p99:.3f}"
                 for margin, p99 in ours.items()) + f" floor_p99_ms_{rate:g}hz={bare:.3f}"
        for rate, (ours, bare) in figures.items())
    print(f"control_loop {line} tick_us={tick_us:.1f} observation_us={obs_us:.1f}")


def _summary(runs: list[dict]) -> str:
    return (f"period jitter p99 {_range([run['p99_ms'] for run in runs])} ms, p50 "
            f"{_range([run['p50_ms'] for run in runs])} ms, max "
            f"{_range([run['max_ms'] for run in runs])} ms over the last 2,000 periods "
            f"(median, min-max of {len(runs)} runs)")


def _range(values: list[float]) -> str:
    return f"{np.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


if __name__ == "__main__":
    main()
