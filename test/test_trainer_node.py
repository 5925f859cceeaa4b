"""TrainerNode with real rclpy: the test plays the environment, by hand, in the same executor.

These test the wiring (messages, clocks, timers, the update's pause and drain, services,
parameters, files); the decisions themselves are tested without ROS in
test_training_loop.py.

Each test builds the trainer with parameter_overrides in a private Context, next to a
fake environment node whose publishers the test drives one message at a time. Sizes are
tiny (2 envs x obs 3 -> action 1, 4-step rollouts) so an update takes milliseconds.
The subprocess tests load the shipped YAML files and check the exit codes of `main()`.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import rcl_interfaces.msg
import rclpy
from builtin_interfaces.msg import Time
from rcl_interfaces.srv import DescribeParameters, GetParameters, SetParameters
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from ros_helpers import spin_until
from rosgraph_msgs.msg import Clock
from std_msgs.msg import Bool, Float32MultiArray, Float64MultiArray, String, UInt8MultiArray
from std_srvs.srv import Empty, SetBool, Trigger

from unilab_ros.messages import read_matrix, to_float32_msg, to_uint8_msg
from unilab_ros.params import unknown_parameters
from unilab_ros.rl import heap
from unilab_ros.rl.bundle import read_policy
from unilab_ros.rl.checkpoint import Checkpoint
from unilab_ros.rl.policy import PolicySampler
from unilab_ros.rl.ppo_runtime import PPORuntimeConfig
from unilab_ros.trainer.node import TrainerNode

pytestmark = pytest.mark.ros

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
NUM_ENVS, OBS_DIM, ACTION_DIM, NUM_STEPS = 2, 3, 1, 4
SAFE = 0.25
"""The safe action: distinct from 0 so the test can tell it from a policy action."""
WAIT_S = 5.0
PARTS = ("reward", "done", "obs")


def small_params(**overrides) -> dict:
    params = {
        "num_envs": NUM_ENVS,
        "obs_dim": OBS_DIM,
        "action_dim": ACTION_DIM,
        "num_steps": NUM_STEPS,
        "safe_action": [SAFE],
        "tensorboard": False,
        # Long timeouts by default: only the tests about them shorten them.
        "step_timeout": 10.0,
        "obs_timeout": 10.0,
        "model.actor_hidden_dims": [8],
        "model.critic_hidden_dims": [8],
        "ppo.num_mini_batches": 1,
        "ppo.num_learning_epochs": 2,
    }
    params.update(overrides)
    return params


class FakeEnv:
    """A trainer plus a hand-driven environment node, spun by one executor."""

    def __init__(self, context: rclpy.Context, **overrides) -> None:
        params = small_params(**overrides)
        self.trainer = TrainerNode(
            context=context,
            parameter_overrides=[Parameter(name, value=value) for name, value in params.items()],
        )
        self.node = rclpy.create_node("fake_env", context=context)
        self.obs_pub = self.node.create_publisher(Float32MultiArray, "observation", 100)
        self.reward_pub = self.node.create_publisher(Float32MultiArray, "reward", 100)
        self.done_pub = self.node.create_publisher(UInt8MultiArray, "done", 100)
        action_type = (
            Float64MultiArray if params.get("action_msg_type") == "float64" else Float32MultiArray
        )
        self.action_msgs: list = []
        self.action_sub = self.node.create_subscription(
            action_type, "action", self.action_msgs.append, 100
        )
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.trainer)
        self.executor.add_node(self.node)
        self.rng = np.random.default_rng(0)
        self.closed = False
        assert self.spin_until(
            lambda: all(
                pub.get_subscription_count() > 0
                for pub in (self.obs_pub, self.reward_pub, self.done_pub)
            )
            and self.action_sub.get_publisher_count() > 0
        ), "the trainer and the fake env did not discover each other"

    # Spinning.

    def spin_until(self, predicate, timeout: float = WAIT_S) -> bool:
        return spin_until(self.executor, predicate, timeout)

    def spin_for(self, seconds: float) -> None:
        self.spin_until(lambda: False, timeout=seconds)

    # Messages.

    @property
    def actions(self) -> list[np.ndarray]:
        return [read_matrix(msg, NUM_ENVS, ACTION_DIM) for msg in self.action_msgs]

    def new_obs(self) -> np.ndarray:
        return self.rng.normal(size=(NUM_ENVS, OBS_DIM)).astype(np.float32)

    def publish(self, part: str, value) -> None:
        if part == "reward":
            self.reward_pub.publish(to_float32_msg(np.asarray(value, np.float32), ("env",)))
        elif part == "done":
            self.done_pub.publish(to_uint8_msg(np.asarray(value, np.uint8), ("env",)))
        else:
            self.obs_pub.publish(to_float32_msg(np.asarray(value, np.float32), ("env", "obs")))

    def part_received(self, part: str) -> bool:
        # White-box on purpose: waiting for the synchroniser to hold each part is what makes
        # the arrival order the one the test asks for (DDS would otherwise reorder topics).
        pending = self.trainer.loop.robots[0].source._pending
        field = {"reward": "reward", "done": "done", "obs": "next_obs"}[part]
        return pending is not None and getattr(pending, field) is not None

    def start(self, obs: np.ndarray | None = None) -> np.ndarray:
        """Publish the first observation; returns the action that answers it."""
        obs = self.new_obs() if obs is None else obs
        count = len(self.action_msgs)
        self.publish("obs", obs)
        assert self.spin_until(lambda: len(self.action_msgs) > count), "no first action"
        return self.actions[-1]

    def step(
        self,
        reward=None,
        done=None,
        next_obs=None,
        order=PARTS,
        expected_actions: int = 1,
    ) -> np.ndarray:
        """Publish one step's three parts in ``order``; returns the newest action."""
        values = {
            "reward": self.rng.normal(size=NUM_ENVS) if reward is None else reward,
            "done": np.zeros(NUM_ENVS, np.uint8) if done is None else done,
            "obs": self.new_obs() if next_obs is None else next_obs,
        }
        count = len(self.action_msgs)
        for part in order[:-1]:
            self.publish(part, values[part])
            assert self.spin_until(lambda p=part: self.part_received(p)), f"{part} lost"
        self.publish(order[-1], values[order[-1]])
        assert self.spin_until(lambda: len(self.action_msgs) >= count + expected_actions), (
            f"expected {expected_actions} new action(s) after the step"
        )
        return self.actions[-1]

    def call(self, srv_type, name: str, request):
        client = self.node.create_client(srv_type, f"/unilab_trainer/{name}")
        try:
            assert self.spin_until(client.service_is_ready), f"no service {name}"
            future = client.call_async(request)
            assert self.spin_until(future.done), f"{name} did not answer"
            return future.result()
        finally:
            self.node.destroy_client(client)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.executor.shutdown()
        self.trainer.close()
        self.trainer.destroy_node()
        self.node.destroy_node()


