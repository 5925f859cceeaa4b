"""Return-based reward normalization: SB3's VecNormalize(norm_reward) on the stored rewards,
raw logged returns, and its statistics through checkpoints (none in a bundle)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import mlx.core as mx  # conftest loaded the optimized BLAS first
import numpy as np
import pytest

import unilab_ros.rl  # noqa: F401 - loads the optimized BLAS before mlx
from unilab_ros.loop.config import LoopConfig
from unilab_ros.loop.decisions import PublishAction
from unilab_ros.loop.training_loop import TrainingLoop
from unilab_ros.rl.actions import ActionConfig, ActionMapper
from unilab_ros.rl.agent import AgentConfig, PPOAgent, StepOfEnvs
from unilab_ros.rl.bundle import bundle_from_checkpoint
from unilab_ros.rl.checkpoint import Checkpoint, CheckpointError, restore_agent, save_checkpoint
from unilab_ros.rl.model import ModelConfig
from unilab_ros.rl.normalizer import ReturnNormalizer
from unilab_ros.rl.ppo_config import PPOConfig
from unilab_ros.rl.ppo_runtime import PPORuntimeConfig

NUM_ENVS, OBS_DIM, ACTION_DIM, NUM_STEPS, GAMMA = 3, 4, 2, 6, 0.9


def sb3_rewards(rewards: np.ndarray, dones: np.ndarray, clip: float) -> np.ndarray:
    """VecNormalize's normalized rewards, step by step, in float64: the variance is that of
    every discounted return seen so far, this step's included (its RunningMeanStd, without
    the 1e-4 pseudo-count)."""
    returns, seen, out = np.zeros(rewards.shape[1]), [], []
    for reward, done in zip(rewards, dones, strict=True):
        returns = returns * GAMMA + reward
        seen.extend(returns)
        out.append(np.clip(reward / np.sqrt(np.var(seen) + 1e-8), -clip, clip))
        returns[done != 0] = 0.0
    return np.array(out)


def make_agent(normalize: bool = True, num_envs: int = NUM_ENVS, **agent) -> PPOAgent:
    cfg = AgentConfig(num_envs=num_envs, obs_dim=OBS_DIM, action_dim=ACTION_DIM,
                      num_steps=NUM_STEPS, seed=3, normalize_rewards=normalize, **agent)
    return PPOAgent(cfg, ModelConfig(actor_hidden_dims=[8], critic_hidden_dims=[8]),
                    PPOConfig(gamma=GAMMA, num_mini_batches=2, num_learning_epochs=1),
                    runtime_cfg=PPORuntimeConfig(enable_compile=False))


def steps(seed: int, count: int, num_envs: int = NUM_ENVS) -> tuple[np.ndarray, np.ndarray]:
    """Rewards of several scales and done codes (terminations and time-outs)."""
    rng = np.random.default_rng(seed)
    rewards = (rng.normal(3.0, 20.0, (count, num_envs))).astype(np.float32)
    dones = rng.choice(np.array([0, 0, 0, 0, 1, 2], np.uint8), (count, num_envs))
    return rewards, dones


def fill(agent: PPOAgent, rewards: np.ndarray, dones: np.ndarray) -> None:
    """Record the steps (acting on random observations), updating at each full rollout."""
    rng = np.random.default_rng(0)
    for reward, done in zip(rewards, dones, strict=True):
        obs = rng.normal(size=(agent.cfg.num_envs, OBS_DIM)).astype(np.float32)
        if agent.record(obs, agent.act(obs), reward, done):
            agent.update(obs)


def test_the_normalizer_is_sb3s_vecnormalize():
    rewards, dones = steps(0, 200)
    rewards[50, 1] = 1e4  # a spike: clipped to the limit
    normalizer = ReturnNormalizer(NUM_ENVS, GAMMA, clip=5.0)
    ours = np.array([normalizer(r, d) for r, d in zip(rewards, dones, strict=True)])
    expected = sb3_rewards(rewards.astype(np.float64), dones, clip=5.0)
    np.testing.assert_allclose(ours, expected, rtol=2e-4, atol=1e-6)
    assert ours[50, 1] == np.float32(5.0)
    assert ours.dtype == np.float32


def test_the_agent_stores_the_scaled_rewards_normalized():
    rewards, dones = steps(1, NUM_STEPS - 1)
    agent = make_agent(reward_scale=0.5, reward_clip=3.0)
    fill(agent, rewards, dones)
    stored = agent.buffer.rewards[: NUM_STEPS - 1]
    np.testing.assert_allclose(stored, sb3_rewards(0.5 * rewards, dones, 3.0), rtol=2e-4)
    assert np.abs(stored).max() <= 3.0


def test_off_by_default_the_stored_rewards_are_only_scaled():
    rewards, dones = steps(1, NUM_STEPS - 1)
    agent = make_agent(normalize=False, reward_scale=0.5)
    assert AgentConfig().normalize_rewards is False and agent.reward_normalizer is None
    fill(agent, rewards, dones)
    np.testing.assert_array_equal(agent.buffer.rewards[: NUM_STEPS - 1], rewards * np.float32(0.5))


def test_a_lanes_steps_follow_the_return_of_the_env_they_came_from():
    agent = make_agent()
    step = StepOfEnvs(np.zeros((1, OBS_DIM), np.float32), np.zeros((1, ACTION_DIM), np.float32),
                      np.zeros((1, ACTION_DIM), np.float32), np.ones(ACTION_DIM, np.float32),
                      np.array([2.0], np.float32), np.zeros(1, np.uint8))
    # Env 0's step in lane (buffer column) 2: env 0's return moves, lane 2's env's does not.
    agent.record_rows(np.array([0]), np.array([2]), step, sources=np.array([0]))
    np.testing.assert_array_equal(agent.reward_normalizer.returns, [2.0, 0.0, 0.0])


def test_the_logged_episode_returns_stay_raw():
    agent = PPOAgent(AgentConfig(num_envs=2, obs_dim=OBS_DIM, action_dim=ACTION_DIM,
                                 num_steps=8, normalize_rewards=True),
                     ModelConfig(actor_hidden_dims=[8], critic_hidden_dims=[8]))
    loop = TrainingLoop(LoopConfig(), agent, ActionMapper(ActionConfig(), 2, ACTION_DIM))
    obs = np.zeros((2, OBS_DIM), np.float32)
    decisions = loop.on_observation(0, obs, 0, 0.0, 0.0)
    for stamp in range(1, 7):
        assert isinstance(decisions[0], PublishAction)
        loop.on_reward(0, np.full(2, 5.0, np.float32), stamp, 0.0)
        loop.on_done(0, np.full(2, stamp % 3 == 0, np.uint8), stamp, 0.0)
        decisions = loop.on_observation(0, obs + stamp, stamp, 0.0, 0.0)
    assert list(loop.stats.finished_returns) == [15.0] * 4
    assert not np.allclose(agent.buffer.rewards[:6], 5.0)


def test_a_resumed_run_continues_the_statistics_bit_exactly(tmp_path: Path):
    rewards, dones = steps(2, 4 * NUM_STEPS + 2)
    straight = make_agent()
    fill(straight, rewards[:NUM_STEPS + 2], dones[:NUM_STEPS + 2])
    path = save_checkpoint(tmp_path / "mid", straight)
    resumed = make_agent()
    restore_agent(resumed, Checkpoint(path))
    for name, value in straight.reward_normalizer.state().items():
        np.testing.assert_array_equal(resumed.reward_normalizer.state()[name], value)
    assert resumed.reward_normalizer.returns.any()  # mid-episode returns came back too
    # The resumed agent has no partial rollout: both go on from a fresh one.
    straight.buffer.clear()
    for agent in (straight, resumed):
        fill(agent, rewards[NUM_STEPS + 2:], dones[NUM_STEPS + 2:])
    np.testing.assert_array_equal(resumed.buffer.rewards, straight.buffer.rewards)
    assert resumed.reward_normalizer.count == straight.reward_normalizer.count


def test_a_checkpoint_written_without_them_loads_with_fresh_statistics(tmp_path: Path):
    """Files from before the option (no rewards/ arrays, no agent fields for it)."""
    path = save_checkpoint(tmp_path / "new", make_agent(normalize=False))
    arrays, meta = mx.load(str(path), return_metadata=True)
    assert not [name for name in arrays if name.startswith("rewards/")]
    agent_meta = json.loads(meta["agent"])
    del agent_meta["normalize_rewards"], agent_meta["reward_clip"]
    old = tmp_path / "old.safetensors"
    mx.save_safetensors(str(old), arrays, metadata=meta | {"agent": json.dumps(agent_meta)})
    checkpoint = Checkpoint(old)
    assert checkpoint.agent_cfg.normalize_rewards is False
    resumed = make_agent()
    restore_agent(resumed, checkpoint)
    assert resumed.reward_normalizer.count == 0.0 and resumed.reward_normalizer.var == 1.0


def test_another_number_of_envs_keeps_the_statistics_and_starts_the_returns_at_zero(tmp_path):
    agent = make_agent()
    fill(agent, *steps(3, 4))
    resumed = make_agent(num_envs=NUM_ENVS + 1)
    restore_agent(resumed, Checkpoint(save_checkpoint(tmp_path / "ckpt", agent)))
    assert resumed.reward_normalizer.var == agent.reward_normalizer.var
    np.testing.assert_array_equal(resumed.reward_normalizer.returns, np.zeros(NUM_ENVS + 1))


@pytest.mark.parametrize(("name", "value", "message"), [
    ("rewards/normalizer.var", -1.0, "rewards/normalizer.var holds -1: it must be >= 0"),
    ("rewards/normalizer.count", -2.0, "rewards/normalizer.count holds -2: it must be >= 0"),
    ("rewards/normalizer.mean", float("nan"), "rewards/normalizer.mean holds non-finite"),
    ("rewards/returns", float("inf"), "rewards/returns holds non-finite"),
    ("rewards/normalizer.var", None, "rewards/ does not fit this agent: missing ['normalizer.v"),
    ("rewards/returns", None, "rewards/returns is missing"),
])
def test_impossible_statistics_are_refused_naming_the_field(tmp_path, name, value, message):
    agent = make_agent()
    fill(agent, *steps(4, 4))
    arrays, meta = mx.load(str(save_checkpoint(tmp_path / "ok", agent)), return_metadata=True)
    if value is None:
        del arrays[name]
    else:
        arrays[name] = mx.full(arrays[name].shape, value)
    bad = tmp_path / "bad.safetensors"
    mx.save_safetensors(str(bad), arrays, metadata=meta)
    resumed = make_agent()
    with pytest.raises(CheckpointError, match=re.escape(message)) as caught:
        restore_agent(resumed, Checkpoint(bad))
    assert "\n" not in str(caught.value)
    assert resumed.reward_normalizer.count == 0.0  # nothing of the bad file was taken


def test_a_bundle_carries_no_reward_statistics(tmp_path: Path):
    agent = make_agent()
    fill(agent, *steps(5, NUM_STEPS))
    checkpoint = Checkpoint(save_checkpoint(tmp_path / "ckpt", agent))
    assert any(name.startswith("rewards/") for name in checkpoint.arrays)
    bundle = bundle_from_checkpoint(checkpoint, ActionConfig())
    assert bundle.arrays and not any("rewards" in name for name in bundle.arrays)
