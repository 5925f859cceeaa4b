"""GymEnvNode with real rclpy: a peer node and the env node share one executor in-process.

Observations are checked against a reference Gymnasium env stepped with the same seeds and
actions, which proves the step protocol (reward / done of the ending step, then the first
observation of the next episode) rather than just the shapes.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')
os.environ.setdefault('ROS_DOMAIN_ID', str(1 + os.getpid() % 100))

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import rclpy  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from ros_helpers import spin_until  # noqa: E402
from std_msgs.msg import (  # noqa: E402
    Float32MultiArray,
    Float64MultiArray,
    MultiArrayDimension,
    MultiArrayLayout,
    String,
    UInt8MultiArray,
)
from std_srvs.srv import Empty  # noqa: E402

from unilab_ros.ros.messages import (  # noqa: E402
    DONE_RUNNING,
    DONE_TERMINATED,
    DONE_TRUNCATED,
    read_done_codes,
    read_matrix,
    read_vector,
    to_float32_msg,
    to_float64_msg,
)
from unilab_ros.sims.gym_env_node import GymEnvConfigError, GymEnvNode  # noqa: E402

pytestmark = pytest.mark.ros

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 3.0


class Harness:
    """The env node plus a peer that plays the trainer, spun by one executor."""

    def __init__(self, context: rclpy.Context, **params) -> None:
        # The constructor's first publication may precede discovery of the peer.
        params.setdefault('republish_period', 0.1)
        self.env = GymEnvNode(context=context, parameter_overrides=[
            Parameter(name, value=value) for name, value in params.items()])
        self.peer = rclpy.create_node('gym_env_test_peer', context=context)
        self.received: dict[str, list] = {'observation': [], 'reward': [], 'done': [],
                                          'status': []}
        for topic, msg_type in (('observation', Float32MultiArray),
                                ('reward', Float32MultiArray), ('done', UInt8MultiArray)):
            self.peer.create_subscription(msg_type, topic, self.received[topic].append, 100)
        self.peer.create_subscription(String, 'gym_env/status', self.received['status'].append,
                                      10)
        action_type = Float64MultiArray if params.get('action_msg_type') == 'float64' \
            else Float32MultiArray
        self.action_pub = self.peer.create_publisher(action_type, 'action', 10)
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.env)
        self.executor.add_node(self.peer)
        assert self.spin_until(lambda: self.action_pub.get_subscription_count() > 0
                               and self.received['observation']), 'no first observation'

    def spin_until(self, predicate, timeout: float = WAIT_S) -> bool:
        return spin_until(self.executor, predicate, timeout)

    def spin_for(self, seconds: float) -> None:
        self.spin_until(lambda: False, timeout=seconds)

    def send(self, msg) -> None:
        self.action_pub.publish(msg)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Send actions and return (reward, done, next observation) as the peer got them."""
        steps = self.env.status.steps
        rewards, dones = len(self.received['reward']), len(self.received['done'])
        observations = len(self.received['observation'])
        first_step = self.env.waiting_for_first_action
        make = to_float64_msg if self.action_pub.msg_type is Float64MultiArray \
            else to_float32_msg
        self.send(make(actions, ('env', 'action')))
        assert self.spin_until(lambda: self.env.status.steps == steps + 1
                               and len(self.received['reward']) == rewards + 1
                               and len(self.received['done']) == dones + 1), 'no step reply'
        if first_step:
            # Re-published first observations may still be in flight when the step's reply
            # is in; they arrive before the step's observation, the first that differs
            # from the initial state (a random start moves in one step).
            first = self.received['observation'][0].data
            assert self.spin_until(
                lambda: len(self.received['observation']) > observations
                and self.received['observation'][-1].data != first), 'no step observation'
        else:
            # On a busy machine the bridge may re-publish the state it waited at before
            # the action arrived: the step's observation is the one it published last.
            assert self.spin_until(
                lambda: len(self.received['observation']) > observations
                and self.received['observation'][-1].data
                == self.env._latest_observation.data), 'no step observation'
        num_envs, obs_dim = self.observation_shape
        return (read_vector(self.received['reward'][-1], num_envs),
                read_done_codes(self.received['done'][-1], num_envs),
                read_matrix(self.received['observation'][-1], num_envs, obs_dim))

    def call(self, service: str) -> None:
        """Call the env node's ~/pause or ~/resume and wait for the answer."""
        client = self.peer.create_client(Empty, f'gym_env/{service}')
        try:
            assert self.spin_until(client.service_is_ready), f'no service {service}'
            future = client.call_async(Empty.Request())
            assert self.spin_until(future.done), f'{service} did not answer'
        finally:
            self.peer.destroy_client(client)

    def published(self) -> dict[str, int]:
        return {topic: len(self.received[topic]) for topic in ('observation', 'reward', 'done')}

    @property
    def observation_shape(self) -> tuple[int, int]:
        return tuple(dim.size for dim in self.received['observation'][0].layout.dim)

    def first_observation(self) -> np.ndarray:
        return read_matrix(self.received['observation'][0], *self.observation_shape)

    def close(self) -> None:
        self.executor.shutdown()
        self.env.destroy_node()
        self.peer.destroy_node()


