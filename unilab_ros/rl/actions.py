"""Mapping policy outputs to the actions a robot receives: scale, then clip."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, fields

import numpy as np


@dataclass
class ActionConfig:
    """Limits applied to every published action (the policy learns unclipped)."""

    action_scale: list[float] = field(default_factory=lambda: [1.0])
    """Multiplies the policy output; one value for all dims or one per dim."""
    action_low: list[float] = field(default_factory=lambda: [-1.0])
    """Lower clip after scaling; one value or one per dim."""
    action_high: list[float] = field(default_factory=lambda: [1.0])
    """Upper clip after scaling; one value or one per dim."""
    safe_action: list[float] = field(default_factory=lambda: [0.0])
    """Sent during updates and by the watchdog; one value or one per dim."""


class ActionMapper:
    """Turns policy outputs (num_envs, action_dim) into clipped commands."""

    def __init__(self, cfg: ActionConfig, num_envs: int, action_dim: int) -> None:
        self.scale = per_dim("action_scale", cfg.action_scale, action_dim)
        self.low = per_dim("action_low", cfg.action_low, action_dim)
        self.high = per_dim("action_high", cfg.action_high, action_dim)
        if np.any(self.low > self.high):
            raise ValueError("action_low must not exceed action_high")
        safe = per_dim("safe_action", cfg.safe_action, action_dim)
        if np.any(safe < self.low) or np.any(safe > self.high):
            raise ValueError("safe_action must lie within action_low..action_high")
        self.safe = np.tile(safe, (num_envs, 1))

    def policy_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """The action limits in policy units (before ``action_scale``), per dim.

        Beyond them the published action is clipped, so PPO's bounds loss pulls the
        policy mean back inside. A zero scale makes a dim's bounds infinite.
        """
        with np.errstate(divide="ignore", invalid="ignore"):
            a, b = self.low / self.scale, self.high / self.scale
        lower, upper = np.minimum(a, b), np.maximum(a, b)
        unbounded = self.scale == 0.0
        lower[unbounded], upper[unbounded] = -np.inf, np.inf
        return lower.astype(np.float32), upper.astype(np.float32)

    def __call__(self, policy_actions: np.ndarray) -> np.ndarray:
        return np.clip(policy_actions * self.scale, self.low, self.high).astype(np.float32)


def override_actions(
    trained: ActionConfig | None, given: ActionConfig, overridden: Collection[str]
) -> tuple[ActionConfig, list[str]]:
    """The training's action mapping with the fields named in ``overridden`` taken from
    ``given``, and one message per field that changes (a scale or limit other than the
    training's changes what the policy does, so it is said with both values)."""
    if trained is None:
        return given, [
            "the policy does not say how the training mapped actions (written by an older "
            "version): using the action_* and safe_action given here"
        ]
    values, notes = {}, []
    for item in fields(ActionConfig):
        ours, theirs = list(getattr(given, item.name)), list(getattr(trained, item.name))
        if item.name in overridden and ours != theirs:
            notes.append(f"{item.name} = {ours} (given) overrides {theirs} (the training's)")
            values[item.name] = ours
        else:
            values[item.name] = theirs
    return ActionConfig(**values), notes


def per_dim(name: str, values: list[float], action_dim: int) -> np.ndarray:
    array = np.asarray(values, np.float32).reshape(-1)
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite")
    if array.size == 1:
        return np.full(action_dim, array[0], np.float32)
    if array.size != action_dim:
        raise ValueError(f"{name} needs 1 or action_dim={action_dim} values, got {array.size}")
    return array
