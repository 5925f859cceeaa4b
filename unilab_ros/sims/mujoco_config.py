"""The MuJoCo robot node's configuration: dataclasses, the one source of defaults (ROS-free).

The node declares one parameter per field (params.py), grouped by prefix: the world's
fields bare (``model``, ``num_robots``, ``real_time_factor`` ...), the others under
``joint_states.``, ``imu.``, ``odom.``, ``site_poses.``, ``command.`` and ``reset.``.
Every robot of a world shares one configuration. Rates are in sim-time Hz.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

COMMAND_INTERFACES = ("position", "velocity", "effort")


def _check_rate(problems: list[str], name: str, rate: float, update_rate: float) -> None:
    if not 0.0 < rate <= update_rate:
        problems.append(f"{name} must be in (0, update_rate={update_rate:g}] Hz, got {rate:g}")


def _check_per_joint(problems: list[str], name: str, values: list[float],
                     minimum: float = 0.0) -> None:
    if not values:
        problems.append(f"{name} needs one value, or one per joint")
    elif not all(math.isfinite(v) and v >= minimum for v in values):
        problems.append(f"{name} must be finite and >= {minimum:g}, got {values}")


@dataclass
class WorldConfig:
    """The world: which model, how many robots, how fast."""

    model: str = "cartpole.xml"
    """MJCF file: a name in the package's sims/models folder (cartpole.xml, reacher.xml,
    quadruped.xml), gymnasium:<asset> for one of Gymnasium's (gymnasium:hopper.xml) or a
    path. Its actuators must be plain motors."""
    num_robots: int = 1
    """Copies of the robot, each simulated on its own (they never touch) and published
    under its own namespace; see robot_namespace_prefix."""
    robot_namespace_prefix: str = "robot"
    """With num_robots > 1, robot k (1..num_robots) lives under '<prefix><k>/' (robot1/,
    robot2/, ...); a single robot has no namespace of its own."""
    real_time_factor: float = 1.0
    """Sim seconds per wall second: 1.0 real time, above 1 faster, 0.0 as fast as the
    machine can."""
    update_rate: float = 100.0
    """Ticks per sim second, like ros2_control's controller_manager update_rate: /clock goes
    out every tick and the sensor streams on ticks (a rate that does not divide this one
    jitters by a tick); a tick is a whole number of model timesteps. Commands act from
    the next physics step."""
    seed: int = 0
    """Seed of the reset randomization and the sensor noise (robot k draws from its own
    stream)."""
    status_period: float = 2.0
    """Wall seconds between ~/status messages (JSON: sim time, achieved real-time factor,
    counters)."""

    def validate(self) -> None:
        problems = []
        if not self.model:
            problems.append("model must name an MJCF file")
        if self.num_robots < 1:
            problems.append(f"num_robots must be >= 1, got {self.num_robots}")
        if self.num_robots > 1 and not self.robot_namespace_prefix.strip("/"):
            problems.append("robot_namespace_prefix must not be empty with num_robots > 1")
        if not (math.isfinite(self.real_time_factor) and self.real_time_factor >= 0.0):
            problems.append(f"real_time_factor must be >= 0, got {self.real_time_factor}")
        if not (math.isfinite(self.update_rate) and self.update_rate > 0.0):
            problems.append(f"update_rate must be > 0 Hz, got {self.update_rate}")
        if not self.status_period > 0.0:
            problems.append(f"status_period must be > 0 s, got {self.status_period}")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass
class JointStatesConfig:
    """sensor_msgs/JointState, as joint_state_broadcaster publishes it."""

    topic: str = "joint_states"
    """Topic, relative to the robot's namespace."""
    rate: float = 100.0
    """Messages per sim second."""
    joints: list[str] = field(default_factory=list)
    """Joints published, in this order; empty: every hinge and slide joint in model order."""
    shuffle: bool = False
    """Publish the joints in a random order (fixed for the run, drawn from seed), as a
    broadcaster's resource-manager order differs from the URDF's: subscribers must match
    by name."""