@pytest.fixture
def harness_factory(context):
    harnesses = []

    def make(**params) -> Harness:
        harnesses.append(Harness(context, **params))
        return harnesses[-1]
    yield make
    for harness in harnesses:
        harness.close()


def _reference_envs(env_id: str, num_envs: int, seed: int, **make_kwargs):
    envs = [gym.make(env_id, **make_kwargs) for _ in range(num_envs)]
    first = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    return envs, first.astype(np.float32)


def test_the_latest_observation_is_republished_while_no_action_comes(harness_factory):
    harness = harness_factory(num_envs=2, seed=3, republish_period=0.05)
    assert harness.spin_until(lambda: len(harness.received['observation']) >= 4)
    assert harness.env.waiting_for_first_action
    first = harness.first_observation()
    for msg in harness.received['observation']:
        np.testing.assert_array_equal(read_matrix(msg, 2, 3), first)
    _, reference_first = _reference_envs('Pendulum-v1', 2, seed=3)
    np.testing.assert_allclose(first, reference_first, rtol=1e-6)

    # A trainer restarted mid-run gets the state the environment waits in, not the first.
    _, _, stepped = harness.step(np.zeros((2, 1)))
    assert not harness.env.waiting_for_first_action
    received = len(harness.received['observation'])
    republished = harness.env.status.observation_republishes
    assert harness.spin_until(lambda: len(harness.received['observation']) >= received + 2)
    assert harness.env.status.observation_republishes >= republished + 2
    for msg in harness.received['observation'][received:]:
        np.testing.assert_array_equal(read_matrix(msg, 2, 3), stepped)


def test_nothing_is_republished_while_actions_keep_coming(harness_factory):
    period = 0.2
    harness = harness_factory(num_envs=2, seed=3, republish_period=period)
    harness.step(np.zeros((2, 1)))
    republished = harness.env.status.observation_republishes
    # A loaded machine may stall a step past the period; only such a gap may re-publish.
    stalls = 0
    last = time.monotonic()
    deadline = last + 3 * period
    while last < deadline:
        harness.step(np.zeros((2, 1)))
        now = time.monotonic()
        stalls += now - last > period
        last = now
    assert harness.env.status.observation_republishes - republished <= stalls


def test_an_action_steps_every_env_and_publishes_reward_done_observation(harness_factory):
    harness = harness_factory(num_envs=3, seed=5)
    reference, _ = _reference_envs('Pendulum-v1', 3, seed=5)
    actions = np.array([[-1.0], [0.0], [1.5]], dtype=np.float32)
    reward, done, observation = harness.step(actions)
    assert reward.shape == (3,) and done.shape == (3,) and observation.shape == (3, 3)
    assert [d.label for d in harness.received['observation'][-1].layout.dim] == ['env', 'obs']
    np.testing.assert_array_equal(done, [DONE_RUNNING] * 3)
    for i, env in enumerate(reference):
        expected_obs, expected_reward, *_ = env.step(actions[i])
        np.testing.assert_allclose(observation[i], expected_obs, rtol=1e-5)
        assert reward[i] == pytest.approx(expected_reward, rel=1e-5)
    assert harness.env.status.steps == 1


