"""Learning while acting: the off-policy learner steps on a thread of its own, the loop
never pauses for it (no BeginUpdate, no safe action held) and reports per iteration the
gradient steps, the achieved update-to-data ratio and the policy lag (PPO's form of the
mode: test_ppo_beside_acting.py)."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest
from loop_harness import run_paced

from unilab_ros.config.paths import config_file
from unilab_ros.config.training_setup import load_setup
from unilab_ros.loop.config import LoopConfig
from unilab_ros.rl.agent import AgentConfig
from unilab_ros.rl.background_learner import STEPS_PER_CALL, BackgroundLearner
from unilab_ros.rl.sac_agent import SACAgent
from unilab_ros.rl.sac_config import SACConfig
from unilab_ros.sims.gym_vector import GymVectorSim
from unilab_ros.trainer.session import SessionConfig, build_session

SMALL = SACConfig(actor_hidden_dims=[32], critic_hidden_dims=[32], batch_size=32,
                  learning_starts=64)


def pendulum_session(**loop):
    setup = load_setup(config_file("pendulum_sac.yaml"))
    cfg = SessionConfig(setup.agent, actions=setup.actions, algorithm="sac", sac=SMALL,
                        loop=LoopConfig(checkpoint_interval=0, learn_while_acting=True,
                                        **loop))
    return setup, build_session(cfg)


def test_the_loop_never_pauses_and_each_iteration_reports_the_learner():
    setup, session = pendulum_session(max_iterations=12)
    loop, agent = session.loop, session.loop.agent
    sim = GymVectorSim(setup.env_id, setup.agent.num_envs, 0, 0)
    try:
        # A robot at real time: the learner gets the time between two steps. Its first
        # step compiles, which a loaded machine can stretch past the whole run: the
        # robot waits for that one (bounded), never for another.
        orders: list[list[str]] = []
        reports, paused = run_paced(
            loop, sim, 120.0, 0.005,
            gate=lambda: agent.env_steps < 2 * SMALL.learning_starts or agent.learner.steps > 0,
            orders=orders)
    finally:
        loop.close()
        sim.close()
    assert paused == 0 and len(reports) == 12 and agent.iteration == 12
    # The action goes out before the iteration's report and saves; the last one acts no more.
    closing = [order for order in orders if "IterationDone" in order]
    assert [order[0] for order in closing] == ["PublishAction"] * 11 + ["IterationDone"]
    assert closing[-1][-1] == "Finished"
    assert loop.learner is not None and not loop.learner.running
    learned = [m for m in reports if m["gradient_steps"] > 0]
    assert learned, reports
    for metrics in learned:
        assert 0 <= metrics["policy_lag"] <= STEPS_PER_CALL
        assert metrics["utd_achieved"] > 0.0 and np.isfinite(metrics["critic_loss"])
    # The thread may have stepped on after the last report, until it was stopped.
    assert agent.learner.steps >= sum(m["gradient_steps"] for m in reports)


def test_a_failing_learner_thread_is_reported_not_silent():
    agent = SACAgent(AgentConfig(num_envs=1, obs_dim=3, action_dim=1),
                     replace(SMALL, learning_starts=0))
    learner = BackgroundLearner(agent)

    def broken(*_args, **_kwargs):
        raise RuntimeError("disk on fire")

    agent.learn = broken
    learner.start()
    obs = np.zeros((1, 3), np.float32)
    for _ in range(4):
        agent.record(obs, agent.act(obs), np.zeros(1), np.zeros(1, np.uint8))
    deadline = time.monotonic() + 10.0
    while learner.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not learner.running
    with pytest.raises(RuntimeError, match="disk on fire"):
        agent.update()
    learner.stop()