@dataclass
class ImuConfig:
    """sensor_msgs/Imu from a site, as imu_sensor_broadcaster publishes it."""

    site: str = ""
    """Site the IMU sits at (its frame is the sensor frame); empty: no IMU."""
    topic: str = "imu"
    """Topic, relative to the robot's namespace."""
    rate: float = 100.0
    """Messages per sim second."""
    frame_id: str = "imu_link"
    """header.frame_id (prefixed '<namespace>/' when the robot has a namespace)."""
    orientation_noise: float = 0.0
    """Std of a random rotation (rad, about each axis) applied to the orientation."""
    angular_velocity_noise: float = 0.0
    """Std of Gaussian noise on each angular velocity component (rad/s)."""
    linear_acceleration_noise: float = 0.0
    """Std of Gaussian noise on each linear acceleration component (m/s^2)."""

    def validate(self) -> None:
        problems: list[str] = []
        for name in ("orientation_noise", "angular_velocity_noise", "linear_acceleration_noise"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                problems.append(f"imu.{name} must be >= 0, got {value}")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass
class OdomConfig:
    """nav_msgs/Odometry of the floating base."""

    body: str = ""
    """Body with the model's free joint; empty: no odometry."""
    topic: str = "odom"
    """Topic, relative to the robot's namespace."""
    rate: float = 50.0
    """Messages per sim second."""
    frame_id: str = "odom"
    """header.frame_id: the world frame the pose is in (prefixed like imu.frame_id)."""
    child_frame_id: str = "base_link"
    """child_frame_id: the body frame the twist is in (prefixed like imu.frame_id)."""


@dataclass
class SitePosesConfig:
    """geometry_msgs/PoseStamped of named sites, in the world frame."""

    sites: list[str] = field(default_factory=list)
    """Sites published, each on '<site>/pose' in the robot's namespace."""
    rate: float = 50.0
    """Messages per sim second and site."""
    frame_id: str = "world"
    """header.frame_id (the MuJoCo world frame; prefixed like imu.frame_id)."""


@dataclass
class CommandConfig:
    """The command input, as ros2_control's forward_command_controller takes it."""

    controller: str = "effort_controller"
    """Controller name: commands arrive on '<controller>/commands'
    (std_msgs/Float64MultiArray, one value per joint in command.joints order)."""
    interface: str = "effort"
    """position (PD to torque with command.kp / command.kd), velocity (torque
    command.kd x (command - velocity)) or effort (torque)."""
    joints: list[str] = field(default_factory=list)
    """Commanded joints in the command's order, each driven by one MJCF actuator; empty:
    every actuated joint in actuator order."""
    kp: list[float] = field(default_factory=lambda: [0.0])
    """Position gain (N m/rad or N/m): one value for every joint or one per joint."""
    kd: list[float] = field(default_factory=lambda: [0.0])
    """Damping gain (N m s/rad or N s/m), one or one per joint; the velocity interface's
    gain."""
    velocity_limit: list[float] = field(default_factory=lambda: [0.0])
    """Velocity commands are clipped to +-this (rad/s or m/s), one or one per joint;
    0.0: no limit. Position commands are clipped to the joint range, efforts (and every
    interface's torque) to the actuator's range."""

    def validate(self) -> None:
        problems: list[str] = []
        if not self.controller.strip("/"):
            problems.append("command.controller must not be empty")
        if self.interface not in COMMAND_INTERFACES:
            problems.append(f"command.interface must be one of {COMMAND_INTERFACES}, "
                            f"got {self.interface!r}")
        _check_per_joint(problems, "command.kp", self.kp)
        _check_per_joint(problems, "command.kd", self.kd)
        _check_per_joint(problems, "command.velocity_limit", self.velocity_limit)
        if self.interface == "position" and not all(k > 0.0 for k in self.kp):
            problems.append(f"command.kp must be > 0 for the position interface, got {self.kp}")
        if self.interface == "velocity" and not all(k > 0.0 for k in self.kd):
            problems.append(f"command.kd must be > 0 for the velocity interface, got {self.kd}")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass
class ResetConfig:
    """The initial state, drawn at start and on every reset."""

    position_range: list[float] = field(default_factory=lambda: [0.0])
    """Each hinge / slide joint starts uniformly within +-this of its home position (the
    keyframe 'home', else the model's qpos0): one value or one per joint in model order."""
    velocity_range: list[float] = field(default_factory=lambda: [0.0])
    """Each hinge / slide joint starts with a velocity uniformly within +-this."""
    mocap_position_range: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    """Every mocap body (e.g. the reacher's target) starts uniformly within +-(x, y, z) of
    its MJCF position."""
    base_position_range: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    """Every floating base (free joint) starts uniformly within +-(x, y, z) m of its home
    position."""
    base_yaw_range: float = 0.0
    """Every floating base starts turned about the world's z axis by an angle uniformly
    within +-this (rad) from its home orientation."""

    def validate(self) -> None:
        problems: list[str] = []
        _check_per_joint(problems, "reset.position_range", self.position_range)
        _check_per_joint(problems, "reset.velocity_range", self.velocity_range)
        if len(self.mocap_position_range) != 3:
            problems.append("reset.mocap_position_range needs 3 values (x, y, z)")
        _check_per_joint(problems, "reset.mocap_position_range", self.mocap_position_range)
        if len(self.base_position_range) != 3:
            problems.append("reset.base_position_range needs 3 values (x, y, z)")
        _check_per_joint(problems, "reset.base_position_range", self.base_position_range)
        if not (math.isfinite(self.base_yaw_range) and self.base_yaw_range >= 0.0):
            problems.append(f"reset.base_yaw_range must be >= 0, got {self.base_yaw_range}")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass
class RobotConfig:
    """Everything the world needs besides the world's own settings."""

    joint_states: JointStatesConfig = field(default_factory=JointStatesConfig)
    imu: ImuConfig = field(default_factory=ImuConfig)
    odom: OdomConfig = field(default_factory=OdomConfig)
    site_poses: SitePosesConfig = field(default_factory=SitePosesConfig)
    command: CommandConfig = field(default_factory=CommandConfig)
    reset: ResetConfig = field(default_factory=ResetConfig)

    def check(self, update_rate: float) -> None:
        """Raise ValueError naming every out-of-range value (the model is not consulted)."""
        problems: list[str] = []
        _check_rate(problems, "joint_states.rate", self.joint_states.rate, update_rate)
        if self.imu.site:
            _check_rate(problems, "imu.rate", self.imu.rate, update_rate)
        if self.odom.body:
            _check_rate(problems, "odom.rate", self.odom.rate, update_rate)
        if self.site_poses.sites:
            _check_rate(problems, "site_poses.rate", self.site_poses.rate, update_rate)
        for part in (self.imu.validate, self.command.validate, self.reset.validate):
            try:
                part()
            except ValueError as error:
                problems.append(str(error))
        if problems:
            raise ValueError("; ".join(problems))


ROBOT_SECTIONS = ("joint_states", "imu", "odom", "site_poses", "command", "reset")
"""RobotConfig's fields, each declared as parameters under '<section>.'."""
