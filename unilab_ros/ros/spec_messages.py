"""Standard ROS 2 messages to the robot spec's samples, and joint commands to messages.

The robot spec package (``unilab_ros.robot``) is ROS-free so the trainer and a deploy runtime
build the same observation anywhere; this module is the ROS side. Decoding checks the message
contract and raises ``MessageError`` with a one-line reason, so a subscriber can log, count
and drop a broken message before a sample exists: non-finite values, finite values beyond
``MAGNITUDE_LIMIT`` (1e150 as a joint position: it would make the reward -inf and cost an
update), JointState arrays whose lengths disagree with ``name``, a quaternion not of unit
norm, a stamped message whose stamp is unset (0), a stamp ahead of the clock.

- Quaternions stay (x, y, z, w), as geometry_msgs has them: no reordering happens here.
- Stamps are the header stamp in seconds on the node clock. A stamped type (JointState, Imu,
  Odometry, TwistStamped, PoseStamped) with a zero stamp is refused: its age cannot be known,
  and data that claims no time must not count as fresh (a driver that leaves it unset
  publishes the unstamped type, or stamps). An unstamped type (Twist, a multi-array) gives
  ``stamp=None``: the step source then takes the arrival time.
- A JointState keeps its wire order; names are matched in the robot package (``extract``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from builtin_interfaces.msg import Duration, Time
from geometry_msgs.msg import Point, PoseStamped, Quaternion, Twist, TwistStamped, Vector3
from nav_msgs.msg import Odometry
from sensor_msgs.msg import Imu, JointState
from std_msgs.msg import Float32MultiArray, Float64MultiArray, Header
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from unilab_ros.robot.samples import (
    ArraySample,
    ImuSample,
    JointStateSample,
    OdometrySample,
    PoseSample,
    Sample,
    TwistSample,
)
from unilab_ros.robot.spec_types import RobotSpec
from unilab_ros.ros.messages import MessageError, to_float64_msg

FUTURE_TOLERANCE_S = 1.0
"""Seconds a stamp may lead the node clock. A stamp further ahead comes from another clock
(wall time against sim time: ``use_sim_time`` set on one side only); its age would stay
negative, so stale data would never be noticed. Within it: skew and a /clock message that
arrives after the data it stamps."""
MAGNITUDE_LIMIT = 1e6
"""The largest magnitude a decoded value may have. In SI units no joint position, velocity or
effort, IMU reading or pose coordinate of a robot reaches it (a million metres, radians per
second or newtons); a value beyond it is a driver fault. Below it, squares stay finite even
in float32 (the observation's type), so no reward or observation term overflows."""
QUATERNION_NORM_TOLERANCE = 1e-2
"""How far from 1 a quaternion's norm may be: drivers normalise to float32 precision, so a
norm further off is a driver fault (or a zero quaternion left unset)."""

_ACCEPTED: dict[str, tuple[type, ...]] = {
    "joint_state": (JointState,),
    "imu": (Imu,),
    "odometry": (Odometry,),
    "twist": (Twist,),
    "twist_stamped": (TwistStamped,),
    "pose_stamped": (PoseStamped,),
    "float_array": (Float64MultiArray, Float32MultiArray),
}
"""The messages each spec source type (``samples.SAMPLE_TYPES``) decodes, the one subscribed
by default first."""


def ros_type_name(msg_type: type) -> str:
    """``pkg/msg/Name``, as ``ros2 topic info`` and ``get_topic_names_and_types`` spell it."""
    return f"{msg_type.__module__.split('.')[0]}/msg/{msg_type.__name__}"


def _accepted(source_type: str) -> tuple[type, ...]:
    if source_type not in _ACCEPTED:
        raise ValueError(f"unknown source type {source_type!r} (one of {sorted(_ACCEPTED)})")
    return _ACCEPTED[source_type]


def message_type(source_type: str, advertised: Sequence[str] = ()) -> type:
    """The message class to subscribe for ``source_type``.

    A float array may be Float64MultiArray (the default: ros2_control's type) or
    Float32MultiArray; ``advertised`` (the topic's types in the graph) picks the one the
    publisher uses. Advertised types none of which fit are an error naming them: a
    subscription of the wrong type would silently receive nothing.
    """
    accepted = _accepted(source_type)
    if not advertised:
        return accepted[0]
    for msg_type in accepted:
        if ros_type_name(msg_type) in advertised:
            return msg_type
    raise ValueError(f"a {source_type} source takes "
                     f"{' or '.join(ros_type_name(t) for t in accepted)}; the topic carries "
                     f"{list(advertised)}")


def to_sample(source_type: str, msg: object, arrival_s: float | None,
              future_tolerance_s: float = FUTURE_TOLERANCE_S) -> Sample:
    """The sample of ``msg`` for a source of ``source_type``; ``arrival_s`` is the node
    clock's time at arrival (seconds), against which the stamp is checked (``ahead_reason``);
    None, or 0 (a node on sim time before the first /clock: no clock to compare with),
    skips that check.

    Raises MessageError (reason prefixed with the source type) for a message that breaks
    its contract, or of a type the source does not take.
    """
    accepted = _accepted(source_type)
    try:
        if not isinstance(msg, accepted):
            raise MessageError(f"takes {' or '.join(ros_type_name(t) for t in accepted)}, "
                               f"got {type(msg).__name__}")
        sample = _DECODERS[source_type](msg)
        ahead = ahead_reason(sample, arrival_s, future_tolerance_s)
        if ahead:
            raise MessageError(ahead)
    except MessageError as error:
        raise MessageError(f"{source_type}: {error.reason}") from None
    return sample


def ahead_reason(sample: Sample, now_s: float | None,
                 future_tolerance_s: float = FUTURE_TOLERANCE_S) -> str:
    """Why ``sample``'s stamp cannot be on the node clock, which reads ``now_s``: it leads it
    by more than the tolerance (empty when it does not, or when there is no clock yet)."""
    if sample.stamp is None or not now_s or sample.stamp <= now_s + future_tolerance_s:
        return ""
    return (f"stamp {sample.stamp:.9g} s is {sample.stamp - now_s:.3g} s ahead of the node "
            f"clock ({now_s:.9g} s): the publisher uses another clock (use_sim_time?)")


def _stamp(header: Header) -> float:
    stamp = header.stamp
    if stamp.nanosec >= 1_000_000_000:
        raise MessageError(f"header.stamp.nanosec {stamp.nanosec} is not below 1e9")
    if stamp.sec == 0 and stamp.nanosec == 0:
        raise MessageError("header.stamp is 0 (unset): the data's age cannot be known, so "
                           "it is not taken as fresh (stamp it, or publish the unstamped "
                           "type)")
    return stamp.sec + stamp.nanosec * 1e-9


def _finite(values: np.ndarray, what: str) -> np.ndarray:
    """``values``, once each is finite and within ``MAGNITUDE_LIMIT``."""
    if not np.isfinite(values).all():
        bad = int(np.flatnonzero(~np.isfinite(values))[0])
        raise MessageError(f"{what}[{bad}] is {values[bad]}")
    if values.size and np.abs(values).max() > MAGNITUDE_LIMIT:
        bad = int(np.argmax(np.abs(values)))
        raise MessageError(f"{what}[{bad}] is {values[bad]:.6g}, beyond +-{MAGNITUDE_LIMIT:g} "
                           "(no robot reports that: a driver fault)")
    return values


def _array(values: Sequence[float], what: str) -> np.ndarray:
    # np.array reads rosidl's array.array through the buffer protocol: no per-element loop.
    return _finite(np.array(values, np.float64).reshape(-1), what)


def _vector(vector: Vector3 | Point, what: str) -> np.ndarray:
    return _finite(np.array([vector.x, vector.y, vector.z]), what)


def _quaternion(quaternion: Quaternion, what: str) -> np.ndarray:
    xyzw = _finite(np.array([quaternion.x, quaternion.y, quaternion.z, quaternion.w]), what)
    norm = float(np.linalg.norm(xyzw))
    if abs(norm - 1.0) > QUATERNION_NORM_TOLERANCE:
        raise MessageError(f"{what} (x, y, z, w) {xyzw.tolist()} has norm {norm:.4g}, not 1")
    return xyzw


def _joint_state(msg: JointState) -> JointStateSample:
    names = tuple(msg.name)
    n = len(names)
    if n == 0:
        raise MessageError("no joint names (joints are matched by name)")
    if len(set(names)) != n:
        repeated = sorted({name for name in names if names.count(name) > 1})
        raise MessageError(f"joint name(s) {repeated} appear more than once")
    fields = {}
    for field in ("position", "velocity", "effort"):
        values = _array(getattr(msg, field), field)
        # ROS lets velocity and effort be empty (a broadcaster without them); a term that
        # reads one then fails by name. Position is what every joint term reads.
        if values.size != n and not (values.size == 0 and field != "position"):
            raise MessageError(f"{n} names but {values.size} {field} values")
        fields[field] = values
    return JointStateSample(names, **fields, stamp=_stamp(msg.header))


def _imu(msg: Imu) -> ImuSample:
    # sensor_msgs/Imu: orientation_covariance[0] = -1 says the IMU estimates no orientation;
    # the sample's is then all zeros, which ``extract.rotate_inverse`` refuses.
    if msg.orientation_covariance[0] == -1.0:
        orientation = np.zeros(4)
    else:
        orientation = _quaternion(msg.orientation, "orientation")
    return ImuSample(orientation, _vector(msg.angular_velocity, "angular_velocity"),
                     _vector(msg.linear_acceleration, "linear_acceleration"),
                     stamp=_stamp(msg.header))


def _odometry(msg: Odometry) -> OdometrySample:
    pose, twist = msg.pose.pose, msg.twist.twist
    return OdometrySample(_vector(pose.position, "pose.position"),
                          _quaternion(pose.orientation, "pose.orientation"),
                          _vector(twist.linear, "twist.linear"),
                          _vector(twist.angular, "twist.angular"),
                          child_frame_id=msg.child_frame_id, stamp=_stamp(msg.header))


def _twist(msg: Twist) -> TwistSample:
    return TwistSample(_vector(msg.linear, "linear"), _vector(msg.angular, "angular"))


def _twist_stamped(msg: TwistStamped) -> TwistSample:
    return TwistSample(_vector(msg.twist.linear, "twist.linear"),
                       _vector(msg.twist.angular, "twist.angular"), stamp=_stamp(msg.header))


def _pose_stamped(msg: PoseStamped) -> PoseSample:
    return PoseSample(_vector(msg.pose.position, "pose.position"),
                      _quaternion(msg.pose.orientation, "pose.orientation"),
                      stamp=_stamp(msg.header))


def _float_array(msg: Float64MultiArray | Float32MultiArray) -> ArraySample:
    # The layout's sizes are the publisher's business (array_field indexes the flat data),
    # but an offset would shift every index.
    if msg.layout.data_offset != 0:
        raise MessageError(f"layout.data_offset must be 0, got {msg.layout.data_offset}")
    return ArraySample(_array(msg.data, "data"))


_DECODERS: dict[str, Callable[[Any], Sample]] = {
    "joint_state": _joint_state, "imu": _imu, "odometry": _odometry, "twist": _twist,
    "twist_stamped": _twist_stamped, "pose_stamped": _pose_stamped,
    "float_array": _float_array,
}


def command_message_type(spec: RobotSpec) -> type:
    """The message the spec's controller takes: Float64MultiArray (forward_command_controller)
    or JointTrajectory (joint_trajectory_controller)."""
    return JointTrajectory if spec.actions.output == "joint_trajectory" else Float64MultiArray


def command_message(spec: RobotSpec, values: np.ndarray, stamp: float | None = None
                    ) -> Float64MultiArray | JointTrajectory:
    """The joint commands ``values`` (joint units, spec joint order, as
    ``robot.actions.JointCommands`` gives them) as the spec's output message.

    Float64MultiArray: positional, since a forward_command_controller maps by its
    ``joints`` parameter, which the spec's order copies. JointTrajectory: the spec's names and
    one point reached one control period later, in the interface's field. Its header gets
    ``stamp`` (seconds); None leaves it zero, which joint_trajectory_controller starts on
    receipt. A free-running loop wants that: with a stamp more than a period old the
    trajectory would end in the past, and the controller rejects such a one. Wrong sizes and
    non-finite values are refused (ValueError): nothing the spec did not define is sent.
    """
    actions = spec.actions
    command = np.asarray(values, np.float64).reshape(-1)
    if command.size != len(actions.joints):
        raise ValueError(f"{command.size} command values for {len(actions.joints)} joints "
                         f"{list(actions.joints)}")
    if not np.isfinite(command).all():
        raise ValueError(f"non-finite joint command {command.tolist()}")
    if command_message_type(spec) is Float64MultiArray:
        return to_float64_msg(command, ("joints",))
    point = JointTrajectoryPoint(time_from_start=Duration(**_split(spec.dt)))
    # Assigned as a list: rosidl turns it into array.array('d') once (a few joints).
    setattr(point, POINT_FIELDS[actions.interface], command.tolist())
    header = Header() if stamp is None else Header(stamp=Time(**_split(stamp)))
    return JointTrajectory(header=header, joint_names=list(actions.joints), points=[point])


POINT_FIELDS = {"position": "positions", "velocity": "velocities", "effort": "effort"}
"""The JointTrajectoryPoint field each interface fills (effort is singular in the msg)."""


def _split(seconds: float) -> dict[str, int]:
    sec, nanosec = divmod(round(seconds * 1e9), 1_000_000_000)
    return {"sec": sec, "nanosec": nanosec}
