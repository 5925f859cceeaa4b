"""Stable-Baselines3's PPO as the learning bench's reference: rl-baselines3-zoo's per-task
hyperparameters, their rescaling to the task's env count, and one training run.

``learning.py`` runs ``run_sb3`` in a child process (``--child sb3``), so the process that
imports MLX never loads torch beside it.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from typing import Any

# SB3 PPO hyperparameters from rl-baselines3-zoo, hyperparams/ppo.yml
# (github.com/DLR-RM/rl-baselines3-zoo, commit 208b6fdf3a9a), verbatim. The zoo tunes
# HalfCheetah-v4 and InvertedPendulum-v2; -v5 keeps their model, observation and reward,
# so those entries serve for -v5. "n_envs" and "n_steps" are the zoo's: sb3_settings()
# replaces n_envs by the task's env count and rescales n_steps (see there). policy_kwargs'
# activation_fn names a torch.nn class (the zoo writes nn.ReLU).
SB3_ZOO: dict[str, dict[str, Any]] = {
    "Pendulum-v1": {
        "n_envs": 4, "n_steps": 1024, "gae_lambda": 0.95, "gamma": 0.9, "n_epochs": 10,
        "ent_coef": 0.0, "learning_rate": 1e-3, "clip_range": 0.2, "use_sde": True,
        "sde_sample_freq": 4,
    },
    "HalfCheetah-v5": {
        "normalize": True, "n_envs": 1, "n_steps": 512, "batch_size": 64, "gamma": 0.98,
        "learning_rate": 2.0633e-05, "ent_coef": 0.000401762, "clip_range": 0.1,
        "n_epochs": 20, "gae_lambda": 0.92, "max_grad_norm": 0.8, "vf_coef": 0.58096,
        "policy_kwargs": {"log_std_init": -2, "ortho_init": False, "activation_fn": "ReLU",
                          "net_arch": {"pi": [256, 256], "vf": [256, 256]}},
    },
    "InvertedPendulum-v5": {
        "normalize": True, "n_envs": 1, "n_steps": 32, "batch_size": 64, "gamma": 0.999,
        "learning_rate": 0.000222425, "ent_coef": 1.37976e-07, "clip_range": 0.4,
        "n_epochs": 5, "gae_lambda": 0.9, "max_grad_norm": 0.3, "vf_coef": 0.19816,
    },
}
# rl-baselines3-zoo's PPO entries (hyperparams/ppo.yml, commit 00128b5d46d4) for the tasks
# the development set adds (general_config.py); -v5 keeps the -v3 / -v2 model, observation
# and reward.
# Swimmer's and Ant's are the zoo's MuJoCo defaults (normalize, SB3's PPO defaults; the
# zoo's newer Swimmer entry adds a TimeFeatureWrapper, which is not used here).
SB3_ZOO.update({
    "InvertedDoublePendulum-v5": {
        "normalize": True, "n_envs": 1, "n_steps": 128, "batch_size": 512, "gamma": 0.98,
        "learning_rate": 0.000155454, "ent_coef": 1.05057e-06, "clip_range": 0.4,
        "n_epochs": 10, "gae_lambda": 0.8, "max_grad_norm": 0.5, "vf_coef": 0.695929,
    },
    "Reacher-v5": {
        "normalize": True, "n_envs": 1, "n_steps": 512, "batch_size": 32, "gamma": 0.9,
        "learning_rate": 0.000104019, "ent_coef": 7.52585e-08, "clip_range": 0.3,
        "n_epochs": 5, "gae_lambda": 1.0, "max_grad_norm": 0.9, "vf_coef": 0.950368,
    },
    "Swimmer-v5": {"normalize": True, "gamma": 0.9999},
    "Ant-v5": {"normalize": True},
})
SB3_DEFAULT_ROLLOUT = 2048
"""SB3's default n_steps with the zoo's default single env: one update per 2048 steps."""
MIN_STEPS_PER_ENV = 16
"""Below this many steps per env and rollout, GAE would bootstrap nearly every step from
the value function; the zoo's n_steps is kept then (a larger rollout, the same batches)."""


def sb3_settings(env_id: str, num_envs: int) -> tuple[dict[str, Any], bool, str]:
    """SB3 PPO keyword arguments for ``num_envs`` envs, whether to use VecNormalize, and
    where the values come from.

    The zoo tunes with its own env count; we run the task's, and keep the zoo's rollout
    size (n_envs x n_steps, the data per update) by rescaling n_steps, unless that leaves
    fewer than MIN_STEPS_PER_ENV steps per env."""
    zoo = dict(SB3_ZOO.get(env_id, {}))
    source = f"rl-zoo {env_id}" if zoo else "SB3 defaults"
    normalize = bool(zoo.pop("normalize", False))
    zoo_steps = int(zoo.get("n_steps", SB3_DEFAULT_ROLLOUT))
    rollout = int(zoo.pop("n_envs", 1)) * zoo_steps
    per_env = rollout // num_envs
    zoo["n_steps"] = per_env if per_env >= MIN_STEPS_PER_ENV else zoo_steps
    return zoo, normalize, f"{source}, n_steps {zoo['n_steps']} x {num_envs} envs"


def run_sb3(env_id: str, num_envs: int, max_episode_steps: int, seed: int,
            env_steps: int) -> dict:
    """Train SB3's PPO in this process; the rolling mean of the last 100 episode returns
    (SB3's Monitor, ep_info_buffer) after each rollout, as (env_steps, mean) pairs."""
    import numpy as np
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    # One thread: --jobs runs share few cores, and these small networks gain little more.
    torch.set_num_threads(1)
    kwargs, normalize, _source = sb3_settings(env_id, num_envs)
    policy_kwargs = dict(kwargs.pop("policy_kwargs", {}))
    if "activation_fn" in policy_kwargs:
        policy_kwargs["activation_fn"] = getattr(torch.nn, policy_kwargs["activation_fn"])
    env_kwargs = {"max_episode_steps": max_episode_steps} if max_episode_steps else None
    env = make_vec_env(env_id, n_envs=num_envs, seed=seed, vec_env_cls=DummyVecEnv,
                       env_kwargs=env_kwargs)
    if normalize:
        # As rl-zoo does: the return normalization discounts with the algorithm's gamma.
        env = VecNormalize(env, gamma=kwargs.get("gamma", 0.99))
    curve: list[tuple[int, float]] = []

    class RollingReturn(BaseCallback):
        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            returns = [info["r"] for info in self.model.ep_info_buffer]
            curve.append((self.num_timesteps,
                          float(np.mean(returns)) if returns else math.nan))

    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0,
                policy_kwargs=policy_kwargs or None, **kwargs)
    start = time.perf_counter()
    model.learn(total_timesteps=env_steps, callback=RollingReturn())
    wall = time.perf_counter() - start
    env.close()
    # SB3 logs only the mean KL of an update, not the per-mini-batch max ours reports.
    return {"curve": curve, "wall_s": wall, "kl_max": math.nan, "best_iteration": None}


def sb3_status() -> tuple[bool, str]:
    """Whether SB3 imports here, and its version or why not. Asked of a child process so
    that this one, which imports MLX, never loads torch beside it."""
    done = subprocess.run(
        [sys.executable, "-c", "import stable_baselines3; print(stable_baselines3.__version__)"],
        capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
        return False, f"{lines[-1]}; `make bench` installs it"
    return True, done.stdout.strip()
