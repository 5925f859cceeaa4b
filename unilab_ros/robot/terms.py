"""What every term sees (``TermContext``) and how a registry describes a term (``TermKind``).

A term is a small pure function ``fn(ctx, source, params)`` of the newest samples; its
registry entry says which source types it reads and which params it takes, so the spec is
checked before any data flows. The registries: ``observation_terms.OBSERVATIONS``,
``reward_terms.REWARDS``, ``termination_terms.TERMINATIONS``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from unilab_ros.robot.samples import Sample

PARAM_TYPES = ("joints", "command", "pose_source", "float", "positive", "floats", "steps",
               "indices", "fields")
"""What a term's param may be (checked by ``spec``): a non-empty list of joint names; the
name of a spec command; the name of a pose_stamped or odometry source (a site's pose); a
number; a number > 0; a number or one per joint; a whole number > 0; a list of indices into
a float array; a list of sample fields (``linear.x``) of the term's source."""

POSE_TYPES = ("pose_stamped", "odometry")
"""Source types with a position and an orientation."""


@dataclass(frozen=True)
class TermContext:
    """The robot as one tick sees it."""

    samples: Mapping[str, Sample]
    """The newest sample of every source, by source name."""
    previous: Mapping[str, Sample]
    """The samples of the previous tick of the episode (empty on its first)."""
    commands: Mapping[str, np.ndarray]
    """Every spec command's value for this tick (sampled per episode, or read from a topic)."""
    default_pose: Mapping[str, float]
    """The spec's default joint positions."""
    action: np.ndarray
    """The latest action sent, in policy units (zeros before the episode's first)."""
    previous_action: np.ndarray
    """The action before it (zeros before the episode's second)."""
    dt: float
    """The control period, 1 / control_rate, seconds."""
    episode_step: int = 0
    """Steps completed in the episode, this tick's included."""
    failed: bool = False
    """A failure termination fired this tick (reward terms only)."""


@dataclass(frozen=True)
class Sizes:
    """What an observation term's size may depend on."""

    commands: Mapping[str, int]
    """Each command's number of values."""
    action: int
    """The number of action dims."""


@dataclass(frozen=True)
class TermKind:
    """A registry entry: the function and what the spec must give it."""

    fn: Callable[[TermContext, str, Mapping[str, Any]], Any]
    """``fn(ctx, source, params)``: a 1-D array (observation), a float (reward) or a bool
    (termination)."""
    sources: tuple[str, ...] = ()
    """Source types it can read; empty: it reads no source."""
    params: Mapping[str, str] = field(default_factory=dict)
    """Each param's name and type (one of PARAM_TYPES)."""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """Values of the params that may be left out."""
    dim: Callable[[Mapping[str, Any], Sizes], int] | None = None
    """An observation term's values per step."""
    time_out: bool = False
    """A termination's default: True ends as a time-out (done 2), False as a failure (1)."""


def fixed(n: int) -> Callable[[Mapping[str, Any], Sizes], int]:
    """The size of a term with ``n`` values whatever its params."""
    return lambda _params, _sizes: n


def per_joint(params: Mapping[str, Any], _sizes: Sizes) -> int:
    return len(params["joints"])


def joint_array(value: float | list[float], joints: list[str]) -> np.ndarray:
    """A param given once or once per joint, as one value per joint."""
    values = np.asarray(value, np.float64).reshape(-1)
    return np.full(len(joints), values[0]) if values.size == 1 else values
