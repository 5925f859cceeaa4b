"""Samples/s of one PPO update phase: unilab_ros (MLX) against rsl_rl (PyTorch CPU).

One update phase is what runs between two rollouts: the last values and GAE returns,
then 5 epochs x 4 mini-batches of the clipped-surrogate PPO step. Both trainers get
the same synthetic rollout, the same network sizes and weights, and the same loss
terms (clipped value loss, entropy bonus, gradient clip 1.0, KL-adaptive learning
rate with desired_kl 0.01 decided on every mini-batch). Each is timed after one
warm-up phase (ours may JIT-compile then); the median of the repeats is reported.

The last line reads ``ppo_update ratio_robot=<x> ratio_small=<y>`` where a ratio is
rsl_rl's seconds over ours (above 1: ours is faster). Without torch / rsl-rl-lib
(``make bench`` installs them) the rsl_rl side is skipped and the ratios are nan.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import unilab_ros.rl  # noqa: F401 - loads the optimized BLAS before mlx is imported
import mlx.core as mx  # noqa: I001 - must follow unilab_ros.rl

from unilab_ros.rl.buffer import TERMINATED, RolloutBuffer
from unilab_ros.rl.distributions import diag_gaussian_log_prob
from unilab_ros.rl.model import MLPActorCritic, ModelConfig
from unilab_ros.rl.ppo import PPOConfig, PPOTrainer

EPOCHS = 5
MINI_BATCHES = 4
# rsl_rl's PPO defaults, applied to both trainers.
CLIP = 0.2
GAMMA = 0.99
LAM = 0.95
VALUE_LOSS_COEF = 1.0
ENTROPY_COEF = 0.01
LEARNING_RATE = 1e-3
MAX_GRAD_NORM = 1.0
DESIRED_KL = 0.01
INIT_STD = 1.0


@dataclass(frozen=True)
class Size:
    """One benchmark problem."""

    name: str
    num_envs: int
    num_steps: int
    obs_dim: int
    action_dim: int
    hidden: tuple[int, ...]

    @property
    def samples(self) -> int:
        return self.num_envs * self.num_steps


SIZES = (
    Size("robot", 256, 24, 48, 12, (512, 256, 128)),
    Size("small", 16, 64, 3, 1, (64, 64)),
)


@dataclass
class Rollout:
    """A synthetic rollout as numpy arrays shaped (T, N, ...), and the next observation."""

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    values: np.ndarray
    log_probs: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    last_obs: np.ndarray


def make_model(size: Size) -> MLPActorCritic:
    cfg = ModelConfig(
        actor_hidden_dims=list(size.hidden),
        critic_hidden_dims=list(size.hidden),
        activation="elu",
        init_noise_std=INIT_STD,
        normalize_observations=False,
    )
    return MLPActorCritic(size.obs_dim, size.action_dim, cfg)


def make_rollout(size: Size, model: MLPActorCritic, seed: int = 0) -> Rollout:
    """Random observations and rewards, ~2% terminations, policy outputs from ``model``."""
    rng = np.random.default_rng(seed)
    shape = (size.num_steps, size.num_envs)
    obs = rng.standard_normal((*shape, size.obs_dim), dtype=np.float32)
    flat = mx.array(obs.reshape(size.samples, size.obs_dim))
    mean, std, log_std = model.distribution_params(flat)
    noise = mx.array(rng.standard_normal((size.samples, size.action_dim), dtype=np.float32))
    actions = mean + std * noise
    log_probs = diag_gaussian_log_prob(actions, mean, log_std)
    values = model.value(flat)
    return Rollout(
        obs=obs,
        actions=np.array(actions).reshape(*shape, size.action_dim),
        rewards=rng.standard_normal(shape, dtype=np.float32),
        dones=np.where(rng.random(shape) < 0.02, TERMINATED, 0).astype(np.uint8),
        values=np.array(values).reshape(shape),
        log_probs=np.array(log_probs).reshape(shape),
        mean=np.array(mean).reshape(*shape, size.action_dim),
        std=np.array(std).reshape(*shape, size.action_dim),
        last_obs=rng.standard_normal((size.num_envs, size.obs_dim), dtype=np.float32),
    )


def time_phases(phase: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """(seconds of the first, warm-up call; median seconds of ``repeats`` further calls)."""
    start = time.perf_counter()
    phase()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        phase()
        times.append(time.perf_counter() - start)
    return first, statistics.median(times)


def ours_phase(size: Size, model: MLPActorCritic, rollout: Rollout) -> Callable[[], Any]:
    cfg = PPOConfig(
        num_learning_epochs=EPOCHS,
        num_mini_batches=MINI_BATCHES,
        clip_param=CLIP,
        gamma=GAMMA,
        lam=LAM,
        value_loss_coef=VALUE_LOSS_COEF,
        entropy_coef=ENTROPY_COEF,
        learning_rate=LEARNING_RATE,
        use_clipped_value_loss=True,
        max_grad_norm=MAX_GRAD_NORM,
        schedule="adaptive",
        desired_kl=DESIRED_KL,
        # rsl_rl's rule: react to each mini-batch's KL, by a factor 1.5 either way.
        adaptive_kl_beta=0.0,
        adaptive_lr_decay=1.5,
        adaptive_lr_growth=1.5,
    )
    trainer = PPOTrainer(model, cfg)
    buffer = RolloutBuffer(
        size.num_steps, size.num_envs, size.obs_dim, size.action_dim, GAMMA, LAM
    )
    buffer.observations[:] = rollout.obs
    buffer.actions[:] = rollout.actions
    buffer.rewards[:] = rollout.rewards
    buffer.dones[:] = rollout.dones
    buffer.step = size.num_steps
    buffer.set_policy_outputs(rollout.log_probs, rollout.mean, rollout.std, rollout.values)
    last_obs = mx.array(rollout.last_obs)

    def phase() -> dict[str, float]:
        last_values = np.array(model.value(last_obs))
        buffer.compute_returns_and_advantages(last_values)
        return trainer.update(buffer)

    return phase


def rsl_rl_phase(size: Size, model: MLPActorCritic, rollout: Rollout) -> Callable[[], Any]:
    """rsl_rl's PPO and RolloutStorage built as its OnPolicyRunner builds them."""
    import torch
    from rsl_rl.algorithms import PPO
    from rsl_rl.models import MLPModel
    from rsl_rl.storage import RolloutStorage
    from tensordict import TensorDict

    torch.set_num_threads(os.cpu_count() or 1)
    obs = TensorDict({"policy": torch.from_numpy(rollout.last_obs)}, batch_size=[size.num_envs])
    groups = {"actor": ["policy"], "critic": ["policy"]}
    distribution = {"class_name": "GaussianDistribution", "init_std": INIT_STD}
    actor = MLPModel(obs, groups, "actor", size.action_dim, list(size.hidden), "elu",
                     obs_normalization=False, distribution_cfg=distribution)
    critic = MLPModel(obs, groups, "critic", 1, list(size.hidden), "elu",
                      obs_normalization=False)
    copy_weights(model, actor, critic)
    storage = RolloutStorage("rl", size.num_envs, size.num_steps, obs, [size.action_dim])
    algorithm = PPO(
        actor,
        critic,
        storage,
        num_learning_epochs=EPOCHS,
        num_mini_batches=MINI_BATCHES,
        clip_param=CLIP,
        gamma=GAMMA,
        lam=LAM,
        value_loss_coef=VALUE_LOSS_COEF,
        entropy_coef=ENTROPY_COEF,
        learning_rate=LEARNING_RATE,
        max_grad_norm=MAX_GRAD_NORM,
        use_clipped_value_loss=True,
        schedule="adaptive",
        desired_kl=DESIRED_KL,
    )
    algorithm.train_mode()
    storage.observations["policy"].copy_(torch.from_numpy(rollout.obs))
    storage.actions.copy_(torch.from_numpy(rollout.actions))
    storage.rewards.copy_(torch.from_numpy(rollout.rewards)[..., None])
    storage.dones.copy_(torch.from_numpy(rollout.dones)[..., None])
    storage.values.copy_(torch.from_numpy(rollout.values)[..., None])
    storage.actions_log_prob.copy_(torch.from_numpy(rollout.log_probs)[..., None])
    storage.distribution_params = (torch.from_numpy(rollout.mean), torch.from_numpy(rollout.std))

    def phase() -> dict[str, float]:
        # update() clears the storage (rewinds its cursor); the data stays.
        storage.step = size.num_steps
        algorithm.compute_returns(obs)
        return algorithm.update()

    return phase


