"""ros_robot_io: standard ROS 2 messages to the robot spec's samples and joint commands to
messages, with real message objects (no rclpy.init, no graph), and a round trip from the
MuJoCo robot node's message builders into the shipped specs' observations."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from builtin_interfaces.msg import Time
from geometry_msgs.msg import (
    Point,
    Pose,
    PoseStamped,
    Quaternion,
    Twist,
    TwistStamped,
    Vector3,
)
from nav_msgs.msg import Odometry
from sensor_msgs.msg import Imu, JointState
from std_msgs.msg import Float32MultiArray, Float64MultiArray, Header, MultiArrayLayout
from test_mujoco_robot_config import parameters
from trajectory_msgs.msg import JointTrajectory

from unilab_ros.robot.extract import joint_values, projected_gravity
from unilab_ros.robot.joint_commands import JointCommands
from unilab_ros.robot.observation import ObservationBuilder
from unilab_ros.robot.samples import (
    SAMPLE_TYPES,
    ArraySample,
    ImuSample,
    JointStateSample,
    OdometrySample,
    PoseSample,
    TwistSample,
)
from unilab_ros.robot.spec import load_spec
from unilab_ros.ros.messages import MessageError
from unilab_ros.ros.spec_messages import (
    MAGNITUDE_LIMIT,
    ahead_reason,
    command_message,
    command_message_type,
    message_type,
    ros_type_name,
    to_sample,
)
from unilab_ros.sims import mujoco_messages
from unilab_ros.sims.mujoco_config import RobotConfig, WorldConfig
from unilab_ros.sims.mujoco_robot_node import SECTIONS
from unilab_ros.sims.mujoco_world import MujocoWorld, model_path

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted((ROOT / "config" / "robot_specs").glob("*.yaml"))
HALF = math.sqrt(0.5)
STAMP = Header(stamp=Time(sec=12, nanosec=500_000_000), frame_id="base_link")
ARRIVAL = 12.6


def vector(x: float, y: float, z: float) -> Vector3:
    return Vector3(x=x, y=y, z=z)


def pose(position=(1.0, 2.0, 3.0), xyzw=(0.0, 0.0, HALF, HALF)) -> Pose:
    x, y, z, w = xyzw
    return Pose(position=Point(x=position[0], y=position[1], z=position[2]),
                orientation=Quaternion(x=x, y=y, z=z, w=w))


def joint_state(names=("hinge", "extra", "slider"), position=(0.1, 9.0, -0.3),
                velocity=(1.0, 9.0, 2.0), effort=(0.5, 9.0, -4.0),
                header=STAMP) -> JointState:
    return JointState(header=header, name=list(names), position=list(position),
                      velocity=list(velocity), effort=list(effort))


def imu(xyzw=(0.0, 0.0, HALF, HALF), angular=(0.1, 0.2, 0.3),
        header=STAMP) -> Imu:
    return Imu(header=header, orientation=pose(xyzw=xyzw).orientation,
               angular_velocity=vector(*angular), linear_acceleration=vector(0.0, 0.0, 9.81))


def odometry(xyzw=(0.0, 0.0, HALF, HALF), header=STAMP, position=(1.0, 2.0, 3.0)
             ) -> Odometry:
    msg = Odometry(header=header, child_frame_id="base_link")
    msg.pose.pose = pose(position=position, xyzw=xyzw)
    msg.twist.twist = Twist(linear=vector(0.5, 0.0, -0.1), angular=vector(0.0, 0.0, 0.7))
    return msg


def test_every_source_type_has_a_message_to_subscribe_that_it_decodes():
    for source_type in SAMPLE_TYPES:
        msg_type = message_type(source_type)
        assert isinstance(msg_type, type)
        # Default-built messages carry zeros and unit quaternions; a joint state needs
        # names, a stamped message its stamp.
        msg = (msg_type(name=["j"], position=[0.0]) if source_type == "joint_state"
               else msg_type())
        if hasattr(msg, "header"):
            msg.header = STAMP
        sample = to_sample(source_type, msg, ARRIVAL)
        assert isinstance(sample, SAMPLE_TYPES[source_type]), source_type
    assert message_type("float_array") is Float64MultiArray
    assert message_type("twist") is Twist and message_type("twist_stamped") is TwistStamped


def test_the_advertised_type_picks_the_float_array_and_a_mismatch_names_it():
    assert message_type("float_array", ["std_msgs/msg/Float32MultiArray"]) is Float32MultiArray
    assert message_type("imu", [ros_type_name(Imu)]) is Imu
    with pytest.raises(ValueError, match=r"a twist source takes geometry_msgs/msg/Twist; the "
                                         r"topic carries \['geometry_msgs/msg/TwistStamped'\]"):
        message_type("twist", ["geometry_msgs/msg/TwistStamped"])
    with pytest.raises(ValueError, match="unknown source type 'laser'"):
        message_type("laser")
    with pytest.raises(ValueError, match="unknown source type 'laser'"):
        to_sample("laser", Twist(), ARRIVAL)


def test_a_joint_state_keeps_its_wire_order_and_names_pick_the_joints():
    sample = to_sample("joint_state", joint_state(), ARRIVAL)
    assert isinstance(sample, JointStateSample)
    assert sample.names == ("hinge", "extra", "slider")
    np.testing.assert_array_equal(sample.position, [0.1, 9.0, -0.3])
    np.testing.assert_array_equal(sample.velocity, [1.0, 9.0, 2.0])
    np.testing.assert_array_equal(sample.effort, [0.5, 9.0, -4.0])
    assert sample.stamp == pytest.approx(12.5, abs=1e-12)
    # The extra joint is ignored and the spec's order comes from the names (extract).
    np.testing.assert_array_equal(joint_values(sample, ["slider", "hinge"], "position"),
                                  [-0.3, 0.1])
    np.testing.assert_array_equal(joint_values(sample, ["slider", "hinge"], "effort"),
                                  [-4.0, 0.5])


def test_a_joint_state_may_leave_velocity_and_effort_empty():
    sample = to_sample("joint_state", joint_state(velocity=(), effort=()), ARRIVAL)
    assert sample.velocity.size == 0 and sample.effort.size == 0
    assert sample.position.tolist() == [0.1, 9.0, -0.3]
    with pytest.raises(ValueError, match="3 names but 0 velocity values"):
        joint_values(sample, ["hinge"], "velocity")


def test_imu_odometry_twist_pose_and_arrays_against_hand_set_values():
    sample = to_sample("imu", imu(), ARRIVAL)
    assert isinstance(sample, ImuSample) and sample.stamp == pytest.approx(12.5)
    np.testing.assert_allclose(sample.orientation_xyzw, [0.0, 0.0, HALF, HALF])
    np.testing.assert_allclose(sample.angular_velocity, [0.1, 0.2, 0.3])
    np.testing.assert_allclose(sample.linear_acceleration, [0.0, 0.0, 9.81])

    sample = to_sample("odometry", odometry(), ARRIVAL)
    assert isinstance(sample, OdometrySample) and sample.child_frame_id == "base_link"
    np.testing.assert_allclose(sample.position, [1.0, 2.0, 3.0])
    np.testing.assert_allclose(sample.orientation_xyzw, [0.0, 0.0, HALF, HALF])
    np.testing.assert_allclose(sample.linear, [0.5, 0.0, -0.1])
    np.testing.assert_allclose(sample.angular, [0.0, 0.0, 0.7])
    assert sample.stamp == pytest.approx(12.5)

    twist = Twist(linear=vector(0.3, -0.2, 0.0), angular=vector(0.0, 0.0, 1.5))
    sample = to_sample("twist", twist, ARRIVAL)
    assert isinstance(sample, TwistSample) and sample.stamp is None
    np.testing.assert_allclose(sample.linear, [0.3, -0.2, 0.0])
    np.testing.assert_allclose(sample.angular, [0.0, 0.0, 1.5])
    sample = to_sample("twist_stamped", TwistStamped(header=STAMP, twist=twist), ARRIVAL)
    assert sample.stamp == pytest.approx(12.5)
    np.testing.assert_allclose(sample.angular, [0.0, 0.0, 1.5])

    sample = to_sample("pose_stamped", PoseStamped(header=STAMP, pose=pose()), ARRIVAL)
    assert isinstance(sample, PoseSample) and sample.stamp == pytest.approx(12.5)
    np.testing.assert_allclose(sample.position, [1.0, 2.0, 3.0])
    np.testing.assert_allclose(sample.orientation_xyzw, [0.0, 0.0, HALF, HALF])

    for msg_type in (Float32MultiArray, Float64MultiArray):
        sample = to_sample("float_array", msg_type(data=[1.5, -2.0, 0.25]), ARRIVAL)
        assert isinstance(sample, ArraySample) and sample.stamp is None
        assert sample.data.dtype == np.float64 and sample.data.tolist() == [1.5, -2.0, 0.25]


@pytest.mark.parametrize("source_type, msg", [
    ("joint_state", joint_state(header=Header())),
    ("imu", imu(header=Header())),
    ("odometry", odometry(header=Header())),
    ("twist_stamped", TwistStamped()),
    ("pose_stamped", PoseStamped(pose=pose())),
], ids=lambda value: value if isinstance(value, str) else "")
def test_a_zero_stamp_is_refused_not_taken_as_fresh_data(source_type, msg):
    """Issue 41 (9): a stamp of 0 (unset) with fabricated data was taken as fresh, its
    arrival time standing in for it. A stamped type must carry its time."""
    with pytest.raises(MessageError, match=r"header.stamp is 0 \(unset\)"):
        to_sample(source_type, msg, ARRIVAL)


@pytest.mark.parametrize("source_type, msg, reason", [
    ("joint_state", joint_state(position=(0.1, 1e150, 0.0)), r"position\[1\] is 1e\+150"),
    ("joint_state", joint_state(velocity=(0.0, 0.0, -1e200)), r"velocity\[2\] is -1e\+200"),
    ("imu", imu(angular=(0.0, 2e6, 0.0)), r"angular_velocity\[1\] is 2e\+06"),
    ("odometry", odometry(position=(1e300, 0.0, 0.0)), r"pose.position\[0\] is 1e\+300"),
    ("float_array", Float64MultiArray(data=[0.0, 1e40]), r"data\[1\] is 1e\+40"),
], ids=lambda value: "" if not isinstance(value, str) or " " in value else value)
def test_a_finite_absurd_value_is_refused_before_it_reaches_a_term(source_type, msg, reason):
    """Issue 41 (8): 1e150 / 1e200 joint positions were accepted; the reward became -inf and
    the whole update was lost. Values beyond MAGNITUDE_LIMIT are a driver fault."""
    with pytest.raises(MessageError, match=reason + ".*beyond"):
        to_sample(source_type, msg, ARRIVAL)
    assert MAGNITUDE_LIMIT ** 2 < np.finfo(np.float32).max


def test_no_node_clock_yet_is_not_another_clock():
    """Issue 41 (7): before /clock arrives a node on sim time reads 0, and every stamp was
    refused as "ahead of the node clock (0 s): the publisher uses another clock"."""
    assert to_sample("imu", imu(), arrival_s=0.0).stamp == pytest.approx(12.5)
    assert to_sample("imu", imu(), arrival_s=None).stamp == pytest.approx(12.5)
    assert ahead_reason(to_sample("imu", imu(), None), 0.0) == ""
    assert "another clock" in ahead_reason(to_sample("imu", imu(), None), 5.0)


def test_the_quaternion_is_read_x_y_z_w():
    # +90 deg about x: the body's y axis points up, so gravity (world -z) is body -y. Read
    # as (w, x, y, z) the same four numbers would give another rotation.
    sample = to_sample("imu", imu(xyzw=(HALF, 0.0, 0.0, HALF)), ARRIVAL)
    np.testing.assert_allclose(sample.orientation_xyzw, [HALF, 0.0, 0.0, HALF])
    np.testing.assert_allclose(projected_gravity(sample.orientation_xyzw), [0.0, -1.0, 0.0],
                               atol=1e-12)
    # +90 deg about z (yaw): gravity stays body -z.
    sample = to_sample("odometry", odometry(), ARRIVAL)
    np.testing.assert_allclose(projected_gravity(sample.orientation_xyzw), [0.0, 0.0, -1.0],
                               atol=1e-12)


def test_an_imu_without_orientation_gives_none_that_terms_refuse():
    msg = imu(xyzw=(0.0, 0.0, 0.0, 0.0))
    msg.orientation_covariance[0] = -1.0
    sample = to_sample("imu", msg, ARRIVAL)
    assert sample.orientation_xyzw.tolist() == [0.0, 0.0, 0.0, 0.0]
    np.testing.assert_allclose(sample.angular_velocity, [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="is no quaternion"):
        projected_gravity(sample.orientation_xyzw)


def offset_array() -> Float64MultiArray:
    return Float64MultiArray(layout=MultiArrayLayout(data_offset=1), data=[1.0, 2.0])


@pytest.mark.parametrize("source_type, msg, reason", [
    ("joint_state", joint_state(position=(0.1, math.nan, 0.0)),
     r"joint_state: position\[1\] is nan"),
    ("joint_state", joint_state(velocity=(1.0, 2.0)), "joint_state: 3 names but 2 velocity"),
    ("joint_state", joint_state(effort=(1.0, 2.0, 3.0, 4.0)), "3 names but 4 effort values"),
    ("joint_state", joint_state(position=()), "3 names but 0 position values"),
    ("joint_state", joint_state(names=("a", "b", "a")), r"joint name\(s\) \['a'\] appear"),
    ("joint_state", joint_state(names=(), position=(), velocity=(), effort=()),
     "no joint names"),
    ("imu", imu(angular=(0.0, math.inf, 0.0)), r"imu: angular_velocity\[1\] is inf"),
    ("imu", imu(xyzw=(0.0, 0.0, 0.0, 2.0)), r"imu: orientation .* has norm 2, not 1"),
    ("odometry", odometry(xyzw=(0.0, 0.0, 0.0, 0.0)), "pose.orientation .* has norm 0"),
    ("pose_stamped", PoseStamped(header=STAMP, pose=pose(position=(math.nan, 0.0, 0.0))),
     r"pose_stamped: pose.position\[0\] is nan"),
    ("twist", Twist(angular=vector(0.0, 0.0, -math.inf)), r"twist: angular\[2\] is -inf"),
    ("twist_stamped", TwistStamped(header=Header(stamp=Time(sec=1, nanosec=1_000_000_000))),
     "nanosec 1000000000 is not below 1e9"),
    ("pose_stamped", PoseStamped(header=Header(stamp=Time(sec=1_700_000_000)), pose=pose()),
     "ahead of the node clock .*another clock"),
    ("float_array", Float32MultiArray(data=[0.0, math.nan]), r"float_array: data\[1\] is nan"),
    ("float_array", offset_array(), "data_offset must be 0, got 1"),
    ("imu", Twist(), "imu: takes sensor_msgs/msg/Imu, got Twist"),
    ("float_array", JointState(), "takes std_msgs/msg/Float64MultiArray or "
                                  "std_msgs/msg/Float32MultiArray"),
], ids=lambda value: "" if not isinstance(value, str) or " " in value else value)
def test_a_broken_message_raises_with_its_reason(source_type, msg, reason):
    with pytest.raises(MessageError, match=reason) as caught:
        to_sample(source_type, msg, ARRIVAL)
    assert caught.value.reason.startswith(f"{source_type}: ")


def test_a_stamp_within_the_tolerance_ahead_is_kept():
    sample = to_sample("imu", imu(), arrival_s=12.0)
    assert sample.stamp == pytest.approx(12.5)
    with pytest.raises(MessageError, match="0.5 s ahead"):
        to_sample("imu", imu(), arrival_s=12.0, future_tolerance_s=0.1)


def with_output(spec, output: str, interface: str | None = None):
    actions = dataclasses.replace(spec.actions, output=output,
                                  interface=interface or spec.actions.interface)
    return dataclasses.replace(spec, actions=actions)


@pytest.mark.parametrize("path", SPECS, ids=lambda path: path.stem)
def test_the_shipped_specs_command_through_both_messages(path):
    spec = load_spec(path)
    joints = spec.actions.joints
    values = JointCommands(spec)(np.linspace(-1.0, 1.0, len(joints)))

    assert command_message_type(spec) is Float64MultiArray
    msg = command_message(spec, values)
    assert isinstance(msg, Float64MultiArray)
    np.testing.assert_array_equal(np.frombuffer(msg.data, np.float64), values)
    assert [(d.label, d.size) for d in msg.layout.dim] == [("joints", len(joints))]

    for interface, field in [("position", "positions"), ("velocity", "velocities"),
                             ("effort", "effort")]:
        trajectory_spec = with_output(spec, "joint_trajectory", interface)
        assert command_message_type(trajectory_spec) is JointTrajectory
        msg = command_message(trajectory_spec, values)
        assert isinstance(msg, JointTrajectory) and msg.joint_names == list(joints)
        (point,) = msg.points
        np.testing.assert_array_equal(getattr(point, field), values)
        others = {"positions", "velocities", "accelerations", "effort"} - {field}
        assert all(len(getattr(point, other)) == 0 for other in others), interface
        assert (point.time_from_start.sec, point.time_from_start.nanosec) == (0, 20_000_000)
        assert (msg.header.stamp.sec, msg.header.stamp.nanosec) == (0, 0)
    stamped = command_message(with_output(spec, "joint_trajectory"), values, stamp=3.25)
    assert (stamped.header.stamp.sec, stamped.header.stamp.nanosec) == (3, 250_000_000)


def test_a_command_of_the_wrong_size_or_not_finite_is_refused():
    spec = load_spec(ROOT / "config" / "robot_specs" / "reacher.yaml")
    for output in ("float64_multi_array", "joint_trajectory"):
        with pytest.raises(ValueError, match=r"3 command values for 2 joints \['shoulder'"):
            command_message(with_output(spec, output), np.zeros(3))
        with pytest.raises(ValueError, match="non-finite joint command"):
            command_message(with_output(spec, output), np.array([0.0, math.nan]))


def shipped_world(name: str) -> MujocoWorld:
    values = parameters(ROOT / "config" / "robots" / f"{name}.yaml")
    world = WorldConfig(**{k: v for k, v in values.items() if "." not in k})
    sections = {section: cls(**{k.split(".", 1)[1]: v for k, v in values.items()
                                if k.startswith(f"{section}.")})
                for section, cls in SECTIONS.items()}
    robot = RobotConfig(**sections)
    return MujocoWorld(model_path(world.model), 1, robot, world.update_rate, world.seed)


def node_message(world: MujocoWorld, source_type: str, topic: str):
    """What the MuJoCo robot node publishes on ``topic`` now (its builders, no node)."""
    now, cfg = world.time_ns, world.config
    if source_type == "joint_state":
        return mujoco_messages.joint_state_msg(world.joint_state(0), now)
    if source_type == "imu":
        return mujoco_messages.imu_msg(world.imu(0), now, cfg.imu.frame_id, cfg.imu)
    if source_type == "odometry":
        return mujoco_messages.odometry_msg(world.odometry(0), now, cfg.odom.frame_id,
                                           cfg.odom.child_frame_id)
    site = topic.removesuffix("/pose")
    return mujoco_messages.pose_msg(world.site_pose(0, site), now, cfg.site_poses.frame_id)


@pytest.mark.parametrize("path", SPECS, ids=lambda path: path.stem)
def test_the_mujoco_nodes_messages_build_the_shipped_specs_observations(path):
    spec = load_spec(path)
    world = shipped_world(spec.name)
    commands = JointCommands(spec)
    builder = ObservationBuilder(spec)
    drawn = {c.name: np.zeros(c.dim) for c in spec.commands if not c.source}
    action = np.zeros(commands.dim)
    for tick in range(5):
        # The command goes out as the controller would receive it, and is held by the world.
        msg = command_message(spec, commands(action))
        assert world.set_command(0, np.frombuffer(msg.data, np.float64)).accepted
        world.step()
        now = world.time
        samples = {s.name: to_sample(s.type, node_message(world, s.type, s.topic), now)
                   for s in spec.sources}
        assert all(sample.stamp == pytest.approx(now) for sample in samples.values())
        obs = builder.build(samples, action, drawn)
        assert obs.shape == (builder.dim,) and np.isfinite(obs).all()
        action = np.full(commands.dim, 0.5 * (-1) ** tick)
    # The first term's values are the world's: joints by name from the wire sample, or the
    # base velocity from odometry (history 1: the newest values come first).
    first = spec.observation[0]
    assert first.history == 1
    if first.kind == "joint_pos_rel":
        state = world.joint_state(0)
        expected = [state.position[state.names.index(j)] - spec.default_pose[j]
                    for j in first.params["joints"]]
    else:
        assert first.kind == "base_lin_vel"
        expected = first.scale[0] * world.odometry(0).linear
    np.testing.assert_allclose(obs[:len(expected)], expected, rtol=1e-5, atol=1e-6)