@pytest.fixture
def make_env(context, tmp_path):
    made = []

    def make(**overrides) -> FakeEnv:
        overrides.setdefault("checkpoint_dir", str(tmp_path / "checkpoints"))
        made.append(FakeEnv(context, **overrides))
        return made[-1]

    yield make
    for env in made:
        env.close()


def is_safe(action: np.ndarray) -> bool:
    return bool(np.all(action == np.float32(SAFE)))


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


# main(): YAML files and bad parameters, as subprocesses.


def _trainer_command(*ros_args: str) -> list[str]:
    return [sys.executable, "-m", "unilab_ros.trainer", "--ros-args", *ros_args]


def _subprocess_env(ros_domain_env: dict) -> dict:
    return dict(
        ros_domain_env,
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(
            filter(None, [str(PACKAGE_ROOT), ros_domain_env.get("PYTHONPATH")])
        ),
    )


@pytest.mark.parametrize(
    ("yaml_name", "sizes"),
    [
        ("pendulum.yaml", "16 envs x obs 3 -> action 1, rollout 192 steps"),
        ("trainer.yaml", "1 envs x obs 48 -> action 12, rollout 24 steps"),
    ],
)
def test_main_starts_from_the_yaml_and_exits_0_on_sigint(
    ros_domain_env, tmp_path, yaml_name, sizes
):
    command = _trainer_command(
        "--params-file",
        str(PACKAGE_ROOT / "config" / yaml_name),
        "-p",
        f"checkpoint_dir:={tmp_path}",
        "-p",
        "tensorboard:=false",
    )
    with _trainer_process(command, ros_domain_env, tmp_path) as (process, lines):
        _wait_for_lines(process, lines, "ready:", 1)
        ready = [line for line in lines if "ready:" in line]
        assert ready, "".join(lines)
        assert sizes in ready[0]
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=5.0) == 0, "".join(lines)
    assert "Traceback" not in "".join(lines)


