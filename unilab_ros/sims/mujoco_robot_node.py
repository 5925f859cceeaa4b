"""A MuJoCo robot that behaves like Gazebo with ros2_control: it runs free on its own clock.

A thread of its own steps the physics (``MujocoWorld``) one tick at a time, paced at
``real_time_factor`` x wall time (0: as fast as it can), and never waits for a command or
for the executor. Every tick it publishes ``/clock`` (rosgraph_msgs/Clock); each sensor
stream goes out at its own rate in sim time, stamped with sim time. Per robot, under its
namespace (none for a single robot, ``robot1/`` ... ``robotN/`` for ``num_robots`` N > 1):

- ``joint_states`` (sensor_msgs/JointState), as joint_state_broadcaster;
- ``imu`` (sensor_msgs/Imu) from ``imu.site``, as imu_sensor_broadcaster;
- ``odom`` (nav_msgs/Odometry) of ``odom.body``: pose in the world, twist in the body frame;
- ``<site>/pose`` (geometry_msgs/PoseStamped) for every site in ``site_poses.sites``;
- subscribes ``<command.controller>/commands`` (std_msgs/Float64MultiArray), as
  forward_command_controller: one value per joint, the last one held. A wrong size is
  refused and counted, NaN / Inf entries keep their joint's previous command, values are
  clipped to the command range; each with a throttled warning;
- service ``reset`` (std_srvs/Empty): a new initial state within the ``reset.*`` ranges.

World services, as Gazebo Classic names them (std_srvs/Empty): ``pause_physics``,
``unpause_physics`` and ``reset_world`` (every robot). Paused, nothing is published and
sim time stands still. ``~/status`` (std_msgs/String, JSON) reports sim time, the achieved
real-time factor and the counters every ``status_period`` wall seconds.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import rclpy
from geometry_msgs.msg import PoseStamped
from nav_msgs.msg import Odometry
from rclpy.clock import Clock, ClockType
from rclpy.exceptions import InvalidServiceNameException, InvalidTopicNameException
from rclpy.impl.implementation_singleton import rclpy_implementation
from rclpy.node import Node
from rclpy.publisher import Publisher
from rosgraph_msgs.msg import Clock as ClockMsg
from sensor_msgs.msg import Imu, JointState
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import Empty

from unilab_ros.ros.executors import run_node
from unilab_ros.ros.params import ConfigError, declare_config, read_config, warn_unknown_parameters
from unilab_ros.sims import mujoco_messages as messages
from unilab_ros.sims.mujoco_config import (
    CommandConfig,
    ImuConfig,
    JointStatesConfig,
    OdomConfig,
    ResetConfig,
    RobotConfig,
    SitePosesConfig,
    WorldConfig,
)
from unilab_ros.sims.mujoco_world import MujocoWorld, WorldConfigError, model_path
from unilab_ros.sims.pacing import Every, Pacer

NODE_NAME = "mujoco_robot"
QOS_DEPTH = 10
WARN_PERIOD_S = 2.0
PAUSED_WAIT_S = 0.1
"""How often a paused physics thread looks whether it should stop."""
JOIN_TIMEOUT_S = 5.0
SECTIONS = {"joint_states": JointStatesConfig, "imu": ImuConfig, "odom": OdomConfig,
            "site_poses": SitePosesConfig, "command": CommandConfig, "reset": ResetConfig}
"""RobotConfig's sections: their fields are the parameters '<section>.<field>'."""
RCLError = rclpy_implementation.RCLError


@dataclass
class RobotPorts:
    """One robot's ROS side: its namespace, frame prefix and publishers."""

    namespace: str
    frame_prefix: str
    joint_states: Publisher
    imu: Publisher | None = None
    odom: Publisher | None = None
    poses: dict[str, Publisher] = field(default_factory=dict)


def robot_namespaces(world: WorldConfig) -> list[str]:
    """'' for a single robot, else '<prefix>1' ... '<prefix>N'."""
    if world.num_robots == 1:
        return [""]
    prefix = world.robot_namespace_prefix.strip("/")
    return [f"{prefix}{k}" for k in range(1, world.num_robots + 1)]


