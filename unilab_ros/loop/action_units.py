"""Commands back in policy units: what the learner stores for a step whose command the
guard (blend-in, smoothing, rate limit) or the e-stop set (ROS-free, pure numpy)."""

from __future__ import annotations

import numpy as np


def in_policy_units(command: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``command`` before ``action_scale`` (0 where a dim's scale is 0: any action maps to
    the same command there)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(scale != 0.0, command / scale, 0.0).astype(np.float32)


def as_sent(actions: np.ndarray, mapped: np.ndarray, command: np.ndarray,
            scale: np.ndarray) -> np.ndarray:
    """The policy actions stored for ``command``: where the guard changed the mapped action,
    what was sent, in policy units (stored with the acting policy's log-prob of it);
    elsewhere the policy's own action (unclipped, as PPO's bounds loss expects)."""
    changed = command != mapped
    if not changed.any():
        return actions
    return np.where(changed, in_policy_units(command, scale), actions).astype(np.float32)
