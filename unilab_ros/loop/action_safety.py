"""Hardware safety on the way to the robot: rate limit, low-pass smoothing, blend-in (ROS-free).

``ActionGuard`` sits after the action mapping (scale, clip). A node asks it to ``hold()``
the safe action whenever the policy must not command (e-stop engaged, activation, the
watchdog, a non-finite action); the policy's actions that follow blend in from the safe
action over ``blend_in_steps``, so a robot is never jerked from standing still to a
policy's full command. Every action it returns lies between the previous one and the
target, so it stays within the limits the target respected.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from unilab_ros.rl.actions import per_dim


@dataclass
class ActionSafetyConfig:
    """How fast published actions may change (after action_scale and the limits)."""

    max_action_change: list[float] = field(default_factory=lambda: [0.0])
    """Largest change of a published action from one step to the next, in its own units;
    one value or one per dim; 0 leaves that dim unlimited."""
    action_smoothing: float = 0.0
    """Low-pass factor in [0, 1): each action is this share of the previous one plus the
    rest of the new one; 0 is off."""
    blend_in_steps: int = 0
    """Steps over which actions ramp linearly from the safe action to the policy's after
    activation, an e-stop release or a watchdog trip; 0 switches at once."""

    def validate(self) -> None:
        if any(value < 0.0 for value in self.max_action_change):
            raise ValueError("max_action_change must be >= 0 (0: no limit)")
        if not 0.0 <= self.action_smoothing < 1.0:
            raise ValueError("action_smoothing must be in [0, 1)")
        if self.blend_in_steps < 0:
            raise ValueError("blend_in_steps must be >= 0")


class ActionGuard:
    """Turns mapped policy actions (num_envs, action_dim) into what is safe to send."""

    def __init__(self, cfg: ActionSafetyConfig, safe: np.ndarray) -> None:
        cfg.validate()
        self.safe = np.asarray(safe, np.float32)
        limit = per_dim("max_action_change", cfg.max_action_change, self.safe.shape[1])
        self.max_change = np.where(limit > 0.0, limit, np.inf).astype(np.float32)
        self._limited = limit > 0.0
        self.smoothing = np.float32(cfg.action_smoothing)
        self.blend_in_steps = cfg.blend_in_steps
        self.last = self.safe.copy()
        self._blend_step = self.blend_in_steps

    @property
    def blending(self) -> bool:
        """True while the policy's actions are still being blended in."""
        return self._blend_step < self.blend_in_steps

    def hold(self) -> np.ndarray:
        """The safe action, at once; the policy's next actions blend in from it."""
        self.last = self.safe.copy()
        self._blend_step = 0
        return self.last

    def command(self, target: np.ndarray) -> tuple[np.ndarray, bool]:
        """What to send for the mapped policy actions ``target``, and whether they were
        finite: whatever the model holds, no NaN or Inf reaches the robot (the safe action
        goes out instead, and the policy blends in again after it)."""
        if np.isfinite(target).all():
            return self(target), True
        return self.hold(), False

    def __call__(self, target: np.ndarray) -> np.ndarray:
        """The action to send for the policy's ``target``."""
        action = np.asarray(target, np.float32)
        if self.blending:
            self._blend_step += 1
            weight = np.float32(self._blend_step / self.blend_in_steps)
            action = self.safe + weight * (action - self.safe)
        # Each stage only where it is on: last + (action - last) is not action in floats,
        # and a guard with everything off must pass the policy's action bit for bit.
        if self.smoothing:
            action = self.smoothing * self.last + (1.0 - self.smoothing) * action
        if self._limited.any():
            step = np.clip(action - self.last, -self.max_change, self.max_change)
            action = np.where(self._limited, self.last + step, action)
        self.last = np.array(action, np.float32)
        return self.last