def test_truncation_gives_code_2_and_the_first_observation_of_the_next_episode(
        harness_factory):
    harness = harness_factory(num_envs=2, seed=7, max_episode_steps=3)
    reference, _ = _reference_envs('Pendulum-v1', 2, seed=7, max_episode_steps=3)
    action = np.array([0.5], dtype=np.float32)
    for step in range(3):
        reward, done, observation = harness.step(np.tile(action, (2, 1)))
        expected_reward = [env.step(action)[1] for env in reference]
        np.testing.assert_allclose(reward, expected_reward, rtol=1e-5)
        np.testing.assert_array_equal(done, [DONE_TRUNCATED if step == 2 else DONE_RUNNING] * 2)
    next_episode = np.stack([env.reset()[0] for env in reference])
    np.testing.assert_allclose(observation, next_episode, rtol=1e-6)
    assert harness.env.status.episodes == 2


def test_termination_gives_code_1_with_the_ending_reward(harness_factory):
    harness = harness_factory(env_id='MountainCarContinuous-v0', seed=0)
    [reference], _ = _reference_envs('MountainCarContinuous-v0', 1, seed=0)
    observation = harness.first_observation()
    deadline = time.monotonic() + 10.0
    done = np.array([DONE_RUNNING])
    # Pushing along the velocity pumps energy: the car reaches the goal in ~100 steps.
    while done[0] == DONE_RUNNING and time.monotonic() < deadline:
        action = np.array([[1.0 if observation[0, 1] >= 0 else -1.0]], dtype=np.float32)
        reward, done, observation = harness.step(action)
        reference.step(action[0])
    assert done[0] == DONE_TERMINATED
    assert reward[0] > 90.0, 'the goal bonus belongs to the ending step'
    np.testing.assert_allclose(observation[0], reference.reset()[0], rtol=1e-6)
    assert harness.env.status.episodes == 1


def test_actions_are_clipped_to_the_action_space(harness_factory):
    harness = harness_factory(seed=11)
    reference, _ = _reference_envs('Pendulum-v1', 1, seed=11)
    _, _, observation = harness.step(np.array([[100.0]]))
    expected, *_ = reference[0].step(np.array([2.0], dtype=np.float32))
    np.testing.assert_allclose(observation[0], expected, rtol=1e-5)


def _bad_actions():
    nan = Float32MultiArray(data=[0.0, float('nan')])
    inf = Float32MultiArray(data=[float('inf'), 0.0])
    short = Float32MultiArray(data=[0.0])
    wrong_layout = Float32MultiArray(
        layout=MultiArrayLayout(dim=[MultiArrayDimension(label='env', size=1, stride=2),
                                     MultiArrayDimension(label='action', size=2, stride=2)]),
        data=[0.0, 0.0])
    return [nan, inf, short, wrong_layout]


def test_malformed_actions_are_rejected_and_counted_without_stepping(harness_factory):
    harness = harness_factory(num_envs=2)
    bad_actions = _bad_actions()
    for count, msg in enumerate(bad_actions, start=1):
        harness.send(msg)
        assert harness.spin_until(lambda c=count: harness.env.status.rejected_actions == c)
    harness.spin_for(0.1)
    assert harness.env.status.steps == 0
    assert harness.received['reward'] == [] and harness.received['done'] == []
    assert harness.env.waiting_for_first_action
    reward, _, _ = harness.step(np.zeros((2, 1)))
    assert reward.shape == (2,)
    assert harness.env.status.rejected_actions == len(bad_actions)