class MujocoRobotNode(Node):
    """Steps a MuJoCo world in a thread of its own; topics and services as Gazebo's."""

    def __init__(self, **kwargs) -> None:
        super().__init__(NODE_NAME, **kwargs)
        try:
            self._setup()
        except (WorldConfigError, ConfigError):
            self.destroy_node()
            raise

    def _setup(self) -> None:
        declare_config(self, WorldConfig())
        for section, cls in SECTIONS.items():
            declare_config(self, cls(), prefix=section)
        warn_unknown_parameters(self)
        world = read_config(self, WorldConfig)
        robot = RobotConfig(**{section: read_config(self, cls, section)
                               for section, cls in SECTIONS.items()})
        try:
            robot.check(world.update_rate)
        except ValueError as error:
            raise ConfigError(f"bad parameter value: {error}") from None
        self.world = MujocoWorld(model_path(world.model), world.num_robots, robot,
                                 world.update_rate, world.seed)
        self._config = robot
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._running = threading.Event()
        self._running.set()
        self._reanchor = False
        self._pacer = Pacer(world.real_time_factor)
        self._published = 0
        self._status_mark = (time.monotonic(), self.world.time, 0)
        # Only the streams that are on: a stream that is off may have any rate.
        rates = {"joint_states": robot.joint_states.rate,
                 "imu": robot.imu.rate if self.world.has_imu else 0.0,
                 "odom": robot.odom.rate if self.world.has_odometry else 0.0,
                 "poses": robot.site_poses.rate if robot.site_poses.sites else 0.0}
        self._schedules = {name: Every(rate) for name, rate in rates.items() if rate > 0.0}

        try:
            self._clock_pub = self.create_publisher(ClockMsg, "/clock", QOS_DEPTH)
            self.ports = [self._robot_ports(k, namespace)
                          for k, namespace in enumerate(robot_namespaces(world))]
            self.create_service(Empty, "pause_physics", self._srv_pause)
            self.create_service(Empty, "unpause_physics", self._srv_unpause)
            self.create_service(Empty, "reset_world", self._srv_reset_world)
            self._status_pub = self.create_publisher(String, "~/status", QOS_DEPTH)
        except (InvalidTopicNameException, InvalidServiceNameException) as error:
            raise ConfigError(f"bad topic name (a *.topic, command.controller, "
                              f"robot_namespace_prefix or a site): {error}") from None
        # Wall time: a status that stops with a paused sim would hide that it is paused.
        self.create_timer(world.status_period, self._report,
                          clock=Clock(clock_type=ClockType.STEADY_TIME))
        self.get_logger().info(
            f"{world.num_robots} x {world.model}: timestep {self.world.timestep:g} s, "
            f"{self.world.steps_per_tick} per tick at {world.update_rate:g} Hz, "
            f"real_time_factor {world.real_time_factor:g}; joints {self.world.joint_names}, "
            f"{robot.command.interface} commands on {self.world.command_joints} via "
            f"'{self._topic(self.ports[0].namespace, robot.command.controller)}/commands'")
        self._thread = threading.Thread(target=self._run, name="mujoco_physics", daemon=True)
        self._thread.start()

    @staticmethod
    def _topic(namespace: str, name: str) -> str:
        return f"{namespace}/{name}" if namespace else name

    def _robot_ports(self, robot: int, namespace: str) -> RobotPorts:
        cfg, topic = self._config, lambda name: self._topic(namespace, name)
        ports = RobotPorts(namespace, f"{namespace}/" if namespace else "",
                           self.create_publisher(JointState, topic(cfg.joint_states.topic),
                                                 QOS_DEPTH))
        if self.world.has_imu:
            ports.imu = self.create_publisher(Imu, topic(cfg.imu.topic), QOS_DEPTH)
        if self.world.has_odometry:
            ports.odom = self.create_publisher(Odometry, topic(cfg.odom.topic), QOS_DEPTH)
        ports.poses = {site: self.create_publisher(PoseStamped, topic(f"{site}/pose"),
                                                   QOS_DEPTH)
                       for site in cfg.site_poses.sites}
        self.create_subscription(Float64MultiArray, topic(f"{cfg.command.controller}/commands"),
                                 lambda msg: self._on_command(robot, msg), QOS_DEPTH)
        self.create_service(Empty, topic("reset"),
                            lambda request, response: self._srv_reset(robot, response))
        return ports

    # -- the physics thread ------------------------------------------------------------------

    def _run(self) -> None:
        self._pacer.anchor(self.world.time)
        while not self._stop.is_set():
            if not self._running.is_set():
                self._running.wait(PAUSED_WAIT_S)
                continue
            if self._reanchor:
                # Time spent paused is not lag to make up.
                self._reanchor = False
                self._pacer.anchor(self.world.time)
            with self._lock:
                # Checked again under the lock: once pause_physics has answered, sim time
                # stands still (a tick stepped before it may still be on its way out).
                if not self._running.is_set():
                    continue
                self.world.step()
                outgoing = self._due_messages()
            try:
                for publisher, msg in outgoing:
                    publisher.publish(msg)
            except RCLError:
                # The context was shut down under the thread (an external shutdown).
                if rclpy.ok(context=self.context):
                    raise
                return
            self._published += len(outgoing)
            delay = self._pacer.delay(self.world.time)
            if delay > 0.0:
                self._stop.wait(delay)

    def _due_messages(self) -> list[tuple[Publisher, object]]:
        """The tick's messages: /clock, then every stream whose time has come."""
        world, cfg, now = self.world, self._config, self.world.time_ns
        outgoing: list[tuple[Publisher, object]] = [(self._clock_pub, messages.clock_msg(now))]
        due = {name: schedule.due(now) for name, schedule in self._schedules.items()}
        for robot, ports in enumerate(self.ports):
            prefix = ports.frame_prefix
            if due.get("joint_states"):
                outgoing.append((ports.joint_states,
                                 messages.joint_state_msg(world.joint_state(robot), now)))
            if ports.imu is not None and due.get("imu"):
                outgoing.append((ports.imu, messages.imu_msg(
                    world.imu(robot), now, prefix + cfg.imu.frame_id, cfg.imu)))
            if ports.odom is not None and due.get("odom"):
                outgoing.append((ports.odom, messages.odometry_msg(
                    world.odometry(robot), now, prefix + cfg.odom.frame_id,
                    prefix + cfg.odom.child_frame_id)))
            if due.get("poses"):
                for site, publisher in ports.poses.items():
                    outgoing.append((publisher, messages.pose_msg(
                        world.site_pose(robot, site), now, prefix + cfg.site_poses.frame_id)))
        return outgoing

    # -- commands and services -----------------------------------------------------------

    def _on_command(self, robot: int, msg: Float64MultiArray) -> None:
        values = np.frombuffer(msg.data, dtype=np.float64)
        with self._lock:
            result = self.world.set_command(robot, values)
            counters = self.world.counters[robot]
        where = self._topic(self.ports[robot].namespace, self._config.command.controller)
        if not result.accepted:
            self.get_logger().warning(
                f"{where}/commands: command refused, last one held "
                f"({counters.rejected_commands} so far): {result.reason}",
                throttle_duration_sec=WARN_PERIOD_S)
        elif result.nonfinite:
            self.get_logger().warning(
                f"{where}/commands: {result.nonfinite} NaN/Inf value(s), those joints keep "
                f"their previous command ({counters.nonfinite_entries} so far)",
                throttle_duration_sec=WARN_PERIOD_S)
        elif result.clipped:
            self.get_logger().warning(
                f"{where}/commands: {result.clipped} value(s) clipped to the command range "
                f"({counters.clipped_entries} so far)", throttle_duration_sec=WARN_PERIOD_S)

    def _srv_reset(self, robot: int, response: Empty.Response) -> Empty.Response:
        with self._lock:
            self.world.reset(robot)
        return response

    def _srv_reset_world(self, _request: Empty.Request,
                         response: Empty.Response) -> Empty.Response:
        with self._lock:
            for robot in range(self.world.num_robots):
                self.world.reset(robot)
        return response

    def _srv_pause(self, _request: Empty.Request, response: Empty.Response) -> Empty.Response:
        with self._lock:
            self._running.clear()
        return response

    def _srv_unpause(self, _request: Empty.Request, response: Empty.Response) -> Empty.Response:
        if not self._running.is_set():
            self._reanchor = True
            self._running.set()
        return response

    # -- reporting and shutdown ----------------------------------------------------------

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def status(self) -> dict:
        """Sim time, the real-time factor achieved since the last call, counters."""
        wall, sim = time.monotonic(), self.world.time
        published = self._published
        last_wall, last_sim, last_published = self._status_mark
        self._status_mark = (wall, sim, published)
        elapsed = max(wall - last_wall, 1e-9)
        with self._lock:
            robots = {ports.namespace or "/": asdict(self.world.counters[k])
                      for k, ports in enumerate(self.ports)}
        return {"sim_time": round(sim, 6), "paused": self.paused,
                "real_time_factor": self._pacer.real_time_factor,
                "achieved_real_time_factor": round((sim - last_sim) / elapsed, 4),
                "messages_per_s": round((published - last_published) / elapsed, 1),
                "late": self._pacer.late, "robots": robots}

    def _report(self) -> None:
        self._status_pub.publish(String(data=json.dumps(self.status())))

    def destroy_node(self) -> None:
        thread = getattr(self, "_thread", None)
        if thread is not None:
            self._stop.set()
            self._running.set()
            thread.join(JOIN_TIMEOUT_S)
            self._thread = None
        super().destroy_node()


def main(args: list[str] | None = None) -> None:
    run_node(NODE_NAME, lambda _ordered: MujocoRobotNode(), args,
             (WorldConfigError, ConfigError))


if __name__ == "__main__":
    main()
