"""Achieved real-time factor and messages per second of the MuJoCo robot node.

Each case starts ``mujoco_robot_node`` as a process of its own (a shipped robot file,
``num_robots`` copies, a requested ``real_time_factor``) on an isolated graph (localhost
discovery, a domain id of the run's own). This process subscribes what a trainer would:
``/clock`` and every robot's ``joint_states``, ``imu``, ``odom`` and site poses, as the
robot's file configures them. Once every topic has delivered (discovery of 16 robots'
topics takes seconds) it reports over ``--seconds`` of wall time:

- ``rtf``: sim time advanced (the /clock stamps received) over wall time;
- ``node_rtf``: the node's own figure (its ``~/status``), the same without the transport;
- ``received/s``: messages of every kind this subscriber got per wall second;
- ``published/s``: what the node published per wall second (its ``~/status``).

Cases: 1 and 16 cart-poles and the quadruped (floating base, IMU, odometry), each at
real_time_factor 1.0 and 0.0 (as fast as it can). The last line reads ``mujoco_robot
<case>_rtf=<x> ...`` for machines to read.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import rclpy
from geometry_msgs.msg import PoseStamped
from nav_msgs.msg import Odometry
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Imu, JointState
from std_msgs.msg import String
from yaml import safe_load

from unilab_ros.tools.sim_train import isolated_ros_env, node_command, stop

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from results_page import FLAG_HELP, cpu_model, recording  # noqa: E402  (bench: no package)

ROBOTS_DIR = ROOT / "config" / "robots"
CASES = (("cartpole", 1), ("cartpole", 16), ("quadruped", 1))
FACTORS = (1.0, 0.0)
DISCOVERY_TIMEOUT_S = 30.0
SETTLE_S = 1.0


@dataclass
class Figures:
    rtf: float
    node_rtf: float
    received_per_s: float
    published_per_s: float


def robot_topics(robot: str) -> list[tuple[type, str]]:
    """The streams the robot's file turns on, relative to a robot's namespace."""
    params = next(iter(safe_load((ROBOTS_DIR / f"{robot}.yaml").read_text()).values()))
    params = params["ros__parameters"]
    topics: list[tuple[type, str]] = [(JointState, "joint_states")]
    if params.get("imu", {}).get("site"):
        topics.append((Imu, "imu"))
    if params.get("odom", {}).get("body"):
        topics.append((Odometry, "odom"))
    topics += [(PoseStamped, f"{site}/pose")
               for site in params.get("site_poses", {}).get("sites", [])]
    return topics


class Listener:
    """Counts what arrives; keeps the first and last /clock of the window with wall times."""

    def __init__(self, node: Node, robot: str, num_robots: int) -> None:
        self.count = 0
        self.clock: list[tuple[float, float]] = []
        self.status: list[dict] = []
        self.silent: set[str] = set()
        namespaces = [""] if num_robots == 1 else [f"robot{k}/"
                                                  for k in range(1, num_robots + 1)]
        node.create_subscription(Clock, "/clock", self._on_clock, 100)
        node.create_subscription(String, "/mujoco_robot/status",
                                 lambda msg: self.status.append(json.loads(msg.data)), 10)
        for namespace in namespaces:
            for msg_type, name in robot_topics(robot):
                topic = namespace + name
                self.silent.add(topic)
                node.create_subscription(msg_type, topic,
                                         lambda _msg, topic=topic: self._on_any(topic), 100)

    def _on_any(self, topic: str) -> None:
        self.count += 1
        self.silent.discard(topic)

    def _on_clock(self, msg: Clock) -> None:
        self.count += 1
        self.clock.append((time.monotonic(), msg.clock.sec + msg.clock.nanosec * 1e-9))

    def reset(self) -> None:
        self.count = 0
        self.clock.clear()
        self.status.clear()


def measure(robot: str, num_robots: int, factor: float, seconds: float,
            env: dict[str, str]) -> Figures:
    process = subprocess.Popen(
        node_command("unilab_ros.sims.mujoco_robot_node", ROBOTS_DIR / f"{robot}.yaml",
                     {"num_robots": str(num_robots), "real_time_factor": str(factor),
                      "status_period": str(seconds)}),
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    node = rclpy.create_node("mujoco_robot_bench")
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    listener = Listener(node, robot, num_robots)
    try:
        def spin(duration: float) -> None:
            end = time.monotonic() + duration
            while time.monotonic() < end:
                executor.spin_once(timeout_sec=0.05)

        deadline = time.monotonic() + DISCOVERY_TIMEOUT_S
        while (listener.silent or not listener.clock) and time.monotonic() < deadline:
            spin(0.1)
        if listener.silent:
            print(f"  never heard from {sorted(listener.silent)}", flush=True)
        spin(SETTLE_S)
        listener.reset()
        start = time.monotonic()
        spin(seconds)
        elapsed = time.monotonic() - start
        count = listener.count
        # The status that covers the window comes out at its end.
        spin(min(seconds, 2.0) + 0.5)
        (wall0, sim0), (wall1, sim1) = listener.clock[0], listener.clock[-1]
        status = listener.status[-1] if listener.status else {}
        return Figures(rtf=(sim1 - sim0) / max(wall1 - wall0, 1e-9),
                       node_rtf=status.get("achieved_real_time_factor", float("nan")),
                       received_per_s=count / elapsed,
                       published_per_s=status.get("messages_per_s", float("nan")))
    finally:
        executor.shutdown()
        node.destroy_node()
        stop(process)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured wall time a case")
    parser.add_argument("--domain-id", type=int, default=None)
    parser.add_argument("--results-page", action="store_true", help=FLAG_HELP)
    args = parser.parse_args(argv)
    with recording("mujoco_robot", args.results_page):
        _bench(args)


def _bench(args: argparse.Namespace) -> None:
    """Every case in turn, a line each, then the summary line."""
    env = isolated_ros_env(args.domain_id)
    # This process joins the same isolated graph as the node (read at rclpy.init).
    os.environ.update({key: env[key] for key in ("ROS_DOMAIN_ID",
                                                 "ROS_AUTOMATIC_DISCOVERY_RANGE")})
    print(f"CPU: {cpu_model()}; {args.seconds:g} s a case, domain {env['ROS_DOMAIN_ID']}",
          flush=True)
    rclpy.init()
    summary = []
    try:
        print(f"{'case':<16} {'requested':>9} {'rtf':>8} {'node_rtf':>8} {'received/s':>11} "
              f"{'published/s':>11}", flush=True)
        for robot, num_robots in CASES:
            for factor in FACTORS:
                figures = measure(robot, num_robots, factor, args.seconds, env)
                case = f"{num_robots}x{robot}"
                print(f"{case:<16} {factor:>9g} {figures.rtf:>8.2f} {figures.node_rtf:>8.2f} "
                      f"{figures.received_per_s:>11,.0f} {figures.published_per_s:>11,.0f}",
                      flush=True)
                summary.append(f"{case}_at_{factor:g}_rtf={figures.rtf:.2f}")
    finally:
        rclpy.try_shutdown()
    print("mujoco_robot " + " ".join(summary))


if __name__ == "__main__":
    main()
