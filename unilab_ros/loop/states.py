"""What the training loop reports: its phase and its counters' names."""

from __future__ import annotations

from enum import Enum

COUNTERS = (
    "rejected_observations",
    "rejected_rewards",
    "rejected_dones",
    "discarded_during_update",
    "watchdog_trips",
    "safe_actions_published",
    "nonfinite_actions",
    "save_failures",
    "save_requests_refused",
    "estops",
    "guarded_actions",
    "steps_behind_update",
)
"""The trainer's counters besides the step sources', in their reporting order."""
FLEET_COUNTERS = ("robot_stalls", "robot_rejoins")
"""A fleet's counters besides those."""


class Phase(str, Enum):
    WAITING = "waiting_for_observation"
    COLLECTING = "collecting"
    EPISODE_END = "waiting_for_episode_end"
    UPDATING = "updating"
    FINISHED = "finished"
