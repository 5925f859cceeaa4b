"""Hardware safety on the way to the robot: rate limit, low-pass smoothing, blend-in (ROS-free).

``ActionGuard`` sits after the action mapping (scale, clip), in the units of what it is
given: the published action for the topic contract, policy units for a robot spec (whose
node converts its limits: ``robot.actions.JointCommands.guard_in_policy_units``). A node
asks it to ``hold()`` the safe action whenever the policy must not command (e-stop
engaged, activation, the watchdog, a non-finite action); the policy's actions that follow
blend in from the safe action over ``blend_in_steps``, so a robot is never jerked from
standing still to a policy's full command. Every action it returns lies between the
previous one and the target, so it stays within the limits the target respected.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from unilab_ros.rl.actions import per_dim


@dataclass
class ActionSafetyConfig:
    """How fast published actions may change (after action_scale and the limits)."""

    max_action_change: list[float] = field(default_factory=lambda: [0.0])
    """Largest change of a published command from one step to the next, in command units
    (what the robot receives: after action_scale, the default-pose offset and the limits);
    one value or one per dim; 0 leaves that dim unlimited. A robot spec's own guard also
    holds: per dim the stricter of the two is in force."""
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


def stricter(first: ActionSafetyConfig, second: ActionSafetyConfig,
             dim: int) -> ActionSafetyConfig:
    """The guard that keeps both: per dim the smaller rate limit (0, no limit, yields to
    any), the heavier smoothing and the longer blend-in."""
    a = per_dim("max_action_change", first.max_action_change, dim).astype(np.float64)
    b = per_dim("max_action_change", second.max_action_change, dim).astype(np.float64)
    limit = np.where(a == 0.0, b, np.where(b == 0.0, a, np.minimum(a, b)))
    return ActionSafetyConfig(limit.tolist(), max(first.action_smoothing,
                                                  second.action_smoothing),
                              max(first.blend_in_steps, second.blend_in_steps))


def describe(cfg: ActionSafetyConfig, names: list[str]) -> str:
    """The guard for a log line: each dim's rate limit by name, smoothing and blend-in."""
    limits = per_dim("max_action_change", cfg.max_action_change, len(names))
    changes = ", ".join(f"{name} {float(limit):.6g}" if limit > 0.0 else f"{name} unlimited"
                        for name, limit in zip(names, limits, strict=True))
    return (f"max change per step {changes}; smoothing {cfg.action_smoothing:g}; "
            f"blend-in {cfg.blend_in_steps} steps")


class ActionGuard:
    """Turns mapped policy actions (num_envs, action_dim) into what is safe to send."""

    def __init__(self, cfg: ActionSafetyConfig, safe: np.ndarray) -> None:
        cfg.validate()
        self.safe = np.asarray(safe, np.float32)
        limit = per_dim("max_action_change", cfg.max_action_change, self.safe.shape[1])
        # The largest float32 not above each limit as written (float32(0.1) is above 0.1).
        written = np.broadcast_to(np.asarray(cfg.max_action_change, np.float64), limit.shape)
        limit = np.where(limit.astype(np.float64) > written,
                         np.nextafter(limit, np.float32(0.0)), limit)
        self._limited = written > 0.0
        self.max_change = np.where(self._limited, limit, np.inf).astype(np.float32)
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
            # last + step rounds to float32 and can land half an ulp beyond the limit: one
            # ulp back towards last keeps it (an operator measures the exact difference).
            over = (np.abs(action.astype(np.float64) - self.last.astype(np.float64))
                    > self.max_change.astype(np.float64))
            if over.any():
                action = np.where(over, np.nextafter(action, self.last), action)
        self.last = np.array(action, np.float32)
        return self.last