def test_float64_actions(harness_factory):
    harness = harness_factory(num_envs=2, action_msg_type='float64')
    reward, done, observation = harness.step(np.array([[0.25], [-0.25]]))
    assert reward.shape == (2,) and observation.shape == (2, 3)
    np.testing.assert_array_equal(done, [DONE_RUNNING] * 2)
    harness.send(Float64MultiArray(data=[0.0, float('nan')]))
    assert harness.spin_until(lambda: harness.env.status.rejected_actions == 1)


def test_status_reports_the_counters(harness_factory):
    harness = harness_factory(max_episode_steps=1, log_period=0.1)
    harness.step(np.zeros((1, 1)))
    assert harness.spin_until(lambda: any(json.loads(msg.data)['episodes'] == 1
                                          for msg in harness.received['status']))
    status = json.loads(harness.received['status'][-1].data)
    assert status['steps'] == 1 and status['rejected_actions'] == 0
    assert status['actions_while_paused'] == 0 and status['paused'] is False
    assert status['mean_return'] == pytest.approx(harness.env.status.mean_return)


def test_paused_actions_are_counted_and_dropped_and_resume_steps_on(harness_factory):
    # A re-publication landing inside harness.step would pass for the step's observation.
    harness = harness_factory(num_envs=2, seed=1, republish_period=0.5)
    reference, _ = _reference_envs('Pendulum-v1', 2, seed=1)
    action = np.array([[0.5], [-0.5]], dtype=np.float32)
    harness.step(action)
    for i, env in enumerate(reference):
        env.step(action[i])

    harness.call('pause')
    assert harness.env.paused
    published = harness.published()
    for count in (1, 2, 3):
        harness.send(to_float32_msg(np.full((2, 1), 2.0), ('env', 'action')))
        assert harness.spin_until(
            lambda c=count: harness.env.status.actions_while_paused == c)
    harness.call('resume')
    assert not harness.env.paused
    harness.spin_for(0.2)
    assert harness.env.status.steps == 1, 'a paused env is not stepped'
    # Neither pause nor resume steps or publishes a step; only a quiet period after the
    # resume re-publishes the state the env waits in.
    now = harness.published()
    assert (now['reward'], now['done']) == (published['reward'], published['done'])
    latest = read_matrix(harness.received['observation'][published['observation'] - 1], 2, 3)
    for msg in harness.received['observation'][published['observation']:]:
        np.testing.assert_array_equal(read_matrix(msg, 2, 3), latest)

    # The next action steps from the state published last: the dropped ones left no trace.
    _, _, observation = harness.step(action)
    expected = np.stack([env.step(action[i])[0] for i, env in enumerate(reference)])
    np.testing.assert_allclose(observation, expected, rtol=1e-5)
    assert harness.env.status.steps == 2
    assert harness.env.status.actions_while_paused == 3
    assert harness.env.status.rejected_actions == 0


def test_an_env_paused_more_often_than_its_republish_period_still_republishes(
        harness_factory):
    # A fleet's trainer pauses every bridge around each update, here every 0.15 s. A bridge
    # it does not act on (its first state was lost) must still re-publish, or it never
    # joins: the running time between pauses adds up to the period, the paused time not.
    harness = harness_factory(num_envs=2, seed=1, republish_period=0.3)
    harness.step(np.zeros((2, 1)))
    republished = harness.env.status.observation_republishes
    for _ in range(10):
        harness.spin_for(0.1)
        harness.call('pause')
        harness.spin_for(0.05)
        harness.call('resume')
    # 10 x 0.1 s of running time: 3 periods.
    assert harness.env.status.observation_republishes >= republished + 2
    assert harness.env.status.steps == 1


def test_paused_before_the_first_action_the_first_observation_is_not_republished(
        harness_factory):
    harness = harness_factory(republish_period=0.05)
    harness.call('pause')
    publishes = harness.env.status.observation_republishes
    harness.spin_for(0.3)
    assert harness.env.status.observation_republishes == publishes
    harness.call('resume')
    assert harness.spin_until(
        lambda: harness.env.status.observation_republishes > publishes)


