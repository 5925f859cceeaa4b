"""Reward terms: each a pure function giving one number, one registry entry each.

The reward of a step is sum(weight x value x dt), dt = 1 / control_rate (Isaac Lab's and
legged_gym's convention: a weight is per second, so the return of an episode does not
change with the control rate). Penalties have positive values: give them negative weights.
Each penalty quantity comes as ``<quantity>_l2`` (sum of squares) and ``<quantity>_l1``
(sum of absolute values).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from unilab_ros.robot.extract import joint_values, sample_field
from unilab_ros.robot.observation_terms import (
    base_lin_vel,
    gravity,
    joint_effort,
    joint_vel,
    position,
)
from unilab_ros.robot.samples import JointStateSample
from unilab_ros.robot.terms import POSE_TYPES, TermContext, TermKind

Params = Mapping[str, Any]
Quantity = Callable[[TermContext, str, Params], np.ndarray]


def joint_acc(ctx: TermContext, source: str, p: Params) -> np.ndarray:
    """Joint accelerations by finite difference of the velocities of two ticks, over their
    stamps' interval (dt when unstamped or the same sample); zeros on an episode's first."""
    before = ctx.previous.get(source)
    if before is None:
        return np.zeros(len(p["joints"]))
    now = ctx.samples[source]
    assert isinstance(now, JointStateSample) and isinstance(before, JointStateSample)
    interval = ctx.dt
    if now.stamp is not None and before.stamp is not None and now.stamp > before.stamp:
        interval = now.stamp - before.stamp
    change = joint_values(now, p["joints"], "velocity") - joint_values(before, p["joints"],
                                                                        "velocity")
    return change / interval


def action_rate(ctx: TermContext, _source: str, _p: Params) -> np.ndarray:
    return np.asarray(ctx.action, np.float64) - np.asarray(ctx.previous_action, np.float64)


def action(ctx: TermContext, _source: str, _p: Params) -> np.ndarray:
    return np.asarray(ctx.action, np.float64)


def orientation(ctx: TermContext, source: str, p: Params) -> np.ndarray:
    """The x, y of the projected gravity: zero upright."""
    return gravity(ctx, source, p)[:2]


def height_error(ctx: TermContext, source: str, p: Params) -> np.ndarray:
    return position(ctx, source)[2:3] - p["target"]


def lin_vel_z(ctx: TermContext, source: str, p: Params) -> np.ndarray:
    """The base's vertical velocity (a legged robot should not bounce)."""
    return base_lin_vel(ctx, source, p)[2:3]


_JOINTS = {"joints": "joints"}
_QUANTITIES: dict[str, tuple[Quantity, tuple[str, ...], dict[str, str]]] = {
    "joint_vel": (joint_vel, ("joint_state",), _JOINTS),
    "joint_acc": (joint_acc, ("joint_state",), _JOINTS),
    "joint_effort": (joint_effort, ("joint_state",), _JOINTS),
    "action_rate": (action_rate, (), {}),
    "action": (action, (), {}),
    "orientation": (orientation, ("imu", *POSE_TYPES), {}),
    "height_error": (height_error, POSE_TYPES, {"target": "float"}),
    "lin_vel_z": (lin_vel_z, ("odometry", "twist", "twist_stamped"), {}),
}
"""Penalised quantities: name -> (function, source types, params)."""


def _l2(quantity: Quantity) -> Callable[[TermContext, str, Params], float]:
    return lambda ctx, source, p: float(np.sum(np.square(quantity(ctx, source, p))))


def _l1(quantity: Quantity) -> Callable[[TermContext, str, Params], float]:
    return lambda ctx, source, p: float(np.sum(np.abs(quantity(ctx, source, p))))


def exp_tracking(ctx: TermContext, source: str, p: Params) -> float:
    """exp(-|c - v|^2 / std^2): c the command's values at ``command_indices``, v the
    source's ``fields`` (e.g. a velocity command's x, y against odometry linear.x, .y)."""
    wanted = np.asarray(ctx.commands[p["command"]], np.float64)[p["command_indices"]]
    actual = np.array([sample_field(ctx.samples[source], name) for name in p["fields"]])
    return float(np.exp(-np.sum(np.square(wanted - actual)) / p["std"] ** 2))


def site_distance(ctx: TermContext, _source: str, p: Params) -> float:
    """m from a site's position to a target's (a command of 3 values)."""
    target = np.asarray(ctx.commands[p["target"]], np.float64)
    return float(np.linalg.norm(position(ctx, p["site"]) - target))


def alive(ctx: TermContext, _source: str, _p: Params) -> float:
    """1 on every step that did not end in failure (a time-out is no failure)."""
    return 0.0 if ctx.failed else 1.0


def termination(ctx: TermContext, _source: str, _p: Params) -> float:
    """1 on the step a failure termination fired (give it a negative weight)."""
    return 1.0 if ctx.failed else 0.0


REWARDS: dict[str, TermKind] = {
    **{f"{name}_l2": TermKind(_l2(fn), sources, params)
       for name, (fn, sources, params) in _QUANTITIES.items()},
    **{f"{name}_l1": TermKind(_l1(fn), sources, params)
       for name, (fn, sources, params) in _QUANTITIES.items()},
    "exp_tracking": TermKind(exp_tracking, ("odometry", "imu", "twist", "twist_stamped",
                                            "pose_stamped"),
                             {"command": "command", "command_indices": "indices",
                              "fields": "fields", "std": "positive"}),
    "site_distance": TermKind(site_distance, (), {"site": "pose_source", "target": "command"}),
    "alive": TermKind(alive),
    "termination": TermKind(termination),
}
"""Reward kinds; a new one is a function above and an entry here (a new penalty quantity
is one entry in ``_QUANTITIES``, which gives both its L2 and L1 kinds)."""
