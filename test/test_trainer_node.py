"""TrainerNode with real rclpy, stepped by hand: the synchroniser, the watchdog, the
services and the update's drain (trainer_harness.FakeEnv; conftest's ``make_env``).

These test the wiring (messages, clocks, timers, files); the decisions themselves are
tested without ROS in test_training_loop.py. Parameters and pause services:
test_trainer_controls.py; ``main()`` as a subprocess: test_trainer_main.py.
"""

import time
from pathlib import Path

import numpy as np
import pytest
from builtin_interfaces.msg import Time
from rosgraph_msgs.msg import Clock
from std_msgs.msg import Float32MultiArray, Float64MultiArray, UInt8MultiArray
from std_srvs.srv import Trigger
from trainer_harness import ACTION_DIM, NUM_ENVS, NUM_STEPS, OBS_DIM, PARTS, is_safe

from unilab_ros.rl.checkpoint import Checkpoint
from unilab_ros.ros.messages import to_float32_msg

pytestmark = pytest.mark.ros


# Stepping and the synchroniser.


def test_every_message_order_stores_the_right_steps_and_updates(make_env, tmp_path):
    env = make_env()
    first_obs = env.new_obs()
    sent_actions = [env.start(first_obs)]
    observations, rewards = [first_obs], []
    orders = [PARTS, ("obs", "done", "reward"), ("done", "obs", "reward")]
    for t, order in enumerate(orders):
        reward, next_obs = env.rng.normal(size=NUM_ENVS), env.new_obs()
        action = env.step(reward=reward, next_obs=next_obs, order=order)
        assert not is_safe(action)
        assert env.trainer.loop.stored_steps == t + 1
        sent_actions.append(action)
        observations.append(next_obs)
        rewards.append(reward)
    buffer = env.trainer.agent.buffer
    for t in range(len(orders)):
        # Each stored step pairs the observation acted on, that action and its reward.
        np.testing.assert_array_equal(buffer.observations[t], observations[t])
        np.testing.assert_allclose(
            np.clip(buffer.actions[t], -1.0, 1.0), sent_actions[t], rtol=1e-6
        )
        np.testing.assert_allclose(buffer.rewards[t], rewards[t], rtol=1e-6)
    assert env.trainer.agent.iteration == 0

    # The fourth step fills the rollout: safe action, update, then a fresh action.
    count = len(env.action_msgs)
    env.step(order=("reward", "obs", "done"), expected_actions=2)
    assert env.trainer.agent.iteration == 1
    assert is_safe(env.actions[count]) and not is_safe(env.actions[count + 1])
    assert env.trainer.loop.stored_steps == 0
    assert env.trainer.loop.step_counters["steps_completed"] == NUM_STEPS
    assert env.trainer.loop.step_counters["steps_dropped"] == 0
    assert env.trainer.last_metrics["env_steps"] == NUM_STEPS * NUM_ENVS
    metrics_csv = (tmp_path / "checkpoints" / "metrics.csv").read_text().splitlines()
    assert len(metrics_csv) == 2, "a header and one row per iteration"
    # Collection goes on into the next rollout.
    env.step()
    assert env.trainer.loop.stored_steps == 1


def test_a_missing_reward_drops_the_step_after_step_timeout(make_env):
    env = make_env(step_timeout=0.3)
    env.start()
    env.step()
    assert env.trainer.loop.stored_steps == 1
    count = len(env.action_msgs)
    env.publish("done", np.zeros(NUM_ENVS, np.uint8))
    next_obs = env.new_obs()
    env.publish("obs", next_obs)
    assert env.spin_until(lambda: env.trainer.loop.step_counters["steps_dropped"] == 1, 3.0)
    assert env.trainer.loop.stored_steps == 1, "the incomplete step is not stored"
    # The segment is cut: the last stored step is bootstrapped as a time-out.
    assert env.trainer.agent.buffer.dones[0].tolist() == [2, 2]
    # The environment waits for an action at next_obs: the trainer acts on it.
    assert env.spin_until(lambda: len(env.action_msgs) > count, timeout=2.0)
    env.step()
    assert env.trainer.loop.stored_steps == 2
    np.testing.assert_array_equal(env.trainer.agent.buffer.observations[1], next_obs)


def test_under_sim_time_a_paused_clock_drops_no_step(make_env):
    env = make_env(step_timeout=0.3, obs_timeout=30.0, use_sim_time=True)
    clock_pub = env.node.create_publisher(Clock, "/clock", 10)

    def publish_clock(seconds: float) -> None:
        clock_pub.publish(Clock(clock=Time(sec=int(seconds), nanosec=0)))

    assert env.spin_until(lambda: clock_pub.get_subscription_count() > 0)
    publish_clock(100.0)
    assert env.spin_until(lambda: env.trainer.get_clock().now().nanoseconds > 0)
    env.start()
    env.publish("done", np.zeros(NUM_ENVS, np.uint8))
    # Wall time passes well beyond step_timeout while the simulator is paused.
    env.spin_for(1.0)
    assert env.trainer.loop.step_counters["steps_dropped"] == 0
    publish_clock(101.0)
    assert env.spin_until(lambda: env.trainer.loop.step_counters["steps_dropped"] == 1, 3.0)


