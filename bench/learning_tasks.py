"""The learning bench's tasks: what ``learning.py`` trains, ``general_config.py``'s
development set is made of, and ``learning_report.py`` reports on.

A module of its own so that those three import it and never each other in a circle.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    """One benchmark task: a shipped params file, a budget and a success threshold."""

    name: str
    short: str
    params_file: str
    env_steps: int
    seeds: tuple[int, ...]
    threshold: float
    """Rolling mean return that counts as solved; the worst value after it is reported."""
    marks: tuple[int, ...]
    ros_seeds: tuple[int, ...] = ()
    """Seeds also trained through ROS (sim_train); empty: in-process only."""
    ros_full_budget: bool = False
    """Through ROS for the task's own budget (not ROS_STEPS): the same run as in-process."""


TASKS = {
    task.name: task
    for task in (
        Task("pendulum", "pendulum", "pendulum.yaml", 500_000, (0, 1, 2, 3, 4), -200.0,
             (50_000, 100_000, 150_000, 300_000, 500_000), ros_seeds=(0, 1, 2)),
        Task("inverted_pendulum", "ip", "inverted_pendulum.yaml", 300_000, (0, 1, 2), 1000.0,
             (50_000, 100_000, 200_000, 300_000)),
        Task("halfcheetah", "hc", "halfcheetah.yaml", 1_000_000, (0, 1, 2), 1500.0,
             (250_000, 500_000, 1_000_000)),
    )
}
"""The shipped task configs, each trained from its own params file."""
