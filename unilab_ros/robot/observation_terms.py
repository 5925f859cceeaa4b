"""Observation terms: each a pure function of the newest samples, one registry entry each.

Frames: IMU values are in the sensor frame; odometry twists in its ``child_frame_id`` (the
base); quaternions (x, y, z, w).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from unilab_ros.robot.extract import joint_values, projected_gravity
from unilab_ros.robot.samples import ImuSample, OdometrySample, PoseSample, TwistSample
from unilab_ros.robot.terms import POSE_TYPES, Sizes, TermContext, TermKind, fixed, per_joint

Params = Mapping[str, Any]


def joint_pos_rel(ctx: TermContext, source: str, p: Params) -> np.ndarray:
    """Joint positions minus the default pose, in the order of ``joints``."""
    default = np.array([ctx.default_pose[j] for j in p["joints"]])
    return joint_values(ctx.samples[source], p["joints"], "position") - default


def joint_vel(ctx: TermContext, source: str, p: Params) -> np.ndarray:
    return joint_values(ctx.samples[source], p["joints"], "velocity")


def joint_effort(ctx: TermContext, source: str, p: Params) -> np.ndarray:
    return joint_values(ctx.samples[source], p["joints"], "effort")


def gravity(ctx: TermContext, source: str, _p: Params) -> np.ndarray:
    """The unit gravity direction in the base (or sensor) frame: (0, 0, -1) upright."""
    sample = ctx.samples[source]
    assert isinstance(sample, ImuSample | OdometrySample | PoseSample)
    return projected_gravity(sample.orientation_xyzw)


def base_ang_vel(ctx: TermContext, source: str, _p: Params) -> np.ndarray:
    """rad/s: the IMU's (sensor frame) or the odometry's (child frame)."""
    sample = ctx.samples[source]
    if isinstance(sample, ImuSample):
        return np.asarray(sample.angular_velocity, np.float64)
    assert isinstance(sample, OdometrySample | TwistSample)
    return np.asarray(sample.angular, np.float64)


def base_lin_vel(ctx: TermContext, source: str, _p: Params) -> np.ndarray:
    """m/s in the odometry's child frame (the base), or a twist's."""
    sample = ctx.samples[source]
    assert isinstance(sample, OdometrySample | TwistSample)
    return np.asarray(sample.linear, np.float64)


def position(ctx: TermContext, source: str) -> np.ndarray:
    """A pose or odometry source's position."""
    sample = ctx.samples[source]
    assert isinstance(sample, OdometrySample | PoseSample)
    return np.asarray(sample.position, np.float64)


def base_height(ctx: TermContext, source: str, _p: Params) -> np.ndarray:
    """z of the base's position (m, in the odometry frame: height above the start plane)."""
    return position(ctx, source)[2:3]


def command(ctx: TermContext, _source: str, p: Params) -> np.ndarray:
    return np.asarray(ctx.commands[p["command"]], np.float64)


def target_position(ctx: TermContext, _source: str, p: Params) -> np.ndarray:
    """A target's position (a command of 3 values); with ``relative_to``, minus that
    site's position (both in the same frame: the one of their messages)."""
    target = np.asarray(ctx.commands[p["command"]], np.float64)
    return target - position(ctx, p["relative_to"]) if p["relative_to"] else target


def last_action(ctx: TermContext, _source: str, _p: Params) -> np.ndarray:
    """The latest action sent, in policy units (before scale and limits)."""
    return np.asarray(ctx.action, np.float64)


def array_field(ctx: TermContext, source: str, p: Params) -> np.ndarray:
    data = np.asarray(ctx.samples[source].data, np.float64).reshape(-1)
    if max(p["indices"]) >= data.size:
        raise ValueError(f"source {source!r} has {data.size} values; the spec reads index "
                         f"{max(p['indices'])}")
    return data[p["indices"]]


def _command_size(p: Params, sizes: Sizes) -> int:
    return sizes.commands[p["command"]]


_JOINTS = {"joints": "joints"}
OBSERVATIONS: dict[str, TermKind] = {
    "joint_pos_rel": TermKind(joint_pos_rel, ("joint_state",), _JOINTS, dim=per_joint),
    "joint_vel": TermKind(joint_vel, ("joint_state",), _JOINTS, dim=per_joint),
    "joint_effort": TermKind(joint_effort, ("joint_state",), _JOINTS, dim=per_joint),
    "projected_gravity": TermKind(gravity, ("imu", *POSE_TYPES), dim=fixed(3)),
    "base_ang_vel": TermKind(base_ang_vel, ("imu", "odometry", "twist", "twist_stamped"),
                             dim=fixed(3)),
    "base_lin_vel": TermKind(base_lin_vel, ("odometry", "twist", "twist_stamped"),
                             dim=fixed(3)),
    "base_height": TermKind(base_height, POSE_TYPES, dim=fixed(1)),
    "command": TermKind(command, (), {"command": "command"}, dim=_command_size),
    "target_position": TermKind(target_position, (),
                                {"command": "command", "relative_to": "pose_source"},
                                {"relative_to": ""}, dim=_command_size),
    "last_action": TermKind(last_action, (), dim=lambda _p, sizes: sizes.action),
    "array_field": TermKind(array_field, ("float_array",), {"indices": "indices"},
                            dim=lambda p, _sizes: len(p["indices"])),
}
"""Observation kinds; a new one is a function above and an entry here."""
