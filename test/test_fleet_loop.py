"""A fleet's TrainingLoop and LaneRollout without ROS: robots that step, stall, rejoin.

Tiny sizes (3 robots x 2 envs, 4-step rollouts). Every env's observation carries its
env id and a per-env step count, so a test can tell from the buffer whose step a slot
holds and that no slot holds a step that was not taken.
"""

from __future__ import annotations

import numpy as np
import pytest

from unilab_ros.loop.config import LoopConfig
from unilab_ros.loop.decisions import BeginUpdate, PublishAction
from unilab_ros.loop.training_loop import Phase, TrainingLoop
from unilab_ros.rl.actions import ActionConfig, ActionMapper
from unilab_ros.rl.agent import AgentConfig, PPOAgent, StepOfEnvs
from unilab_ros.rl.done_codes import DoneCode
from unilab_ros.rl.lanes import LaneRollout
from unilab_ros.rl.model import ModelConfig
from unilab_ros.rl.ppo_config import PPOConfig
from unilab_ros.rl.ppo_runtime import PPORuntimeConfig

ROBOTS = ["robot1", "robot2", "robot3"]
PER_ROBOT, OBS_DIM, NUM_STEPS = 2, 3, 4
STEP_TIMEOUT = 1.0


def make_agent(num_envs: int) -> PPOAgent:
    return PPOAgent(
        AgentConfig(num_envs, OBS_DIM, 1, NUM_STEPS),
        ModelConfig(actor_hidden_dims=[8], critic_hidden_dims=[8]),
        PPOConfig(num_learning_epochs=1, num_mini_batches=1),
        runtime_cfg=PPORuntimeConfig(enable_compile=False),
    )


class Fleet:
    """A fleet's TrainingLoop and three robots' environment side, with a hand-kept clock."""

    def __init__(self) -> None:
        self.agent = make_agent(len(ROBOTS) * PER_ROBOT)
        actions = ActionMapper(ActionConfig(), PER_ROBOT, 1)
        self.loop = TrainingLoop(LoopConfig(step_timeout=STEP_TIMEOUT), self.agent, actions,
                                 ROBOTS)
        self.stamp, self.now = 0, 0.0
        self.steps = np.zeros(len(ROBOTS) * PER_ROBOT, np.int64)

    def obs(self, r: int) -> np.ndarray:
        """Robot r's state: (env id, steps taken, 1) per env."""
        envs = np.arange(r * PER_ROBOT, (r + 1) * PER_ROBOT)
        return np.stack([envs, self.steps[envs], np.ones(PER_ROBOT)], 1).astype(np.float32)

    def start(self, r: int):
        self.stamp += 1
        (decision,) = self.loop.on_observation(r, self.obs(r), self.stamp, self.now, self.now)
        return decision

    def step(self, r: int, done: int = 0):
        """Robot r answers its outstanding action: reward, done, next observation."""
        self.steps[r * PER_ROBOT:(r + 1) * PER_ROBOT] += 1
        self.stamp += 1
        reward = np.full(PER_ROBOT, -1.0, np.float32)
        assert self.loop.on_reward(r, reward, self.stamp, self.now) == []
        assert self.loop.on_done(r, np.full(PER_ROBOT, done, np.uint8), self.stamp,
                                 self.now) == []
        (decision,) = self.loop.on_observation(r, self.obs(r), self.stamp, self.now, self.now)
        return decision


def test_robots_step_on_their_own_and_fill_one_rollout():
    fleet = Fleet()
    for r in range(3):
        assert isinstance(fleet.start(r), PublishAction)
    # Robot 3 steps faster than the others: nobody waits for anybody.
    for _ in range(NUM_STEPS):
        assert fleet.step(2).robot == 2
    decisions = [fleet.step(r) for _ in range(NUM_STEPS) for r in (0, 1)]
    assert isinstance(decisions[-1], BeginUpdate)
    assert all(isinstance(d, PublishAction) for d in decisions[:-1])
    buffer = fleet.agent.buffer
    assert buffer.full
    # Env e's steps fill column e in order: the usual layout.
    np.testing.assert_array_equal(buffer.observations[:, :, 0], np.tile(np.arange(6), (4, 1)))
    np.testing.assert_array_equal(buffer.observations[:, :, 1], np.tile(np.arange(4)[:, None],
                                                                         (1, 6)))
    np.testing.assert_array_equal(fleet.loop.lanes.bootstrap_obs[:, 1], np.full(6, 4))
    assert fleet.agent.env_steps == 24
    metrics = fleet.loop.update()
    assert np.isfinite(metrics["value"])
    assert fleet.agent.iteration == 1
    assert [d.robot for d in fleet.loop.resume(fleet.now, fleet.now)] == [0, 1, 2]