def copy_weights(model: MLPActorCritic, actor: Any, critic: Any) -> None:
    """Give rsl_rl's MLPModels the MLX model's weights (both store Linear as (out, in))."""
    import torch

    with torch.no_grad():
        for ours, theirs in ((model.actor, actor), (model.critic, critic)):
            linears = [m for m in theirs.mlp if isinstance(m, torch.nn.Linear)]
            for layer, linear in zip(ours.layers, linears, strict=True):
                linear.weight.copy_(torch.from_numpy(np.array(layer.weight)))
                linear.bias.copy_(torch.from_numpy(np.array(layer.bias)))
        actor.distribution.std_param.copy_(torch.from_numpy(np.array(model.std)))


def rsl_rl_missing() -> str | None:
    """Why rsl_rl cannot be benchmarked here, or None when it can."""
    try:
        import rsl_rl.algorithms  # noqa: F401
        import tensordict  # noqa: F401
        import torch  # noqa: F401
    except Exception as error:  # noqa: BLE001 - any import failure means: skip rsl_rl
        return f"{type(error).__name__}: {error}"
    return None


def bench_size(size: Size, repeats: int, skip_reason: str | None) -> float:
    """Print one size's figures; return rsl_rl seconds / ours (nan when rsl_rl is skipped)."""
    print(
        f"{size.name}: {size.num_envs} envs x {size.num_steps} steps, obs {size.obs_dim}, "
        f"act {size.action_dim}, hidden {list(size.hidden)} ELU, {size.samples} samples, "
        f"{EPOCHS} epochs x {MINI_BATCHES} mini-batches"
    )
    mx.random.seed(0)
    model = make_model(size)
    rollout = make_rollout(size, model)
    theirs = math.nan
    if skip_reason is None:
        try:
            first, theirs = time_phases(rsl_rl_phase(size, model, rollout), repeats)
        except Exception as error:  # noqa: BLE001 - report and go on without rsl_rl
            skip_reason = f"{type(error).__name__}: {error}"
        else:
            print(f"  rsl_rl {theirs:8.3f} s  {size.samples / theirs:9.0f} samples/s"
                  f"  (first call {first:.3f} s)")
    if skip_reason is not None:
        print(f"  rsl_rl skipped: {skip_reason}")
    compiled = PPOConfig().enable_compile
    first, ours = time_phases(ours_phase(size, model, rollout), repeats)
    print(f"  ours   {ours:8.3f} s  {size.samples / ours:9.0f} samples/s"
          f"  (first call {first:.3f} s, enable_compile={compiled})")
    ratio = theirs / ours
    print(f"  ratio  {ratio:.2f}")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed phases per trainer")
    args = parser.parse_args()
    skip_reason = rsl_rl_missing()
    if skip_reason is not None:
        print(f"rsl_rl not importable ({skip_reason}): install the bench deps (make bench)")
    ratios = {size.name: bench_size(size, args.repeats, skip_reason) for size in SIZES}
    print(f"ppo_update ratio_robot={ratios['robot']:.2f} ratio_small={ratios['small']:.2f}")


if __name__ == "__main__":
    main()
