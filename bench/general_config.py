"""The development set of the general config (``learning.py --config``): seven tasks, each
trained from one params file with only its sizes changed.

``task_files`` writes, for every task, a copy of the general file with the task's env id,
``obs_dim``, ``action_dim`` and action bounds (from the env's spaces: the task's
interface, not a tuning) and its budget (``max_iterations``, ``ppo.schedule_iterations``).
Nothing else differs between the tasks.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import yaml
from learning_tasks import Task

DEV_TASKS = {
    # Seed 0 also trains through ROS, for the task's whole budget.
    task.name: replace(task, ros_seeds=(0,), ros_full_budget=True)
    for task in (
        Task("pendulum", "pendulum", "dev_pendulum.yaml", 300_000, (0, 1, 2), -200.0,
             (50_000, 100_000, 200_000, 300_000)),
        Task("inverted_pendulum", "ip", "dev_inverted_pendulum.yaml", 300_000, (0, 1, 2),
             1000.0, (50_000, 100_000, 200_000, 300_000)),
        Task("inverted_double_pendulum", "idp", "dev_inverted_double_pendulum.yaml", 300_000,
             (0, 1, 2), 9000.0, (50_000, 100_000, 200_000, 300_000)),
        Task("reacher", "reacher", "dev_reacher.yaml", 300_000, (0, 1, 2), -5.0,
             (50_000, 100_000, 200_000, 300_000)),
        Task("swimmer", "swimmer", "dev_swimmer.yaml", 1_000_000, (0, 1, 2), 100.0,
             (250_000, 500_000, 750_000, 1_000_000)),
        Task("halfcheetah", "hc", "dev_halfcheetah.yaml", 1_000_000, (0, 1, 2), 1500.0,
             (250_000, 500_000, 750_000, 1_000_000)),
        Task("ant", "ant", "dev_ant.yaml", 1_000_000, (0, 1, 2), 1000.0,
             (250_000, 500_000, 750_000, 1_000_000)),
    )
}
ENV_IDS = {
    "pendulum": "Pendulum-v1", "inverted_pendulum": "InvertedPendulum-v5",
    "inverted_double_pendulum": "InvertedDoublePendulum-v5", "reacher": "Reacher-v5",
    "swimmer": "Swimmer-v5", "halfcheetah": "HalfCheetah-v5", "ant": "Ant-v5",
}

def task_files(general: Path, out: Path, budgets: dict[str, int]) -> Path:
    """One params file per development task in ``out`` (returned), from ``general``."""
    import gymnasium as gym
    import numpy as np

    document = yaml.safe_load(general.read_text())
    out.mkdir(parents=True, exist_ok=True)
    for name, task in DEV_TASKS.items():
        env = gym.make(ENV_IDS[name])
        bound = float(np.max(np.abs(np.concatenate([env.action_space.low,
                                                     env.action_space.high]))))
        obs_dim = int(np.prod(env.observation_space.shape))
        action_dim = int(np.prod(env.action_space.shape))
        env.close()
        copy = yaml.safe_load(yaml.safe_dump(document))
        bridge = copy["/**/gym_env"]["ros__parameters"]
        trainer = copy["/**/unilab_trainer"]["ros__parameters"]
        bridge["env_id"] = ENV_IDS[name]
        per_iteration = int(trainer["num_envs"]) * int(trainer["num_steps"])
        iterations = math.ceil(budgets.get(name, task.env_steps) / per_iteration)
        trainer.update(obs_dim=obs_dim, action_dim=action_dim, action_scale=[bound],
                       action_low=[-bound], action_high=[bound], max_iterations=iterations)
        if trainer.get("ppo", {}).get("schedule") == "linear":
            trainer["ppo"]["schedule_iterations"] = iterations
        (out / task.params_file).write_text(yaml.safe_dump(copy))
    return out