@pytest.mark.parametrize(
    "bad",
    [
        Float32MultiArray(data=[0.0] * (NUM_ENVS * OBS_DIM - 1)),
        Float32MultiArray(data=[0.0] * (NUM_ENVS * OBS_DIM - 1) + [float("nan")]),
        Float32MultiArray(data=[float("inf")] + [0.0] * (NUM_ENVS * OBS_DIM - 1)),
        Float32MultiArray(data=[1e38] + [0.0] * (NUM_ENVS * OBS_DIM - 1)),
    ],
    ids=["wrong_length", "nan", "inf", "huge_finite"],
)
def test_bad_observations_are_rejected_without_action_or_storage(make_env, bad):
    env = make_env()
    # Before collection started: nothing to act on.
    env.obs_pub.publish(bad)
    assert env.spin_until(lambda: env.trainer.counters["rejected_observations"] == 1)
    env.spin_for(0.1)
    assert env.action_msgs == []
    env.start()
    # With an action outstanding: a bad observation must not complete the step.
    env.publish("reward", np.ones(NUM_ENVS))
    env.publish("done", np.zeros(NUM_ENVS))
    env.obs_pub.publish(bad)
    assert env.spin_until(lambda: env.trainer.counters["rejected_observations"] == 2)
    env.spin_for(0.1)
    assert len(env.action_msgs) == 1
    assert env.trainer.loop.stored_steps == 0
    assert env.trainer.loop.step_counters["steps_completed"] == 0
    env.publish("obs", env.new_obs())
    assert env.spin_until(lambda: len(env.action_msgs) == 2)
    assert env.trainer.loop.stored_steps == 1


def test_bad_rewards_and_done_codes_are_rejected(make_env):
    env = make_env()
    env.start()
    env.reward_pub.publish(Float32MultiArray(data=[float("nan"), 0.0]))
    env.done_pub.publish(UInt8MultiArray(data=[0, 7]))
    assert env.spin_until(
        lambda: env.trainer.counters["rejected_rewards"] == 1
        and env.trainer.counters["rejected_dones"] == 1
    )
    env.step()
    assert env.trainer.loop.stored_steps == 1
    assert np.isfinite(env.trainer.agent.buffer.rewards[0]).all()
    # A finite but huge reward is bad input too (reward_limit), not a return of 9e38.
    env.reward_pub.publish(Float32MultiArray(data=[1e38, 0.0]))
    assert env.spin_until(lambda: env.trainer.counters["rejected_rewards"] == 2)


def test_a_huge_observation_cannot_poison_the_trainer(make_env):
    env = make_env()
    env.start()
    for _ in range(NUM_STEPS):
        env.obs_pub.publish(to_float32_msg(np.full((NUM_ENVS, OBS_DIM), 1e20, np.float32)))
        env.step()
    assert env.spin_until(lambda: env.trainer.counters["rejected_observations"] == NUM_STEPS)
    assert env.trainer.agent.iteration == 1
    normalizer = env.trainer.agent.model.normalizer
    mean = np.array(normalizer.mean)
    assert np.isfinite(mean).all() and np.abs(mean).max() < 10
    assert all(np.isfinite(action).all() for action in env.actions)


@pytest.mark.parametrize("use_sim_time", [False, True])
def test_the_watchdog_sends_the_safe_action_after_obs_timeout(make_env, use_sim_time):
    # Under sim time with no /clock the node clock stands still: the watchdog must not.
    env = make_env(obs_timeout=0.3, use_sim_time=use_sim_time)
    env.start()
    started = time.monotonic()
    assert env.spin_until(lambda: env.trainer.counters["watchdog_trips"] == 1, timeout=3.0)
    assert time.monotonic() - started >= 0.25
    assert env.spin_until(lambda: len(env.action_msgs) >= 3, timeout=2.0), (
        "the safe action repeats while the silence lasts"
    )
    assert all(is_safe(action) for action in env.actions[1:])
    assert env.trainer.counters["watchdog_trips"] == 1, "one trip per silence"
    assert env.trainer.loop.step_counters["steps_dropped"] == 1
    # The next observation starts a new segment.
    count = len(env.action_msgs)
    env.publish("obs", env.new_obs())
    assert env.spin_until(lambda: len(env.action_msgs) > count)
    assert not is_safe(env.actions[count])
    assert env.trainer.status()["state"] == "collecting"


# Services.


