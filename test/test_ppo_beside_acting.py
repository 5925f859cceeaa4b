"""PPO beside acting (``learn_while_acting`` with algorithm ppo): the update of rollout k
runs on a thread while rollout k+1 is collected. The loop never pauses, acts meanwhile with
the policy as it was when the update started (one policy, whose outputs each stored step
keeps), counts the steps it could not store when the robot outruns the update, and reports
the policy lag of each rollout it learned from."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import numpy as np
import pytest
from loop_harness import run_paced

from unilab_ros.config.paths import config_file
from unilab_ros.config.training_setup import load_setup
from unilab_ros.loop.config import LoopConfig
from unilab_ros.rl.agent import AgentConfig, PPOAgent
from unilab_ros.rl.background_update import BackgroundUpdate
from unilab_ros.rl.model import ModelConfig
from unilab_ros.rl.ppo_config import PPOConfig
from unilab_ros.sims.gym_vector import GymVectorSim
from unilab_ros.trainer.session import SessionConfig, build_session

SMALL = ModelConfig(actor_hidden_dims=[16], critic_hidden_dims=[16])
FEW_EPOCHS = PPOConfig(num_learning_epochs=2, num_mini_batches=2)


def small_agent(**model) -> PPOAgent:
    return PPOAgent(AgentConfig(num_envs=2, obs_dim=3, action_dim=1, num_steps=8),
                    replace(SMALL, **model), FEW_EPOCHS)


def fill(agent: PPOAgent, rng: np.random.Generator) -> None:
    while not agent.rollout_full:
        obs = rng.standard_normal((2, 3), dtype=np.float32)
        agent.record(obs, agent.act(obs), rng.standard_normal(2).astype(np.float32),
                     np.zeros(2, np.uint8))


def held_update(agent: PPOAgent) -> threading.Event:
    """Make the agent's update finish its work, then wait for the returned event."""
    release, real = threading.Event(), agent.update

    def update(*args, **kwargs):
        metrics = real(*args, **kwargs)
        assert release.wait(30.0)
        return metrics

    agent.update = update
    return release


def test_the_robot_acts_with_the_policy_the_update_started_from_until_it_lands():
    agent, rng = small_agent(), np.random.default_rng(0)
    fill(agent, rng)
    obs = rng.standard_normal((2, 3), dtype=np.float32)
    before = agent.act(obs, deterministic=True).copy()
    release = held_update(agent)
    update = BackgroundUpdate(agent)
    update.start(rng.standard_normal((2, 3), dtype=np.float32))
    try:
        assert update.running and not agent.rollout_full  # the next rollout has a buffer
        deadline = time.monotonic() + 30.0
        while agent.iteration == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        # The model is updated already; the acting policy is still the one that started.
        assert agent.iteration == 1
        np.testing.assert_array_equal(agent.act(obs, deterministic=True), before)
    finally:
        release.set()
    while not update.done:
        time.sleep(0.01)
    metrics = update.take()
    assert np.isfinite(metrics["approx_kl"]) and metrics["updates_applied"] > 0
    assert not np.array_equal(agent.act(obs, deterministic=True), before)


def test_an_actor_numpy_cannot_copy_is_refused_at_the_start():
    with pytest.raises(ValueError, match="numpy twin"):
        BackgroundUpdate(small_agent(activation="gelu"))


def test_a_failed_update_is_reported_when_it_lands():
    agent, rng = small_agent(), np.random.default_rng(1)
    fill(agent, rng)

    def broken(*_args, **_kwargs):
        raise RuntimeError("disk on fire")

    agent.update = broken
    update = BackgroundUpdate(agent)
    update.start(np.zeros((2, 3), np.float32))
    while not update.done:
        time.sleep(0.01)
    with pytest.raises(RuntimeError, match="disk on fire"):
        update.take()
    assert not agent.sampler.pinned


def pendulum_session(num_steps: int, max_iterations: int):
    setup = load_setup(config_file("pendulum.yaml"))
    cfg = SessionConfig(replace(setup.agent, num_envs=4, num_steps=num_steps), SMALL,
                        replace(setup.ppo, num_mini_batches=4, num_learning_epochs=2),
                        setup.runtime, setup.actions,
                        LoopConfig(checkpoint_interval=0, learn_while_acting=True,
                                   max_iterations=max_iterations))
    return setup, build_session(cfg)


def test_ppo_updates_beside_acting_and_the_loop_never_pauses():
    setup, session = pendulum_session(num_steps=32, max_iterations=6)
    loop, agent = session.loop, session.loop.agent
    first = np.array(agent.model.parameters()["actor"]["layers"][0]["weight"])
    sim = GymVectorSim(setup.env_id, 4, 0, 0)
    try:
        reports, paused = run_paced(loop, sim, 120.0, 0.002)
    finally:
        loop.close()
        sim.close()
    assert paused == 0 and len(reports) == 6 and agent.iteration == 6
    for metrics in reports:
        assert 0.0 <= metrics["policy_lag"] <= 1.0 and np.isfinite(metrics["approx_kl"])
    # Every stored step belongs to one of the rollouts learned from (or the one after).
    assert 6 * 4 * 32 <= agent.env_steps <= 7 * 4 * 32
    assert not np.array_equal(first, agent.model.parameters()["actor"]["layers"][0]["weight"])


def test_steps_the_robot_takes_while_the_next_rollout_waits_for_the_update_are_counted():
    setup, session = pendulum_session(num_steps=8, max_iterations=2)
    loop, agent = session.loop, session.loop.agent
    release = held_update(agent)
    sim = GymVectorSim(setup.env_id, 4, 0, 0)
    timer = threading.Timer(3.0, release.set)
    timer.start()
    try:
        reports, paused = run_paced(loop, sim, 60.0, 0.0)
    finally:
        release.set()
        timer.cancel()
        loop.close()
        sim.close()
    assert paused == 0 and len(reports) == 2
    behind = loop.counters["steps_behind_update"]
    # Held for 3 s, the robot went on for hundreds of steps, none of them stored: only the
    # two rollouts learned from and the one collected during the second update.
    assert behind > 100 and agent.env_steps == 3 * 4 * 8
    assert reports[1]["policy_lag"] == 1.0
