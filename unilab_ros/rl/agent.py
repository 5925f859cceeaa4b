"""PPOAgent: acting, storing steps and updating, independent of how steps arrive."""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from unilab_ros.rl.buffer import RolloutBuffer
from unilab_ros.rl.model import MLPActorCritic, ModelConfig
from unilab_ros.rl.normalizer import ReturnNormalizer
from unilab_ros.rl.policy import PolicySampler
from unilab_ros.rl.ppo import PPOTrainer
from unilab_ros.rl.ppo_config import PPOConfig
from unilab_ros.rl.ppo_runtime import PPORuntimeConfig

_LOG = logging.getLogger(__name__)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def gaussian_log_prob(actions: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """Log-density of each row of ``actions`` under the diagonal Gaussian (mean, std)."""
    z = (actions - mean) / std
    return np.sum(-0.5 * z * z - np.log(std) - _LOG_SQRT_2PI, axis=-1)


@dataclass(frozen=True)
class StepOfEnvs:
    """One step of some envs as the acting policy took it (rows: those envs)."""

    obs: np.ndarray
    actions: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    """The acting policy's mean and std of ``actions`` (PPO's "old" outputs)."""
    rewards: np.ndarray
    dones: np.ndarray


@dataclass
class AgentConfig:
    """Sizes of the problem and of one rollout."""

    num_envs: int = 1
    """Environments stepped together (rows of every message)."""
    obs_dim: int = 3
    """Observation size per env."""
    action_dim: int = 1
    """Action size per env."""
    num_steps: int = 24
    """Rollout length per env between updates."""
    seed: int = 0
    """Seeds weights, action noise and mini-batch shuffles."""
    reward_scale: float = 1.0
    """Rewards are multiplied by this before they are stored (the logged returns are not)."""
    normalize_rewards: bool = False
    """Divide the stored rewards (after ``reward_scale``) by the running std of each env's
    discounted return (discount ``ppo.gamma``), as Stable-Baselines3's VecNormalize and
    CleanRL's NormalizeReward do, so the critic's targets keep one scale on any task. The
    statistics run over the steps PPO stores and are saved in training checkpoints (a
    bundle needs none); the logged returns stay raw."""
    reward_clip: float = 10.0
    """With ``normalize_rewards``: normalized rewards are clipped to +-this (SB3's 10)."""

    def validate(self) -> None:
        for name in ("num_envs", "obs_dim", "action_dim", "num_steps"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("reward_scale", "reward_clip"):
            if not np.isfinite(getattr(self, name)) or getattr(self, name) <= 0.0:
                raise ValueError(f"{name} must be positive and finite")


class PPOAgent:
    """Owns the model, rollout buffer and PPO trainer of one training session.

    Collection evaluates the actor's mean and samples noise; each recorded step keeps
    the acting policy's mean, std and log-prob of its action, PPO's "old" outputs, so
    the ratio and KL of an update are measured against the policy that collected the
    data. The values are computed for the whole rollout at once before the epochs (the
    policy and the normalizer do not change while a rollout is collected), and the
    rollout enters the observation normalizer only after the epochs.
    ``action_bounds`` (policy units, see ``ActionMapper.policy_bounds``) feed the bounds
    loss. ``runtime_cfg`` says how the update runs (compilation, NaN/Inf checks).
    """

    def __init__(
        self,
        cfg: AgentConfig,
        model_cfg: ModelConfig | None = None,
        ppo_cfg: PPOConfig | None = None,
        action_bounds: tuple[np.ndarray, np.ndarray] | None = None,
        runtime_cfg: PPORuntimeConfig | None = None,
    ) -> None:
        cfg.validate()
        self.cfg = cfg
        self.ppo_cfg = ppo_cfg or PPOConfig()
        self.runtime_cfg = runtime_cfg or PPORuntimeConfig()
        rollout = cfg.num_envs * cfg.num_steps
        if self.ppo_cfg.num_mini_batches > rollout:
            raise ValueError(
                f"ppo.num_mini_batches={self.ppo_cfg.num_mini_batches} exceeds the "
                f"{rollout} samples of a rollout (num_envs x num_steps)"
            )
        self.model_cfg = model_cfg or ModelConfig()
        if self.model_cfg.squash_output:
            raise ValueError("model.squash_output is an off-policy actor's deployed form: PPO "
                             "trains a linear mean (fine-tune it with algorithm: sac)")
        mx.random.seed(cfg.seed)
        self.model = MLPActorCritic(cfg.obs_dim, cfg.action_dim, self.model_cfg)
        self.trainer = PPOTrainer(
            self.model, self.ppo_cfg, cfg.seed + 1, action_bounds, self.runtime_cfg
        )
        self.buffer = RolloutBuffer(
            cfg.num_steps,
            cfg.num_envs,
            cfg.obs_dim,
            cfg.action_dim,
            self.ppo_cfg.gamma,
            self.ppo_cfg.lam,
        )
        self.sampler = PolicySampler(self.model, cfg.seed + 2)
        self.reward_normalizer = (
            ReturnNormalizer(cfg.num_envs, self.ppo_cfg.gamma, cfg.reward_clip)
            if cfg.normalize_rewards else None
        )
        self.iteration = 0
        self.env_steps = 0
        self.critic_only_updates = 0
        """Updates still to come that train only the critic (a fine-tuning warm-up)."""
        self.freeze_normalizer = False
        """Keep the observation statistics as they are (fine-tuning from a bundle)."""
        self._acted: tuple[np.ndarray | None, np.ndarray, np.ndarray] = (
            None, self.sampler.last_mean, self.sampler.last_std)
        self._spare_buffer: RolloutBuffer | None = None
        """The buffer a rollout handed over by ``take_rollout`` was in (made on first use)."""
        self.model_lock = threading.RLock()
        """Held by an update running beside acting (``rl.background_update``), and by the
        control thread's own MLX work on the model meanwhile (checkpoints, bundles)."""
        mx.eval(self.model.parameters())

    def act(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray:
        """Policy actions (num_envs, action_dim) for raw observations."""
        actions = self.sampler(obs, deterministic)
        self._acted = (actions, self.sampler.last_mean, self.sampler.last_std)
        return actions

    def set_learning_rate(self, rate: float) -> None:
        """A new learning rate, live: the adaptive schedule goes on from it, the linear one
        replaces it at the next update, and the next checkpoint stores it with the
        optimizer."""
        self.trainer.learning_rate = rate

    def record(
        self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, dones: np.ndarray
    ) -> bool:
        """Store one step of every env; True when the rollout is full.

        With the actions comes what the acting policy computed for them: its mean, std
        and log-prob (PPO's "old" outputs). ``actions`` returned by the latest ``act``
        reuse that call's mean; others (a step recorded later) get the mean of the same,
        unchanged policy, recomputed without drawing noise.
        """
        acted, mean, std = self._acted
        if actions is not acted:
            self.sampler(obs, deterministic=True)
            mean, std = self.sampler.last_mean, self.sampler.last_std
        actions = np.asarray(actions, np.float32).reshape(self.cfg.num_envs, -1)
        log_probs = gaussian_log_prob(actions, mean, std)
        self.buffer.add(
            obs=obs, actions=actions, rewards=self._stored_rewards(rewards, dones), dones=dones,
            log_probs=log_probs, mean=mean, std=std,
        )
        self.env_steps += self.cfg.num_envs
        return self.buffer.full

    def record_rows(
        self,
        steps: np.ndarray,
        envs: np.ndarray,
        step: StepOfEnvs,
        sources: np.ndarray | None = None,
    ) -> None:
        """Store one step of the envs ``envs``, each at its own time index ``steps``,
        with the acting policy's mean and std (a fleet's robots step on their own).
        ``sources``: the envs whose steps these are, where they differ from the buffer
        columns ``envs`` (a lane taken over from a stalled robot); their discounted
        returns are the ones ``normalize_rewards`` follows."""
        actions = np.asarray(step.actions, np.float32).reshape(len(envs), -1)
        rewards = self._stored_rewards(
            step.rewards, step.dones, envs if sources is None else sources)
        self.buffer.put(
            steps, envs, obs=step.obs, actions=actions, rewards=rewards,
            dones=step.dones, log_probs=gaussian_log_prob(actions, step.mean, step.std),
            mean=step.mean, std=step.std,
        )
        self.env_steps += len(envs)

    def _stored_rewards(
        self, rewards: np.ndarray, dones: np.ndarray, envs: np.ndarray | slice = slice(None)
    ) -> np.ndarray:
        """What PPO learns from for the rewards of ``envs``: scaled, then normalized."""
        scaled = np.asarray(rewards, np.float32) * self.cfg.reward_scale
        if self.reward_normalizer is None:
            return scaled
        return self.reward_normalizer(scaled, dones, envs)

    @property
    def rollout_full(self) -> bool:
        return self.buffer.full

    def take_rollout(self) -> RolloutBuffer:
        """The full rollout, handed over for an update beside acting; the next steps go into
        a buffer of their own meanwhile (the two swap at each hand-over)."""
        full, spare = self.buffer, self._spare_buffer
        if spare is None:
            spare = RolloutBuffer(self.cfg.num_steps, self.cfg.num_envs, self.cfg.obs_dim,
                                  self.cfg.action_dim, self.ppo_cfg.gamma, self.ppo_cfg.lam)
        spare.clear()
        self.buffer, self._spare_buffer = spare, full
        return full

    def update(self, last_obs: np.ndarray,
               buffer: RolloutBuffer | None = None) -> dict[str, float]:
        """Normalizer, GAE and PPO epochs on the full rollout; clears it.

        ``buffer``: a rollout handed over by ``take_rollout``, whose steps may have been
        acted on by the policy before the latest update. The ratio stays against the policy
        that acted (its stored log-probs); the KL that adapts the learning rate and stops
        the epochs is measured from the policy as this update starts (its mean and std
        replace the stored ones), so it bounds this update's own step: against the acting
        policy, one update's distance alone stopped the epochs at their first mini-batch.
        """
        start = time.perf_counter()
        handed_over = buffer is not None
        buffer = self.buffer if buffer is None else buffer
        obs = mx.array(buffer.observations.reshape(-1, self.cfg.obs_dim))
        values = self.model.value(obs)
        last_values = self.model.value(mx.array(last_obs))
        mx.eval(values, last_values)
        if handed_over:
            mean, std, _ = self.model.distribution_params(obs)
            buffer.mean[:] = np.array(mean).reshape(buffer.mean.shape)
            buffer.std[:] = np.array(std).reshape(buffer.std.shape)
        buffer.values[: buffer.step] = np.array(values).reshape(buffer.step, -1)
        buffer.compute_returns_and_advantages(np.array(last_values))
        train_actor = self.critic_only_updates == 0
        if self.ppo_cfg.schedule == "linear":
            self.set_learning_rate(self.ppo_cfg.linear_learning_rate(self.iteration))
        metrics = self.trainer.update(buffer, self.iteration, train_actor)
        self.critic_only_updates = max(self.critic_only_updates - 1, 0)
        metrics["critic_only"] = float(not train_actor)
        # The epochs trained on inputs normalized as the acting policy saw them (as
        # rsl_rl and Stable-Baselines3 do by storing normalized observations); the next
        # rollout acts with the statistics that include this one.
        metrics["normalizer_kl"] = 0.0
        if self.model_cfg.normalize_observations and not self.freeze_normalizer:
            metrics["normalizer_kl"] = self.model.update_normalizer(obs)
        buffer.clear()
        self.iteration += 1
        metrics["update_time"] = time.perf_counter() - start
        _LOG.debug("update %d: %s", self.iteration, metrics)
        return metrics


def warm_up_update(
    cfg: AgentConfig,
    model_cfg: ModelConfig | None = None,
    ppo_cfg: PPOConfig | None = None,
    runtime_cfg: PPORuntimeConfig | None = None,
) -> float:
    """Run one PPO update of a throwaway agent of these sizes; return its seconds.

    MLX builds the compiled kernels of the update (C++ through the system compiler, up
    to a minute on a new machine, cached on disk afterwards) when it is first evaluated.
    Run before the real agent is made, this takes that out of the first rollout, where
    the robot would hold the safe action meanwhile; the real agent seeds MLX's random
    state again, so training goes exactly as without it.
    """
    start = time.perf_counter()
    agent = PPOAgent(cfg, model_cfg, ppo_cfg, runtime_cfg=runtime_cfg)
    rng = np.random.default_rng(cfg.seed)
    rewards = np.zeros(cfg.num_envs, np.float32)
    dones = np.zeros(cfg.num_envs, np.uint8)
    full = False
    while not full:
        obs = rng.standard_normal((cfg.num_envs, cfg.obs_dim), dtype=np.float32)
        full = agent.record(obs, agent.act(obs), rewards, dones)
    agent.update(rng.standard_normal((cfg.num_envs, cfg.obs_dim), dtype=np.float32))
    return time.perf_counter() - start