def test_a_stalled_robot_is_cut_and_the_others_fill_the_rollout():
    fleet = Fleet()
    for r in range(3):
        fleet.start(r)
    fleet.step(0), fleet.step(1), fleet.step(2)
    # Robot 2 (index 1) goes silent: its step times out, the others are not blocked.
    fleet.step(0), fleet.step(2)
    fleet.now += STEP_TIMEOUT + 0.1
    assert [s.robot for s in fleet.loop.check_step_deadlines(fleet.now)] == [0, 1, 2]
    assert fleet.loop.counters["robot_stalls"] == 3
    # All three were late here (the clock jumped); robots 1 and 3 come back at once.
    fleet.start(0), fleet.start(2)
    assert fleet.loop.stalled_robots == ["robot2"]
    assert fleet.loop.counters["robot_rejoins"] == 2
    buffer = fleet.agent.buffer
    # Robot 2's one stored step is a time-out now: GAE bootstraps there.
    np.testing.assert_array_equal(buffer.dones[0, 2:4], [DoneCode.TRUNCATED] * 2)
    decision = None
    for _ in range(20):
        for r in (0, 2):
            decision = fleet.step(r)
            if isinstance(decision, BeginUpdate):
                break
        if isinstance(decision, BeginUpdate):
            break
    assert isinstance(decision, BeginUpdate)
    # Every slot holds a step that was taken: robot 2's env ids only where it stepped.
    ids = buffer.observations[:, :, 0]
    assert np.isin(ids[:, 2:4][1:], [0, 1, 4, 5]).all()
    assert (ids[0, 2:4] == [2, 3]).all()
    assert fleet.loop.phase is Phase.UPDATING
    fleet.loop.update()
    # Robot 2 is stalled: not acted on after the update; its next observation rejoins it.
    assert [d.robot for d in fleet.loop.resume(fleet.now, fleet.now)] == [0, 2]
    assert isinstance(fleet.start(1), PublishAction)
    assert fleet.loop.stalled_robots == []
    assert fleet.loop.counters["robot_rejoins"] == 3


def test_a_robot_gone_for_the_whole_rollout_does_not_stop_the_updates():
    fleet = Fleet()
    fleet.start(0), fleet.start(1)
    iterations = 0
    for _ in range(40):
        for r in (0, 1):
            if isinstance(fleet.step(r), BeginUpdate):
                fleet.loop.update()
                iterations += 1
                fleet.loop.resume(fleet.now, fleet.now)
    # 80 robot steps of 2 envs: each rollout of 24 slots takes 8 steps of each robot (the
    # rest wait for the update with no free slot), so 5 rollouts.
    assert iterations == 5
    assert fleet.agent.env_steps == iterations * 24 + fleet.loop.lanes.filled.sum()


def test_lanes_keep_segments_apart_and_store_nothing_past_full():
    agent = make_agent(2)
    lanes = LaneRollout(agent)

    def record(envs: list[int], value: float) -> bool:
        count = len(envs)
        obs = np.full((count, OBS_DIM), value, np.float32)
        step = StepOfEnvs(obs, np.zeros((count, 1), np.float32), np.zeros((count, 1)),
                          np.ones((1, 1)), np.zeros(count, np.float32),
                          np.zeros(count, np.uint8))
        return lanes.record(np.array(envs), step, obs + 1.0)

    record([0, 1], 0.0)
    lanes.cut(np.array([1]))
    for t in range(1, NUM_STEPS):
        assert not record([0], float(t))
    # Env 0's lane is full: it moves on into the lane env 1 left, after the cut.
    assert not record([0], 10.0)
    assert agent.buffer.dones[0, 1] == DoneCode.TRUNCATED
    assert agent.buffer.observations[1, 1, 0] == 10.0
    assert not record([0], 11.0)
    assert record([0], 12.0)
    assert lanes.filled.tolist() == [NUM_STEPS, NUM_STEPS]
    # Full: a further step has no slot and is not stored.
    assert record([1], 99.0)
    assert 99.0 not in agent.buffer.observations
    np.testing.assert_array_equal(lanes.bootstrap_obs[:, 0], [4.0, 13.0])
    assert agent.env_steps == 2 * NUM_STEPS


def test_fleet_sizes_and_trigger_are_checked():
    agent = make_agent(5)
    with pytest.raises(ValueError, match="robots x"):
        TrainingLoop(LoopConfig(), agent, ActionMapper(ActionConfig(), 2, 1), ROBOTS)
    with pytest.raises(ValueError, match="rollout is full"):
        TrainingLoop(LoopConfig(update_trigger="episode_end"), make_agent(6),
                     ActionMapper(ActionConfig(), 2, 1), ROBOTS)


def test_a_robot_silent_across_fast_updates_stalls_at_resume():
    # Updates reset every step in flight, so a robot whose step never comes back cannot
    # time out when the rollouts fill faster than step_timeout: resume stalls it instead.
    fleet = Fleet()
    for r in range(3):
        fleet.start(r)
    fleet.now += STEP_TIMEOUT + 0.5
    decision = None
    while not isinstance(decision, BeginUpdate):
        for r in (0, 2):
            decision = fleet.step(r)
            if isinstance(decision, BeginUpdate):
                break
    fleet.loop.update()
    decisions = fleet.loop.resume(fleet.now, fleet.now)
    assert [(type(d).__name__, d.robot) for d in decisions] == [
        ("PublishAction", 0), ("StepDropped", 1), ("PublishAction", 2)]
    assert fleet.loop.stalled_robots == ["robot2"]
