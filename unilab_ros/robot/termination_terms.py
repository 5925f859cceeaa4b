"""Termination terms: each a pure predicate of the newest samples, one registry entry each.

A termination is a failure (done 1: the episode ended for good, no bootstrap) or a
time-out (done 2: cut, bootstrap with V); each kind has a default the spec may override.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from unilab_ros.robot.extract import joint_values
from unilab_ros.robot.observation_terms import gravity, position
from unilab_ros.robot.terms import POSE_TYPES, TermContext, TermKind, joint_array

Params = Mapping[str, Any]


def episode_length(ctx: TermContext, _source: str, p: Params) -> bool:
    """The episode has had ``max_steps`` steps."""
    return ctx.episode_step >= p["max_steps"]


def tilt(ctx: TermContext, source: str, p: Params) -> float:
    """rad between the base's z axis and the world's up."""
    return float(np.arccos(np.clip(-gravity(ctx, source, p)[2], -1.0, 1.0)))


def orientation_limit(ctx: TermContext, source: str, p: Params) -> bool:
    """The base tilts more than ``limit`` rad from upright."""
    return tilt(ctx, source, p) > p["limit"]


def base_height_below(ctx: TermContext, source: str, p: Params) -> bool:
    return bool(position(ctx, source)[2] < p["minimum"])


def joint_pos_out_of_bounds(ctx: TermContext, source: str, p: Params) -> bool:
    """Any of ``joints`` outside [low, high] (each given once or per joint)."""
    q = joint_values(ctx.samples[source], p["joints"], "position")
    low, high = joint_array(p["low"], p["joints"]), joint_array(p["high"], p["joints"])
    return bool(np.any((q < low) | (q > high)))


def joint_vel_out_of_bounds(ctx: TermContext, source: str, p: Params) -> bool:
    """Any of ``joints`` faster than ``limit`` (once or per joint)."""
    qd = joint_values(ctx.samples[source], p["joints"], "velocity")
    return bool(np.any(np.abs(qd) > joint_array(p["limit"], p["joints"])))


def target_reached(ctx: TermContext, _source: str, p: Params) -> bool:
    """A site is within ``threshold`` m of a target (a command of 3 values)."""
    target = np.asarray(ctx.commands[p["target"]], np.float64)
    return bool(np.linalg.norm(position(ctx, p["site"]) - target) < p["threshold"])


_JOINT_BOUNDS = {"joints": "joints", "low": "floats", "high": "floats"}
TERMINATIONS: dict[str, TermKind] = {
    "episode_length": TermKind(episode_length, (), {"max_steps": "steps"}, time_out=True),
    "orientation_limit": TermKind(orientation_limit, ("imu", *POSE_TYPES),
                                  {"limit": "positive"}),
    "base_height_below": TermKind(base_height_below, POSE_TYPES, {"minimum": "float"}),
    "joint_pos_out_of_bounds": TermKind(joint_pos_out_of_bounds, ("joint_state",),
                                        _JOINT_BOUNDS),
    "joint_vel_out_of_bounds": TermKind(joint_vel_out_of_bounds, ("joint_state",),
                                        {"joints": "joints", "limit": "floats"}),
    "target_reached": TermKind(target_reached, (),
                               {"site": "pose_source", "target": "command",
                                "threshold": "positive"}),
}
"""Termination kinds; a new one is a function above and an entry here."""
