"""Decoded messages, one dataclass per source type (the ROS side fills them, ROS-free here).

Quaternions are (x, y, z, w), as geometry_msgs has them. A ``stamp`` is the message's header
stamp in seconds on the node's clock (sim time under ``use_sim_time``); None for an
unstamped message (``Twist``, a plain array), whose arrival time then stands for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class JointStateSample:
    """sensor_msgs/JointState: the joints in the order the broadcaster chose."""

    names: tuple[str, ...]
    """Joint names, in wire order (never assumed to be the URDF's)."""
    position: np.ndarray
    """rad or m, one per name."""
    velocity: np.ndarray
    """rad/s or m/s, one per name."""
    effort: np.ndarray
    """N m or N, one per name."""
    stamp: float | None = None
    """Header stamp, seconds."""


@dataclass(frozen=True)
class ImuSample:
    """sensor_msgs/Imu, in the sensor frame."""

    orientation_xyzw: np.ndarray
    """The sensor frame's orientation in the world, (x, y, z, w)."""
    angular_velocity: np.ndarray
    """rad/s, in the sensor frame."""
    linear_acceleration: np.ndarray
    """m/s^2, gravity included (+9.81 up at rest), in the sensor frame."""
    stamp: float | None = None
    """Header stamp, seconds."""


@dataclass(frozen=True)
class OdometrySample:
    """nav_msgs/Odometry: pose in the header frame, twist in ``child_frame_id``."""

    position: np.ndarray
    """m, in the odometry (header) frame."""
    orientation_xyzw: np.ndarray
    """The base's orientation in the odometry frame, (x, y, z, w)."""
    linear: np.ndarray
    """m/s, in ``child_frame_id`` (the base frame)."""
    angular: np.ndarray
    """rad/s, in ``child_frame_id``."""
    child_frame_id: str = ""
    """The frame of the twist."""
    stamp: float | None = None
    """Header stamp, seconds."""


@dataclass(frozen=True)
class TwistSample:
    """geometry_msgs/Twist (unstamped: stamp None) or TwistStamped."""

    linear: np.ndarray
    """m/s."""
    angular: np.ndarray
    """rad/s."""
    stamp: float | None = None
    """Header stamp of a TwistStamped, seconds."""


@dataclass(frozen=True)
class PoseSample:
    """geometry_msgs/PoseStamped."""

    position: np.ndarray
    """m, in the header frame."""
    orientation_xyzw: np.ndarray
    """(x, y, z, w)."""
    stamp: float | None = None
    """Header stamp, seconds."""


@dataclass(frozen=True)
class ArraySample:
    """A plain float array (std_msgs/Float32MultiArray or Float64MultiArray), unstamped."""

    data: np.ndarray
    """The values, flat."""
    stamp: float | None = None
    """Always None on the wire; set only by a caller that knows better."""


Sample = JointStateSample | ImuSample | OdometrySample | TwistSample | PoseSample | ArraySample

SAMPLE_TYPES: dict[str, type] = {
    "joint_state": JointStateSample,
    "imu": ImuSample,
    "odometry": OdometrySample,
    "twist": TwistSample,
    "twist_stamped": TwistSample,
    "pose_stamped": PoseSample,
    "float_array": ArraySample,
}
"""A spec source's ``type`` and the sample the ROS side decodes its messages into."""