def test_save_checkpoint_service_writes_a_loadable_checkpoint(make_env):
    env = make_env()
    env.start()
    for _ in range(NUM_STEPS):
        env.step(expected_actions=1)
    assert env.spin_until(lambda: env.trainer.agent.iteration == 1)
    response = env.call(Trigger, "save_checkpoint", Trigger.Request())
    assert response.success, response.message
    checkpoint = Checkpoint(response.message)
    assert checkpoint.kind == "training"
    assert checkpoint.iteration == 1
    assert checkpoint.agent_cfg.num_envs == NUM_ENVS
    assert checkpoint.model_cfg.actor_hidden_dims == [8]
    assert checkpoint.extra["reason"] == "service call"
    assert (Path(response.message).parent / "latest.safetensors").is_file()


def test_float64_actions(make_env):
    env = make_env(action_msg_type="float64")
    action = env.start()
    assert isinstance(env.action_msgs[0], Float64MultiArray)
    assert action.shape == (NUM_ENVS, ACTION_DIM) and np.all(np.abs(action) <= 1.0)
    env.step()
    assert env.trainer.loop.stored_steps == 1


# Updates.


def test_messages_queued_during_the_update_are_discarded(make_env):
    env = make_env()
    env.start()
    for _ in range(NUM_STEPS - 1):
        env.step()
    # The last step's parts and a whole further step are all queued before the executor
    # runs: the update starts inside the callback that completes the rollout, while the
    # further step still waits in the subscriptions' queues.
    late_obs = env.new_obs()
    for part, value in (
        ("reward", np.zeros(NUM_ENVS)),
        ("done", np.zeros(NUM_ENVS)),
        ("obs", env.new_obs()),
        ("obs", late_obs),
        ("reward", np.ones(NUM_ENVS)),
        ("done", np.zeros(NUM_ENVS)),
    ):
        env.publish(part, value)
    time.sleep(0.3)
    count = len(env.action_msgs)
    assert env.spin_until(lambda: env.trainer.agent.iteration == 1)
    assert env.spin_until(lambda: len(env.action_msgs) >= count + 2)
    assert env.trainer.counters["discarded_during_update"] == 3
    assert is_safe(env.actions[count]) and not is_safe(env.actions[count + 1])
    # Collection restarted on the newest observation, with a fresh action.
    env.step()
    np.testing.assert_array_equal(env.trainer.agent.buffer.observations[0], late_obs)
    assert env.trainer.loop.stored_steps == 1
    assert env.trainer.loop.step_counters["duplicate_messages"] == 0


def test_episode_end_trigger_waits_for_every_env_to_end(make_env):
    env = make_env(update_trigger="episode_end")
    env.start()
    for _ in range(NUM_STEPS):
        env.step()
    assert env.trainer.status()["state"] == "waiting_for_episode_end"
    assert env.trainer.agent.iteration == 0 and env.trainer.loop.stored_steps == NUM_STEPS
    # Acting goes on without storing; env 1 ending alone is not enough.
    env.step(done=np.array([0, 1]))
    env.step(done=np.array([0, 0]))
    assert env.trainer.agent.iteration == 0
    count = len(env.action_msgs)
    env.step(done=np.array([2, 0]), expected_actions=2)
    assert env.trainer.agent.iteration == 1
    assert is_safe(env.actions[count]) and not is_safe(env.actions[count + 1])
    assert env.trainer.status()["state"] == "collecting"


def test_max_iterations_finishes_and_saves(make_env, tmp_path):
    env = make_env(max_iterations=1)
    env.start()
    for _ in range(NUM_STEPS - 1):
        env.step()
    env.step(expected_actions=1)
    assert env.spin_until(lambda: env.trainer.finished)
    assert Checkpoint(tmp_path / "checkpoints" / "latest.safetensors").iteration == 1
    count = len(env.action_msgs)
    env.publish("obs", env.new_obs())
    env.spin_for(0.2)
    assert len(env.action_msgs) == count, "a finished trainer no longer acts"


def test_resume_from_continues_the_iteration_count(make_env, tmp_path):
    env = make_env()
    env.start()
    for _ in range(NUM_STEPS):
        env.step(expected_actions=1)
    assert env.spin_until(lambda: env.trainer.agent.iteration == 1)
    path = env.trainer.save("test")
    env_steps = env.trainer.agent.env_steps
    env.close()

    resumed = make_env(resume_from=str(path), checkpoint_dir=str(tmp_path / "resumed"))
    assert resumed.trainer.agent.iteration == 1
    assert resumed.trainer.agent.env_steps == env_steps
    resumed.start()
    for _ in range(NUM_STEPS):
        resumed.step(expected_actions=1)
    assert resumed.spin_until(lambda: resumed.trainer.agent.iteration == 2)
    assert resumed.trainer.agent.env_steps == 2 * env_steps
