"""The MuJoCo world's samples as standard ROS 2 messages (no node, no rclpy.init needed).

Stamps are sim time. Quaternions go out as geometry_msgs has them, (x, y, z, w), which is
the order of the world's samples. Covariances are the configured noise variances on the
diagonal (0 where the value is exact), as a driver that knows its noise fills them in.
"""

from __future__ import annotations

import array

import numpy as np
from builtin_interfaces.msg import Time
from geometry_msgs.msg import Point, Pose, PoseStamped, Quaternion, Twist, Vector3
from nav_msgs.msg import Odometry
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Imu, JointState
from std_msgs.msg import Header

from unilab_ros.robot.samples import ImuSample, JointStateSample, OdometrySample, PoseSample
from unilab_ros.sims.mujoco_config import ImuConfig


def stamp(time_ns: int) -> Time:
    sec, nanosec = divmod(time_ns, 1_000_000_000)
    return Time(sec=sec, nanosec=nanosec)


def clock_msg(time_ns: int) -> Clock:
    return Clock(clock=stamp(time_ns))


def _header(time_ns: int, frame_id: str) -> Header:
    return Header(stamp=stamp(time_ns), frame_id=frame_id)


def _vector(values: np.ndarray) -> Vector3:
    return Vector3(x=float(values[0]), y=float(values[1]), z=float(values[2]))


def _quaternion(xyzw: np.ndarray) -> Quaternion:
    return Quaternion(x=float(xyzw[0]), y=float(xyzw[1]), z=float(xyzw[2]), w=float(xyzw[3]))


def _pose(position: np.ndarray, xyzw: np.ndarray) -> Pose:
    return Pose(position=Point(x=float(position[0]), y=float(position[1]),
                               z=float(position[2])),
                orientation=_quaternion(xyzw))


def joint_state_msg(sample: JointStateSample, time_ns: int) -> JointState:
    msg = JointState(header=_header(time_ns, ""), name=list(sample.names))
    # From bytes: assigning numpy arrays to sequence fields goes element by element.
    msg.position = array.array("d", sample.position.tobytes())
    msg.velocity = array.array("d", sample.velocity.tobytes())
    msg.effort = array.array("d", sample.effort.tobytes())
    return msg


def _diagonal(variance: float) -> array.array:
    return array.array("d", [variance, 0.0, 0.0, 0.0, variance, 0.0, 0.0, 0.0, variance])


def imu_msg(sample: ImuSample, time_ns: int, frame_id: str, noise: ImuConfig) -> Imu:
    return Imu(header=_header(time_ns, frame_id),
               orientation=_quaternion(sample.orientation_xyzw),
               orientation_covariance=_diagonal(noise.orientation_noise ** 2),
               angular_velocity=_vector(sample.angular_velocity),
               angular_velocity_covariance=_diagonal(noise.angular_velocity_noise ** 2),
               linear_acceleration=_vector(sample.linear_acceleration),
               linear_acceleration_covariance=_diagonal(noise.linear_acceleration_noise ** 2))


def odometry_msg(sample: OdometrySample, time_ns: int, frame_id: str,
                 child_frame_id: str) -> Odometry:
    msg = Odometry(header=_header(time_ns, frame_id), child_frame_id=child_frame_id)
    msg.pose.pose = _pose(sample.position, sample.orientation_xyzw)
    msg.twist.twist = Twist(linear=_vector(sample.linear),
                            angular=_vector(sample.angular))
    return msg


def pose_msg(sample: PoseSample, time_ns: int, frame_id: str) -> PoseStamped:
    return PoseStamped(header=_header(time_ns, frame_id),
                       pose=_pose(sample.position, sample.orientation_xyzw))
