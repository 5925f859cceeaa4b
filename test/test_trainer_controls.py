"""TrainerNode's controls with real rclpy: the simulator's pause around the update, the
parameters (``ros2 param`` through the node's services), file faults, the status and the
e-stop (trainer_harness.FakeEnv; conftest's ``make_env``).
"""

import json
import time
from pathlib import Path

import numpy as np
import pytest
import rcl_interfaces.msg
import rclpy
from rcl_interfaces.srv import DescribeParameters, GetParameters
from rclpy.parameter import Parameter
from ros_helpers import spin_until
from std_msgs.msg import Bool, Float32MultiArray, UInt8MultiArray
from std_srvs.srv import Empty, SetBool, Trigger
from trainer_harness import (
    NUM_ENVS,
    NUM_STEPS,
    OBS_DIM,
    SAFE,
    WAIT_S,
    get_remote,
    is_safe,
    set_remote,
    small_params,
)

from unilab_ros.rl.bundle import read_policy
from unilab_ros.rl.policy import PolicySampler
from unilab_ros.rl.ppo_runtime import PPORuntimeConfig
from unilab_ros.ros.messages import to_float32_msg
from unilab_ros.ros.params import unknown_parameters
from unilab_ros.trainer.node import TrainerNode

pytestmark = pytest.mark.ros


@pytest.mark.parametrize("service_type, pauses", [
    ("empty", True), ("trigger", True), ("setbool", True), ("setbool", False)])
def test_the_simulator_is_paused_for_the_update_and_resumed(make_env, service_type, pauses):
    """A simulator that paused gets no safe action (it takes no step; one arriving after
    the resume would step it); one that answered without success gets it."""
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
                response.success = pauses or name == "resume"
            return response

        return serve

    env.node.create_service(srv, "/sim/pause", handler("pause"))
    env.node.create_service(srv, "/sim/resume", handler("resume"))
    env.start()
    for _ in range(NUM_STEPS):
        env.step(expected_actions=0)
    safe = 0 if pauses else 1
    assert env.spin_until(
        lambda: len(calls) == 2 and len(env.action_msgs) >= NUM_STEPS + safe + 1)
    data = {"setbool": (True, False)}.get(service_type, (None, None))
    assert calls == [("pause", 0, data[0], 0, False), ("resume", 1, data[1], safe, False)]
    assert env.trainer.agent.iteration == 1
    assert [is_safe(action) for action in env.actions[NUM_STEPS:]] == [True] * safe + [False]


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
    # Not a run's checkpoint: a start in a folder with a run resumes it (test_restart).
    kept = folder / "exported_policy.safetensors"
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


