"""Policy outputs as joint commands, in the spec's joint order (the ROS side wraps them in a
Float64MultiArray or a JointTrajectory with the names).

position: default_pose + scale x action; velocity and effort: scale x action; then clipped
to [low, high]. The safe command: the spec's ``safe``, else the default pose (position) or 0
(velocity, effort), within the limits.
"""

from __future__ import annotations

import numpy as np

from unilab_ros.rl.actions import ActionConfig
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
        """The action that maps to ``command`` (0 where a joint's scale is 0)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.scale != 0.0, (np.asarray(command) - self.offset)
                            / self.scale, 0.0)

    def action_config(self) -> ActionConfig:
        """The training loop's action mapping in policy units: scale 1, the joint limits
        and the safe command as actions (the guard's rate limit and smoothing act in these
        units too); ``__call__`` then makes joint commands of what the loop sends."""
        ends = np.sort(np.stack([self.policy_units(self.low), self.policy_units(self.high)]),
                       axis=0)
        return ActionConfig(action_scale=[1.0] * self.dim, action_low=ends[0].tolist(),
                            action_high=ends[1].tolist(),
                            safe_action=self.policy_units(self.safe).tolist())
