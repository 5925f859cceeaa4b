"""An off-policy training checkpoint resumes the learner where it stopped, with its replay;
a replay file seeds another agent; bad files are refused with the reason."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from unilab_ros.rl.agent import AgentConfig
from unilab_ros.rl.bundle import read_policy
from unilab_ros.rl.checkpoint import Checkpoint, CheckpointError
from unilab_ros.rl.sac_agent import SACAgent
from unilab_ros.rl.sac_checkpoint import (
    load_replay,
    replay_path,
    restore_sac,
    save_replay,
    save_sac_checkpoint,
)
from unilab_ros.rl.sac_config import SACConfig

SIZES = AgentConfig(num_envs=2, obs_dim=3, action_dim=2, seed=4)
CFG = SACConfig(actor_hidden_dims=[16], critic_hidden_dims=[16], batch_size=8,
                buffer_size=50, learning_starts=10)


def trained(steps: int = 20) -> SACAgent:
    agent = SACAgent(SIZES, CFG)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        obs = rng.standard_normal((2, 3)).astype(np.float32)
        agent.record(obs, agent.act(obs), rng.standard_normal(2), np.zeros(2, np.uint8))
        agent.learn()
    return agent


def test_a_resumed_learner_has_the_weights_optimizers_counters_streams_and_replay(tmp_path):
    agent = trained()
    path = save_sac_checkpoint(tmp_path / "latest", agent)
    assert path.name == "latest.safetensors" and replay_path(path).is_file()
    fresh = SACAgent(SIZES, CFG)
    restore_sac(fresh, Checkpoint(path))
    for (name, a), (_, b) in zip(tree_flatten(agent.model.parameters()),
                                 tree_flatten(fresh.model.parameters()), strict=True):
        np.testing.assert_array_equal(np.array(a), np.array(b), err_msg=name)
    for mine, theirs in zip(agent.learner.optimizers, fresh.learner.optimizers, strict=True):
        stored = dict(tree_flatten(theirs.state))
        assert stored.keys() == dict(tree_flatten(mine.state)).keys()
        for name, value in tree_flatten(mine.state):
            np.testing.assert_array_equal(np.array(stored[name]), np.array(value), err_msg=name)
    assert (fresh.env_steps, fresh.iteration, fresh.learner.steps) == (
        agent.env_steps, agent.iteration, agent.learner.steps)
    assert fresh.updates_owed == agent.updates_owed and fresh.learning
    assert fresh.replay.size == agent.replay.size == 40
    obs = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(fresh.act(obs), agent.act(obs))
    # The compiled step goes on from the restored optimizer state.
    fresh.record(obs, fresh.act(obs), np.zeros(2), np.zeros(2, np.uint8))
    fresh.learn()
    assert int(np.array(fresh.learner.optimizers[0].state["step"])) == (
        int(np.array(agent.learner.optimizers[0].state["step"])) + 2)


def test_a_saved_replay_seeds_a_new_agent_and_a_foreign_one_is_refused(tmp_path):
    agent = trained(12)
    path = save_replay(tmp_path / "run.replay.safetensors", agent)
    other = SACAgent(AgentConfig(num_envs=1, obs_dim=3, action_dim=2), CFG)
    assert load_replay(path, other) == 24 and other.replay.sampleable == 24
    wrong = SACAgent(AgentConfig(num_envs=2, obs_dim=4, action_dim=2), CFG)
    with pytest.raises(CheckpointError, match="obs_dim"):
        load_replay(path, wrong)
    with pytest.raises(CheckpointError, match="another shape"):
        restore_sac(wrong, Checkpoint(save_sac_checkpoint(tmp_path / "x", agent,
                                                          with_replay=False)))
    (tmp_path / "junk.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot read"):
        Checkpoint(tmp_path / "junk.safetensors")


def test_a_sac_checkpoint_is_read_as_any_checkpoint_and_serves_its_actor(tmp_path):
    agent = trained(15)
    path = save_sac_checkpoint(tmp_path / "best", agent, {"best_mean_return": 1.5})
    checkpoint = Checkpoint(path)
    assert (checkpoint.algorithm, checkpoint.iteration, checkpoint.env_steps) == (
        "sac", agent.iteration, agent.env_steps)
    assert checkpoint.extra["best_mean_return"] == 1.5 and checkpoint.ppo_cfg is None
    obs = np.random.default_rng(3).standard_normal((5, 3)).astype(np.float32)
    actor = read_policy(path).model()
    np.testing.assert_allclose(np.array(actor.policy(mx.array(obs))),
                               agent.act(obs, deterministic=True), atol=1e-5)
    from unilab_ros.rl.agent import PPOAgent
    from unilab_ros.rl.checkpoint import restore_agent

    with pytest.raises(CheckpointError, match="algorithm sac"):
        restore_agent(PPOAgent(AgentConfig(num_envs=2, obs_dim=3, action_dim=2)), checkpoint)


def test_a_saved_replay_seeds_a_new_session_and_not_a_resumed_one(tmp_path):
    from dataclasses import replace

    from unilab_ros.trainer.session import SessionConfig, build_session

    agent = trained(12)
    path = save_replay(tmp_path / "earlier.replay.safetensors", agent)
    cfg = SessionConfig(SIZES, algorithm="sac", sac=replace(CFG, replay_from=str(path)))
    session = build_session(cfg)
    assert session.loop.agent.replay.size == 24
    assert any("24 transitions" in note for note in session.notes)
    resumed = replace(cfg, resume_from=str(save_sac_checkpoint(tmp_path / "latest", agent)))
    with pytest.raises(ValueError, match="replay_from"):
        build_session(resumed)
