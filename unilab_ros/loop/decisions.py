"""What the training loop decides, for its caller (the trainer node, the in-process run)
to carry out. Every decision about a robot names it by its index in the loop's robots."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PublishAction:
    """Publish ``command`` (mapped, guarded, ready for the robot) to robot ``robot``."""

    robot: int
    command: np.ndarray
    nonfinite: bool = False
    """The policy gave NaN or Inf: ``command`` is the safe action instead."""
    restored: bool = False
    """... and the model was non-finite: the last finite parameters are back."""
    estop: bool = False
    """The e-stop is engaged: ``command`` is the safe action."""
    rejoined: bool = False
    """A fleet's robot that had stalled: its first action since."""


@dataclass(frozen=True)
class BeginUpdate:
    """The rollout is complete: pause the simulators, then call ``update``."""


@dataclass(frozen=True)
class IterationDone:
    """Learning while acting: an iteration's steps are in and nothing paused; report
    ``metrics`` (the learner thread's since the last one). Saves (and ``Finished``) follow."""

    metrics: dict


@dataclass(frozen=True)
class StepDropped:
    """Robot ``robot``'s step missed ``step_timeout`` (or, ``pause_unanswered``, its
    simulator did not answer a pause): its episodes in progress are cut; a fleet goes on
    without it until it steps again. A ``PublishAction`` follows when a newer observation
    waits."""

    robot: int
    pause_unanswered: bool = False


@dataclass(frozen=True)
class Silent:
    """Robot ``robot``'s observations stopped: ``first`` on the check that found it, then
    on every check until one arrives; ``publish_safe``: send it the safe action."""

    robot: int
    first: bool
    publish_safe: bool


@dataclass(frozen=True)
class Save:
    """Write a checkpoint for ``reason``: ``interval``, or ``best`` (best.safetensors)."""

    reason: str


@dataclass(frozen=True)
class Finished:
    """``max_iterations`` reached: save and stop acting."""


Decision = (PublishAction | BeginUpdate | IterationDone | StepDropped | Silent | Save
            | Finished)
