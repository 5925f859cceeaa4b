"""What the training loop keeps of one robot (ROS-free)."""

from __future__ import annotations

import numpy as np

from unilab_ros.loop.action_safety import ActionGuard
from unilab_ros.loop.steps import StepSource
from unilab_ros.loop.watchdog import Watchdog


class Robot:
    """One robot: its rows of the agent's envs, its step source, action guard and watchdog,
    and what the loop remembers of its latest observation and action."""

    def __init__(
        self, name: str, envs: np.ndarray, source: StepSource, guard: ActionGuard,
        watchdog: Watchdog,
    ) -> None:
        self.name = name
        """Its namespace (empty: the trainer's own topics)."""
        self.envs = envs
        """Its rows of the agent's ``num_envs``."""
        self.source = source
        self.guard = guard
        self.watchdog = watchdog
        self.latest_obs: tuple[np.ndarray, int] | None = None
        """Its newest valid observation and that observation's stamp."""
        self.acted_stamp = 0
        """Stamp of the observation its latest action answered."""
        self.acted_by_sampling = False
        """Its latest action was a sample of the policy (PPO may learn from the step)."""
        self.acted_in_estop = False
        self.policy_outputs: tuple[np.ndarray, np.ndarray] | None = None
        """Mean and std of the policy for its latest action (PPO's "old" outputs)."""
        self.stalled = False
        """Its latest step was dropped; it rejoins on its next observation."""
        self.heard = 0.0
        """Node-clock time of its latest valid message."""