@contextlib.contextmanager
def _trainer_process(command: list[str], ros_domain_env: dict, cwd: Path):
    """The trainer as a subprocess and the list its output lines arrive in; killed on
    the way out if still running."""
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=_subprocess_env(ros_domain_env), cwd=cwd,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
    reader.start()
    try:
        yield process, lines
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(timeout=5.0)


def _wait_for_lines(process: subprocess.Popen, lines: list[str], text: str, count: int) -> None:
    """Until ``count`` lines hold ``text``, the process exits, or 30 s pass."""
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline and process.poll() is None:
        if sum(text in line for line in lines) >= count:
            return
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("argument", "reason"),
    [
        ("num_envs:=-1", "num_envs must be >= 1"),
        ("model.activation:=foo", "activation 'foo' unknown"),
        ("ppo.learning_rate:=1", "'ppo.learning_rate' must be a float"),
        ("update_trigger:=sometimes", "update_trigger must be one of"),
        ("resume_from:=/nonexistent.safetensors", "no checkpoint at"),
        ("model.actor_hidden_dims:=[]", "has no value"),
        ("robot_spec:=walker", "robot_spec 'walker' is neither a file nor a shipped spec "
                               "(cartpole, quadruped, reacher)"),
        ("obs_dim:=7", "obs_dim is 7, but robot spec 'cartpole' makes it 4"),
    ],
)
def test_main_exits_2_with_a_one_line_reason_on_a_bad_parameter(
    ros_domain_env, tmp_path, argument, reason
):
    spec = ("-p", "robot_spec:=cartpole") if argument.startswith("obs_dim") else ()
    result = subprocess.run(
        _trainer_command("-p", argument, *spec, "-p", f"checkpoint_dir:={tmp_path}"),
        capture_output=True,
        text=True,
        timeout=60,
        env=_subprocess_env(ros_domain_env),
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    output = (result.stdout + result.stderr).strip().splitlines()
    assert "Traceback" not in result.stderr
    assert len(output) == 1 and reason in output[0], output


@pytest.mark.parametrize("service_type", ["empty", "trigger", "setbool"])
def test_the_simulator_is_paused_for_the_update_and_resumed(make_env, service_type):
    srv = {"empty": Empty, "trigger": Trigger, "setbool": SetBool}[service_type]
    env = make_env(
        pause_service="/sim/pause", resume_service="/sim/resume", pause_service_type=service_type
    )
    calls: list[tuple[str, int, object, int, bool]] = []

    def handler(name: str):
        def serve(request, response):
            # The iteration at call time tells whether the update had run yet; the safe
            # actions published, and whether an action awaits its step, tell that the safe
            # action follows the pause and the next action follows the resume.
            trainer = env.trainer
            calls.append((
                name,
                trainer.agent.iteration,
                getattr(request, "data", None),
                trainer.counters["safe_actions_published"],
                trainer.loop.robots[0].source.awaiting_step,
            ))
            if hasattr(response, "success"):
                response.success = True
            return response

        return serve

    env.node.create_service(srv, "/sim/pause", handler("pause"))
    env.node.create_service(srv, "/sim/resume", handler("resume"))
    env.start()
    for _ in range(NUM_STEPS):
        env.step(expected_actions=0)
    assert env.spin_until(lambda: len(calls) == 2 and len(env.action_msgs) >= NUM_STEPS + 2)
    data = {"setbool": (True, False)}.get(service_type, (None, None))
    assert calls == [("pause", 0, data[0], 0, False), ("resume", 1, data[1], 1, False)]
    assert env.trainer.agent.iteration == 1
    assert is_safe(env.actions[NUM_STEPS]) and not is_safe(env.actions[NUM_STEPS + 1])


def test_a_missing_pause_service_is_a_warning_not_a_stall(make_env):
    env = make_env(pause_service="/sim/absent", resume_service="/sim/absent_too")
    env.start()
    for _ in range(NUM_STEPS):
        env.step(expected_actions=0)
    assert env.spin_until(lambda: env.trainer.agent.iteration == 1)
    assert env.trainer.status()["sim_service_failures"] == 2


def test_a_silent_pause_service_times_out_and_the_update_goes_on(make_env, context):
    env = make_env(
        pause_service="/sim/pause", resume_service="/sim/resume", service_timeout=0.3
    )
    # Served by a node no executor spins: discovered, but never answering.
    silent = rclpy.create_node("silent_sim", context=context)
    try:
        for name in ("/sim/pause", "/sim/resume"):
            silent.create_service(Empty, name, lambda _request, response: response)
        assert env.spin_until(lambda: all(
            client.service_is_ready() for client in env.trainer.clients
        ))
        env.start()
        for _ in range(NUM_STEPS - 1):
            env.step()
        started = time.monotonic()
        env.step(expected_actions=2)
        # Each timeout fired once: the safe action after the pause's, the action after the
        # resume's.
        assert 0.6 <= time.monotonic() - started < WAIT_S
        assert env.trainer.agent.iteration == 1
        assert is_safe(env.actions[NUM_STEPS]) and not is_safe(env.actions[NUM_STEPS + 1])
        assert env.trainer.status()["sim_service_failures"] == 2
        env.step()
        assert env.trainer.loop.stored_steps == 1
    finally:
        silent.destroy_node()


def set_remote(env: FakeEnv, **values):
    """``ros2 param set``: through the node's SetParameters service."""
    request = SetParameters.Request(
        parameters=[Parameter(name, value=value).to_parameter_msg()
                    for name, value in values.items()])
    return env.call(SetParameters, "set_parameters", request).results


def get_remote(env: FakeEnv, name: str):
    response = env.call(GetParameters, "get_parameters", GetParameters.Request(names=[name]))
    return Parameter.from_parameter_msg(
        rcl_interfaces.msg.Parameter(name=name, value=response.values[0])).value


def test_every_parameter_has_a_value_and_a_misspelt_one_is_named(make_env):
    env = make_env()
    # `ros2 param dump` lists only parameters with a value: robots' empty list is one.
    response = env.call(GetParameters, "get_parameters", GetParameters.Request(names=[
        name for name in env.trainer._parameters]))
    unset = [name for name, value in zip(env.trainer._parameters, response.values,
                                         strict=True)
             if value.type == rcl_interfaces.msg.ParameterType.PARAMETER_NOT_SET]
    assert unset == []
    assert list(get_remote(env, "robots")) == []
    (result,) = set_remote(env, **{"ppo.learnig_rate": 1e-4})
    assert not result.successful and "ppo.learnig_rate" in result.reason


@pytest.mark.parametrize("name, value", [("num_envs", 8), ("num_envs", -1),
                                         ("ppo.clip_param", 0.1), ("action_high", [0.5])])
def test_start_up_parameters_refuse_changes_with_a_reason(make_env, name, value):
    env = make_env()
    before = get_remote(env, name)
    (result,) = set_remote(env, **{name: value})
    assert not result.successful and "read-only" in result.reason
    assert list(np.atleast_1d(get_remote(env, name))) == list(np.atleast_1d(before))
    described = env.call(DescribeParameters, "describe_parameters",
                         DescribeParameters.Request(names=[name])).descriptors[0]
    assert described.read_only and described.description.endswith("(read at start)")


def test_the_learning_rate_changes_while_running_and_bad_values_are_refused(make_env):
    env = make_env()
    (result,) = set_remote(env, **{"ppo.learning_rate": 1e-4})
    assert result.successful
    assert env.trainer.agent.trainer.learning_rate == pytest.approx(1e-4)
    # Beyond the schedule's bounds: one Adam step at 1e9 wrecks the weights for good.
    for bad in (-1.0, 0.0, 1e9, float("nan")):
        (result,) = set_remote(env, **{"ppo.learning_rate": bad})
        assert not result.successful and "outside min_learning_rate .. max_learning_rate" in (
            result.reason)
    assert env.trainer.agent.trainer.learning_rate == pytest.approx(1e-4)
    assert get_remote(env, "ppo.learning_rate") == pytest.approx(1e-4)
    env.start()
    for _ in range(NUM_STEPS):
        env.step()
    assert env.trainer.last_metrics["learning_rate"] == pytest.approx(1e-4)


def test_services_and_parameters_stay_in_agreement(make_env):
    env = make_env()
    env.call(SetBool, "set_training", SetBool.Request(data=False))
    assert get_remote(env, "training") is False and env.trainer.loop.cfg.training is False
    (result,) = set_remote(env, training=True)
    assert result.successful and env.trainer.loop.cfg.training is True
    env.call(SetBool, "set_deterministic", SetBool.Request(data=True))
    assert get_remote(env, "deterministic") is True and env.trainer.loop.cfg.deterministic
    (result,) = set_remote(env, deterministic="yes")
    assert not result.successful and env.trainer.loop.cfg.deterministic is True


def test_an_unknown_parameter_name_is_named(make_env):
    env = make_env(**{"ppo.learning_rte": 0.1})
    assert unknown_parameters(env.trainer) == ["ppo.learning_rte"]


def test_a_params_file_keeps_setting_how_the_update_runs_under_ppo(tmp_path):
    """The run-time knobs left PPOConfig but kept their ``ppo.*`` names: older params
    files still set them, and nothing is reported unknown."""
    params_file = tmp_path / "params.yaml"
    params_file.write_text(
        "/**/unilab_trainer:\n"
        "  ros__parameters:\n"
        "    ppo:\n"
        "      learning_rate: 0.001\n"
        "      enable_compile: false\n"
        "      finite_check_interval: 3\n"
        "      warmup_strict_iters: 2\n"
    )
    context = rclpy.Context()
    rclpy.init(args=["--ros-args", "--params-file", str(params_file)], context=context)
    params = small_params(checkpoint_dir=str(tmp_path), warm_up_update=False)
    try:
        trainer = TrainerNode(
            context=context,
            parameter_overrides=[Parameter(name, value=value) for name, value in params.items()],
        )
        try:
            assert unknown_parameters(trainer) == []
            agent = trainer.agent
            assert agent.ppo_cfg.learning_rate == 0.001
            expected = PPORuntimeConfig(
                enable_compile=False, finite_check_interval=3, warmup_strict_iters=2
            )
            assert agent.runtime_cfg == agent.trainer.runtime == expected
        finally:
            trainer.close()
            trainer.destroy_node()
    finally:
        rclpy.try_shutdown(context=context)


def test_a_folder_that_refuses_writes_does_not_stop_training(make_env, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    env = make_env(checkpoint_dir=str(blocker / "checkpoints"), tensorboard=True)
    env.start()
    for _ in range(NUM_STEPS + 1):
        env.step()
    trainer = env.trainer
    assert trainer.agent.iteration == 1 and trainer.artifacts.metrics.failures >= 1
    response = env.call(Trigger, "save_checkpoint", Trigger.Request())
    assert not response.success and "saving failed" in response.message
    assert trainer.counters["save_failures"] >= 1
    status = json.loads(json.dumps(trainer.status(), allow_nan=False))
    assert "NotADirectoryError" in status["last_save_error"] or "FileExists" in (
        status["last_save_error"])
    env.step()  # still acting


def test_a_full_disk_during_a_save_is_reported_not_fatal(make_env, monkeypatch):
    env = make_env()
    env.start()

    def disk_full(*_args, **_kwargs):
        raise RuntimeError("[save_safetensors] Failed to write: No space left on device")

    monkeypatch.setattr("unilab_ros.rl.checkpoint.mx.save_safetensors", disk_full)
    response = env.call(Trigger, "save_checkpoint", Trigger.Request())
    assert not response.success and "No space left" in response.message
    assert env.trainer.counters["save_failures"] == 1
    assert not list(Path(env.trainer.cfg.checkpoint_dir).glob(".*safetensors")), "temp files"
    env.step()
    monkeypatch.undo()
    env.spin_for(1.05)  # ~/save_checkpoint saves at most once a second
    assert env.call(Trigger, "save_checkpoint", Trigger.Request()).success


def test_the_status_is_strict_json_before_any_episode(make_env):
    env = make_env()
    status = json.dumps(env.trainer.status(), allow_nan=False)
    assert json.loads(status)["mean_return"] is None


def test_control_services_off_offers_no_control(make_env):
    env = make_env(control_services=False)
    spin_until(env.executor, lambda: False, 0.3)
    names = {name for name, _ in env.node.get_service_names_and_types()}
    assert "/unilab_trainer/set_training" not in names
    assert "/unilab_trainer/save_checkpoint" not in names
    assert "/unilab_trainer/set_parameters" in names, "parameters are still listed"
    (result,) = set_remote(env, training=False)
    assert not result.successful and "control_services" in result.reason
    assert env.trainer.loop.cfg.training


def test_temporary_files_of_unfinished_saves_are_removed_at_start(make_env, tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    stale = folder / ".latest.safetensors.x1y2z3.safetensors"
    stale.write_bytes(b"partial")
    kept = folder / "latest.safetensors"
    kept.write_bytes(b"not ours to judge")
    make_env(checkpoint_dir=str(folder))
    assert not stale.exists() and kept.exists()


def test_a_flood_of_save_requests_is_refused_not_served(make_env):
    env = make_env()
    env.start()
    answers = [env.call(Trigger, "save_checkpoint", Trigger.Request()) for _ in range(5)]
    assert [answer.success for answer in answers] == [True, False, False, False, False]
    assert "at most once every 1 s" in answers[1].message
    assert env.trainer.counters["save_requests_refused"] == 4


def test_episode_statistics_survive_a_resume(make_env, tmp_path):
    env = make_env()
    env.start()
    for step in range(NUM_STEPS + 1):
        done = np.ones(NUM_ENVS, np.uint8) if step == 1 else None
        env.step(reward=np.full(NUM_ENVS, 2.0), done=done)
    assert env.trainer.stats.episodes == NUM_ENVS
    env.close()
    resumed = make_env(resume_from=str(tmp_path / "checkpoints" / "latest.safetensors"))
    assert resumed.trainer.stats.episodes == NUM_ENVS
    assert resumed.trainer.stats.mean_return == pytest.approx(4.0)
    assert resumed.trainer.status()["mean_return"] == pytest.approx(4.0)


def test_bad_messages_that_arrive_during_an_update_are_counted_as_rejected(make_env):
    env = make_env()
    env.start()
    # Queued, not yet delivered: what the update's drain finds when it ends.
    env.reward_pub.publish(Float32MultiArray(data=[float("nan"), 0.0]))
    env.obs_pub.publish(to_float32_msg(np.full((NUM_ENVS, OBS_DIM), 1e30, np.float32)))
    env.done_pub.publish(UInt8MultiArray(data=[9, 0]))
    time.sleep(0.3)
    env.trainer._drain_queued()
    counters = env.trainer.counters
    assert counters["discarded_during_update"] == 3
    assert (counters["rejected_rewards"], counters["rejected_observations"],
            counters["rejected_dones"]) == (1, 1, 1)


def test_estop_topic_and_export_bundle_service(make_env, tmp_path):
    env = make_env(blend_in_steps=3)
    estop = env.node.create_publisher(Bool, "estop", 10)
    assert env.spin_until(lambda: estop.get_subscription_count() > 0)
    env.start()
    env.step()
    count = len(env.action_msgs)
    estop.publish(Bool(data=True))
    assert env.spin_until(lambda: len(env.action_msgs) > count), "no action at the e-stop"
    assert is_safe(env.actions[-1]) and env.trainer.loop.estop
    stored = env.trainer.loop.stored_steps
    # The outstanding step is forgotten: the next observation is answered safely.
    assert is_safe(env.start())
    assert is_safe(env.step())
    assert env.trainer.loop.stored_steps == stored
    estop.publish(Bool(data=False))
    assert env.spin_until(lambda: not env.trainer.loop.estop)
    assert not is_safe(env.step())
    assert env.trainer.status()["estops"] == 1
    response = env.call(Trigger, "export_bundle", Trigger.Request())
    assert response.success, response.message
    bundle = read_policy(response.message)
    assert Path(response.message).parent == tmp_path / "checkpoints"
    assert bundle.actions.safe_action == [SAFE]
    obs = env.new_obs()
    np.testing.assert_array_equal(
        PolicySampler(bundle.model(), 0)(obs, deterministic=True),
        env.trainer.agent.act(obs, deterministic=True),
    )


def test_main_says_what_it_waits_for_and_writes_to_a_run_folder_of_its_own(
    ros_domain_env, tmp_path
):
    """No checkpoint_dir: a folder per run under runs/<namespace>/; with no robot, a
    throttled line names the resolved topics it waits on."""
    command = _trainer_command(
        "--params-file", str(PACKAGE_ROOT / "config" / "trainer.yaml"),
        "-r", "__ns:=/robot7", "-p", "warm_up_update:=false", "-p", "tensorboard:=false",
        "-p", "wait_report_period:=0.5",
    )
    with _trainer_process(command, ros_domain_env, tmp_path) as (process, lines):
        _wait_for_lines(process, lines, "waiting for the first observation", 2)
        waiting = [line for line in lines if "waiting for the first observation" in line]
        assert len(waiting) >= 2, "".join(lines)
        for topic in ("observation", "reward", "done"):
            assert f"/robot7/{topic} (0 publishers)" in waiting[0]
        assert "actions go to /robot7/action" in waiting[0]
        # Throttled: one line a period, not one per check.
        assert len(waiting) <= 3, "".join(lines)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=10.0) == 0, "".join(lines)
    runs = tmp_path / "runs" / "robot7"
    folders = [path for path in runs.iterdir() if path.name != "latest"]
    assert len(folders) == 1 and folders[0].name.endswith(f"-{process.pid}")
    # It wrote nothing: latest does not move to an empty folder (here there was none).
    assert not (runs / "latest").exists()
    assert f"output: {folders[0]}" in "".join(lines)
    # The start-up line says what decides the update's speed.
    assert f"heap: {heap.status}; output:" in "".join(lines)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise AssertionError(f"no VmRSS for pid {pid}")


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads RSS from /proc")
def test_huge_observations_are_rejected_without_growing_memory(
    context, ros_domain_env, tmp_path
):
    """Bursts of 10-million-float observations are refused and leave no memory behind:
    the package's Fast DDS profile frees each sample's buffer (rmw_fastrtps' default kept
    one of the largest size per queued sample, +150 MB for good after a burst of four)."""
    command = _trainer_command(
        "--params-file", str(PACKAGE_ROOT / "config" / "trainer.yaml"),
        "-p", f"checkpoint_dir:={tmp_path}", "-p", "tensorboard:=false",
        "-p", "warm_up_update:=false",
    )
    node = rclpy.create_node("huge_probe", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    statuses: list[dict] = []
    node.create_subscription(
        String, "/unilab_trainer/status", lambda msg: statuses.append(json.loads(msg.data)), 10
    )
    publisher = node.create_publisher(Float32MultiArray, "observation", 10)
    huge = to_float32_msg(np.zeros((1, 10_000_000), np.float32), ("env", "obs"))
    message_mb = 10_000_000 * 4 / 2**20

    def rejected() -> int:
        return statuses[-1]["rejected_observations"] if statuses else -1

    with _trainer_process(command, ros_domain_env, tmp_path) as (process, lines):
        _wait_for_lines(process, lines, "ready:", 1)
        assert spin_until(executor, lambda: publisher.get_subscription_count() > 0
                          and rejected() == 0, 30.0), "".join(lines)
        before = _rss_mb(process.pid)
        publisher.publish(huge)
        assert spin_until(executor, lambda: rejected() == 1, 30.0), "".join(lines)
        after_one = _rss_mb(process.pid)
        for _ in range(3):
            publisher.publish(huge)
        assert spin_until(executor, lambda: rejected() == 4, 30.0), "".join(lines)
        after_four = _rss_mb(process.pid)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20.0) == 0, "".join(lines)
    executor.shutdown()
    node.destroy_node()
    assert after_one - before < 0.25 * message_mb, (before, after_one)
    assert after_four - before < 0.25 * message_mb, (before, after_four)