def test_mujoco_env_is_served(harness_factory):
    try:
        gym.make('InvertedPendulum-v5').close()
    except Exception as error:  # noqa: BLE001 - any missing MuJoCo dependency skips
        pytest.skip(f'InvertedPendulum-v5 unavailable here: {error}')
    harness = harness_factory(env_id='InvertedPendulum-v5', num_envs=2)
    reward, done, observation = harness.step(np.zeros((2, 1)))
    assert reward.shape == (2,) and done.shape == (2,) and observation.shape == (2, 4)


def test_unsupported_space_raises_in_the_constructor(context):
    with pytest.raises(GymEnvConfigError, match='Discrete action space'):
        GymEnvNode(context=context,
                   parameter_overrides=[Parameter('env_id', value='CartPole-v1')])


def test_main_exits_non_zero_with_a_one_line_reason():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(PACKAGE_ROOT), os.environ.get('PYTHONPATH')])))
    result = subprocess.run(
        [sys.executable, '-m', 'unilab_ros.sims.gym_env_node', '--ros-args',
         '-p', 'env_id:=CartPole-v1'],
        capture_output=True, text=True, timeout=30, env=env, cwd=PACKAGE_ROOT)
    assert result.returncode == 2
    output = (result.stdout + result.stderr).strip().splitlines()
    assert 'Traceback' not in result.stderr
    assert len(output) == 1 and 'Discrete action space' in output[0], output


def test_a_pause_with_no_resume_ends_after_max_pause(harness_factory):
    # The trainer that paused it was killed in its update: the env must not wait forever.
    harness = harness_factory(num_envs=2, seed=1, republish_period=1.0, max_pause=0.4)
    harness.step(np.zeros((2, 1)))
    received = len(harness.received['observation'])
    harness.call('pause')
    assert harness.env.paused
    harness.spin_for(0.2)
    assert harness.env.paused, 'resumed before max_pause'
    assert harness.spin_until(lambda: not harness.env.paused, timeout=3.0)
    assert harness.env.status.pause_timeouts == 1
    # The waiting state goes out at once (a re-publication would wait 1 s after the
    # resume), and actions step again.
    assert harness.spin_until(lambda: len(harness.received['observation']) > received,
                              timeout=0.5)
    harness.step(np.zeros((2, 1)))
    assert harness.env.status.steps == 2


def test_the_status_reports_the_observation_to_action_latency_of_answered_steps(
        harness_factory):
    # Re-published only after 2 s of quiet: never within the peer's thinking time here.
    harness = harness_factory(republish_period=2.0)
    assert harness.env.status.latency_p50_ms is None
    harness.step(np.zeros((1, 1)))
    # The first action answers the initial observation: no sample yet.
    assert harness.env.status.latency_p50_ms is None
    for _ in range(3):
        harness.spin_for(0.05)  # the peer "thinks" 50 ms before it answers
        harness.step(np.zeros((1, 1)))
    status = harness.env.status
    assert 45.0 <= status.latency_p50_ms <= status.latency_p99_ms < 1000.0
    # An answer held by a pause (an update) is no sample of the acting path.
    harness.call('pause')
    harness.spin_for(0.5)
    harness.call('resume')
    harness.step(np.zeros((1, 1)))
    assert harness.env.status.latency_p99_ms < 450.0


def test_the_latency_is_logged_while_no_episode_ends(harness_factory, monkeypatch):
    """A 1,000-step episode ends rarely: the log line still gives the latency."""
    harness = harness_factory(republish_period=2.0)
    lines: list[str] = []
    monkeypatch.setattr(harness.env, 'get_logger',
                        lambda: type('Logger', (), {'info': staticmethod(lines.append)})())
    harness.env._report()
    assert lines == []  # nothing answered yet: nothing to say
    for _ in range(3):
        harness.spin_for(0.02)
        harness.step(np.zeros((1, 1)))
    assert harness.env.status.episodes == 0
    harness.env._report()
    harness.env._report()  # no new step since: no second line
    assert len(lines) == 1 and lines[0].startswith('3 steps, no episode ended; ')
    assert 'ms p50' in lines[0] and 'ms p99' in lines[0]
