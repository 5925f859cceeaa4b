"""The done codes of the topic contract (ROS-free, MLX-free: every side imports them)."""

from __future__ import annotations

from enum import IntEnum

import numpy as np


class DoneCode(IntEnum):
    """Per-env code on the ``done`` topic after each step."""

    RUNNING = 0
    """The episode goes on."""
    TERMINATED = 1
    """The episode ended for good: no bootstrap."""
    TRUNCATED = 2
    """The episode was cut (time limit, dropped step): bootstrap with V(s)."""


def from_gym_flags(terminated: np.ndarray, truncated: np.ndarray) -> np.ndarray:
    """Gymnasium's flags as done codes; a terminated step wins, since it must not bootstrap."""
    codes = np.where(truncated, DoneCode.TRUNCATED, DoneCode.RUNNING)
    return np.where(terminated, DoneCode.TERMINATED, codes).astype(np.uint8)
