"""The off-policy learner on the topic contract behaves as PPO does there: bad messages are
refused before they reach replay (no stored transition is ever non-finite), actions stay in
their bounds, a fleet's robots feed one replay each in its own rows, and done codes keep
their meaning (a failure ends without bootstrap, a time-out bootstraps)."""

from __future__ import annotations

import numpy as np
import pytest
from std_msgs.msg import Float32MultiArray
from trainer_harness import NUM_ENVS, OBS_DIM

from unilab_ros.loop.config import LoopConfig
from unilab_ros.loop.decisions import PublishAction
from unilab_ros.loop.training_loop import TrainingLoop
from unilab_ros.rl.actions import ActionConfig, ActionMapper
from unilab_ros.rl.agent import AgentConfig
from unilab_ros.rl.done_codes import DoneCode
from unilab_ros.rl.sac_agent import SACAgent
from unilab_ros.rl.sac_config import SACConfig

SMALL = SACConfig(actor_hidden_dims=[8], critic_hidden_dims=[8], batch_size=4,
                  learning_starts=4)
SAC_PARAMS = {"algorithm": "sac", "sac.actor_hidden_dims": [8], "sac.critic_hidden_dims": [8],
              "sac.batch_size": 4, "sac.learning_starts": 4, "action_scale": [2.0],
              "action_low": [-2.0], "action_high": [2.0], "safe_action": [0.0]}


def assert_replay_finite(agent: SACAgent) -> None:
    replay, size = agent.replay, agent.replay.size
    for name in ("obs", "actions", "rewards", "next_obs", "terminal"):
        assert np.isfinite(getattr(replay, name)[:size]).all(), name


@pytest.mark.ros
def test_no_stored_transition_is_ever_non_finite_and_actions_stay_in_bounds(make_env):
    env = make_env(**SAC_PARAMS)
    agent = env.trainer.agent
    assert isinstance(agent, SACAgent)
    env.start()
    bad_obs = [np.full(NUM_ENVS * OBS_DIM, value, np.float32) for value in
               (np.nan, np.inf, 1e30)]
    bad_rewards = [[np.nan, 0.0], [0.0, -np.inf], [1e30, 0.0]]
    for step in range(24):
        # Each step comes with garbage the trainer must refuse, then the real parts.
        env.obs_pub.publish(Float32MultiArray(data=bad_obs[step % 3].tolist()))
        env.reward_pub.publish(Float32MultiArray(data=bad_rewards[step % 3]))
        env.step(reward=np.full(NUM_ENVS, 0.5, np.float32))
    counters = env.trainer.counters
    assert env.spin_until(lambda: counters["rejected_observations"] == 24
                          and counters["rejected_rewards"] == 24)
    # A step the env sent while a learning phase held the safe action is discarded (no
    # pause service here), as with PPO; every completed step is in replay.
    completed = env.trainer.loop.step_counters["steps_completed"]
    assert completed >= 18 and agent.replay.size == completed * NUM_ENVS
    assert agent.iteration >= 4
    assert_replay_finite(agent)
    assert np.all(agent.replay.rewards[:agent.replay.size] == 0.5)
    actions = np.stack(env.actions)
    assert np.isfinite(actions).all() and np.abs(actions).max() <= 2.0


ROBOTS, PER_ROBOT = ["a", "b", "c"], 2


class SACFleet:
    """A fleet's TrainingLoop with the off-policy learner; every env's observation is
    (env id, steps it took, 1), so each stored transition tells whose it is."""

    def __init__(self) -> None:
        num_envs = len(ROBOTS) * PER_ROBOT
        self.agent = SACAgent(AgentConfig(num_envs, 3, 1, num_steps=4), SMALL)
        self.loop = TrainingLoop(LoopConfig(step_timeout=1.0), self.agent,
                                 ActionMapper(ActionConfig(), PER_ROBOT, 1), ROBOTS)
        self.steps = np.zeros(num_envs, np.int64)
        self.stamp = 0

    def obs(self, r: int) -> np.ndarray:
        envs = np.arange(r * PER_ROBOT, (r + 1) * PER_ROBOT)
        return np.stack([envs, self.steps[envs], np.ones(PER_ROBOT)], 1).astype(np.float32)

    def start(self, r: int) -> None:
        self.stamp += 1
        self.loop.on_observation(r, self.obs(r), self.stamp, 0.0, 0.0)

    def step(self, r: int, done: int) -> list:
        self.steps[r * PER_ROBOT:(r + 1) * PER_ROBOT] += 1
        self.stamp += 1
        self.loop.on_reward(r, np.full(PER_ROBOT, float(r), np.float32), self.stamp, 0.0)
        self.loop.on_done(r, np.full(PER_ROBOT, done, np.uint8), self.stamp, 0.0)
        decisions = self.loop.on_observation(r, self.obs(r), self.stamp, 0.0, 0.0)
        if not any(isinstance(d, PublishAction) for d in decisions):
            # A learning phase (no pause service here): carry it out, then act again.
            self.loop.update()
            self.loop.after_update()
            self.loop.resume(0.0, 0.0)
        return decisions


def test_a_fleet_feeds_one_replay_and_done_codes_keep_their_meaning():
    fleet = SACFleet()
    for r in range(len(ROBOTS)):
        fleet.start(r)
    # Robot c steps three times as often; a fails every 5th step, c times out every 7th.
    for tick in range(1, 31):
        fleet.step(2, DoneCode.TRUNCATED if tick % 7 == 0 else DoneCode.RUNNING)
        if tick % 3 == 0:
            fleet.step(0, DoneCode.TERMINATED if (tick // 3) % 5 == 0 else DoneCode.RUNNING)
            fleet.step(1, DoneCode.RUNNING)
    agent, replay = fleet.agent, fleet.agent.replay
    assert fleet.agent.iteration >= 1
    assert replay.size == 2 * (30 + 10 + 10) and fleet.agent.replay.sampleable > 0
    rows = np.flatnonzero(replay.ready[:replay.size])
    obs, next_obs = replay.obs[rows], replay.next_obs[rows]
    # Each transition is one env's own: same env id, and its next step (or, where the
    # episode ended, the state it started in).
    np.testing.assert_array_equal(obs[:, 0], next_obs[:, 0])
    env = obs[:, 0].astype(int)
    robot = env // PER_ROBOT
    np.testing.assert_array_equal(replay.rewards[rows], robot)
    ended = next_obs[:, 1] == obs[:, 1]
    assert np.all(next_obs[~ended, 1] == obs[~ended, 1] + 1)
    terminal = replay.terminal[rows] == 1.0
    # Failures: robot a's every 5th step, never bootstrapped; c's time-outs bootstrap.
    assert terminal.sum() == 2 * 2 and set(robot[terminal]) == {0}
    assert np.all(obs[terminal, 1] % 5 == 4)
    timeouts = ended & (robot == 2)
    assert timeouts.sum() == 2 * 4 and not terminal[robot == 2].any()
    assert_replay_finite(agent)
