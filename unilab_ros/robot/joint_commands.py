"""Policy outputs as joint commands, in the spec's joint order (the ROS side wraps them in a
Float64MultiArray or a JointTrajectory with the names).

position: default_pose + scale x action; velocity and effort: scale x action; then clipped
to [low, high]. The safe command: the spec's ``safe``, else the default pose (position) or 0
(velocity, effort), within the limits.

Guard limits (``loop.action_safety``): a spec's ``actions.guard`` is in policy units (the
training's guard acts on actions before this mapping); an operator's, in command units.
``guard_in_command_units`` and ``guard_in_policy_units`` convert a guard's rate limit
(x |scale| and back); smoothing and blend-in have no units.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from unilab_ros.loop.action_safety import ActionSafetyConfig
from unilab_ros.rl.actions import ActionConfig, per_dim
from unilab_ros.robot.spec import RobotSpec


def _per_joint(values: tuple[float, ...], n: int) -> np.ndarray:
    array = np.asarray(values, np.float64)
    return np.full(n, array[0]) if array.size == 1 else array


class JointCommands:
    """Maps actions (policy units, ``dim`` values) to the command of each spec joint."""

    def __init__(self, spec: RobotSpec) -> None:
        actions = spec.actions
        self.joints = actions.joints
        """The commanded joints, in the command's order."""
        self.interface = actions.interface
        self.dim = len(self.joints)
        n = self.dim
        self.scale = _per_joint(actions.scale, n)
        self.low, self.high = _per_joint(actions.low, n), _per_joint(actions.high, n)
        self.offset = (np.array([spec.default_pose[j] for j in self.joints])
                       if self.interface == "position" else np.zeros(n))
        """What an action of 0 commands."""
        self.safe = _per_joint(actions.safe, n) if actions.safe else self.offset.copy()
        """The command sent when the policy must not act (within the limits: the spec
        checked it)."""

    def __call__(self, action: np.ndarray) -> np.ndarray:
        """The joint commands (float64, one per joint) for ``action``; a wrong size is an
        error."""
        action = np.asarray(action, np.float64).reshape(-1)
        if action.size != self.dim:
            raise ValueError(f"action has {action.size} values; {self.dim} joints are "
                             f"commanded ({list(self.joints)})")
        return np.clip(self.offset + self.scale * action, self.low, self.high)

    def policy_units(self, command: np.ndarray) -> np.ndarray:
        """The action that maps to ``command`` (the spec refuses a scale of 0)."""
        return (np.asarray(command) - self.offset) / self.scale

    def action_config(self) -> ActionConfig:
        """The training loop's action mapping in policy units: scale 1, the joint limits
        and the safe command as actions (the guard's rate limit and smoothing act in these
        units too); ``__call__`` then makes joint commands of what the loop sends."""
        ends = np.sort(np.stack([self.policy_units(self.low), self.policy_units(self.high)]),
                       axis=0)
        return ActionConfig(action_scale=[1.0] * self.dim, action_low=ends[0].tolist(),
                            action_high=ends[1].tolist(),
                            safe_action=self.policy_units(self.safe).tolist())

    def guard_in_command_units(self, guard: ActionSafetyConfig) -> ActionSafetyConfig:
        """``guard`` (policy units, as the spec states it) with its rate limit in command
        units: a change of x in an action moves the command by |scale| x."""
        return replace(guard, max_action_change=(self._limits(guard) * np.abs(self.scale))
                       .tolist())

    def guard_in_policy_units(self, guard: ActionSafetyConfig) -> ActionSafetyConfig:
        """``guard`` (command units) for the guard that acts on actions before the
        mapping: each rate limit / |scale| (the spec refuses a scale of 0)."""
        return replace(guard, max_action_change=(self._limits(guard) / np.abs(self.scale))
                       .tolist())

    def _limits(self, guard: ActionSafetyConfig) -> np.ndarray:
        """The rate limit per joint, in float64 (as written: 0.1 stays 0.1)."""
        per_dim("max_action_change", guard.max_action_change, self.dim)  # checks the size
        return np.broadcast_to(np.asarray(guard.max_action_change, np.float64),
                               (self.dim,)).copy()
