"""Each robot term's math against hand-computed values, the observation pipeline's order
(compute -> clip -> scale -> history, oldest first) and the joint command mapping."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from unilab_ros.rl.done_codes import DoneCode
from unilab_ros.robot.extract import (
    MissingJoint,
    joint_values,
    projected_gravity,
    rotate_inverse,
    sample_field,
)
from unilab_ros.robot.joint_commands import JointCommands
from unilab_ros.robot.observation import ObservationBuilder
from unilab_ros.robot.observation_terms import OBSERVATIONS
from unilab_ros.robot.reward_terms import REWARDS
from unilab_ros.robot.samples import (
    ArraySample,
    ImuSample,
    JointStateSample,
    OdometrySample,
    PoseSample,
)
from unilab_ros.robot.spec import load_spec, spec_from_dict
from unilab_ros.robot.task import Task
from unilab_ros.robot.termination_terms import TERMINATIONS
from unilab_ros.robot.terms import TermContext

SPECS = Path(__file__).resolve().parents[1] / "config" / "robot_specs"
S = math.sqrt(0.5)
UPRIGHT = np.array([0.0, 0.0, 0.0, 1.0])
ABOUT_X_90 = np.array([S, 0.0, 0.0, S])
"""(x, y, z, w): 90 degrees about x; the body's y axis points up, its z axis along -y."""


def joints(names=("hinge", "extra", "slider"), position=(-0.3, 9.0, 0.7),
           velocity=(2.0, 9.0, 1.0), effort=(0.5, 9.0, -4.0), stamp=None):
    return JointStateSample(tuple(names), np.array(position), np.array(velocity),
                            np.array(effort), stamp)


def odom(position=(0.0, 0.0, 0.25), xyzw=UPRIGHT, linear=(0.3, 0.1, -0.2),
         angular=(0.0, 0.0, 0.4)):
    return OdometrySample(np.array(position), np.array(xyzw), np.array(linear),
                          np.array(angular), "base_link", 1.0)


def pose(position):
    return PoseSample(np.array(position), UPRIGHT, 1.0)


def context(**overrides) -> TermContext:
    base = dict(samples={"joints": joints(), "odom": odom(),
                         "imu": ImuSample(ABOUT_X_90, np.array([0.1, 0.2, 0.3]),
                                          np.array([0.0, 9.81, 0.0]), 1.0),
                         "tip": pose((0.1, 0.0, 0.01))},
                previous={}, commands={"v": np.array([0.5, 0.0, 0.2]),
                                       "goal": np.array([0.1, 0.03, 0.05])},
                default_pose={"slider": 0.5, "hinge": -0.1},
                action=np.array([1.0, -2.0]), previous_action=np.array([0.5, 0.0]), dt=0.02)
    return TermContext(**{**base, **overrides})


def test_projected_gravity_from_known_quaternions():
    np.testing.assert_allclose(projected_gravity(UPRIGHT), [0.0, 0.0, -1.0], atol=1e-12)
    # Rolled 90 degrees about x: the world's down lies along the body's -y.
    np.testing.assert_allclose(projected_gravity(ABOUT_X_90), [0.0, -1.0, 0.0], atol=1e-12)
    # Pitched 90 degrees about y: the world's down lies along the body's +x.
    np.testing.assert_allclose(projected_gravity([0.0, S, 0.0, S]), [1.0, 0.0, 0.0],
                               atol=1e-12)
    # Not normalised: the direction is the same.
    np.testing.assert_allclose(projected_gravity(2.0 * ABOUT_X_90), [0.0, -1.0, 0.0],
                               atol=1e-12)
    with pytest.raises(ValueError, match="no quaternion"):
        projected_gravity([0.0, 0.0, 0.0, 0.0])


def test_rotations_of_any_quaternion_agree_with_mujoco():
    mujoco = pytest.importorskip("mujoco")
    rng = np.random.default_rng(0)
    for _ in range(20):
        xyzw, vector = rng.normal(size=4), rng.normal(size=3)
        matrix = np.zeros(9)
        # MuJoCo orders a quaternion (w, x, y, z).
        mujoco.mju_quat2Mat(matrix, np.roll(xyzw / np.linalg.norm(xyzw), 1))
        np.testing.assert_allclose(rotate_inverse(xyzw, vector),
                                   matrix.reshape(3, 3).T @ vector, atol=1e-12)


def test_joints_are_matched_by_name_whatever_the_wire_order():
    sample = joints()
    np.testing.assert_allclose(joint_values(sample, ["slider", "hinge"], "position"),
                               [0.7, -0.3])
    ctx = context()
    params = {"joints": ["slider", "hinge"]}
    np.testing.assert_allclose(OBSERVATIONS["joint_pos_rel"].fn(ctx, "joints", params),
                               [0.7 - 0.5, -0.3 + 0.1])
    np.testing.assert_allclose(OBSERVATIONS["joint_vel"].fn(ctx, "joints", params), [1.0, 2.0])
    np.testing.assert_allclose(OBSERVATIONS["joint_effort"].fn(ctx, "joints", params),
                               [-4.0, 0.5])
    with pytest.raises(MissingJoint, match=r"\['elbow'\] not in joint_states"):
        joint_values(sample, ["slider", "elbow"], "position")


def test_joint_states_without_the_values_asked_for_are_errors():
    sample = JointStateSample(("slider", "hinge"), np.zeros(2), np.zeros(2), np.array([]))
    with pytest.raises(ValueError, match="joint_states has 2 names but 0 effort values"):
        joint_values(sample, ["slider"], "effort")


def test_base_terms_read_the_imu_and_odometry():
    ctx = context()
    obs = {kind: OBSERVATIONS[kind].fn(ctx, source, {}) for kind, source in
           [("projected_gravity", "imu"), ("base_ang_vel", "imu"), ("base_lin_vel", "odom"),
            ("base_height", "odom")]}
    np.testing.assert_allclose(obs["projected_gravity"], [0.0, -1.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(obs["base_ang_vel"], [0.1, 0.2, 0.3])
    np.testing.assert_allclose(obs["base_lin_vel"], [0.3, 0.1, -0.2])
    np.testing.assert_allclose(obs["base_height"], [0.25])
    np.testing.assert_allclose(OBSERVATIONS["base_ang_vel"].fn(ctx, "odom", {}), [0, 0, 0.4])
    target = OBSERVATIONS["target_position"].fn(ctx, "", {"command": "goal",
                                                          "relative_to": "tip"})
    np.testing.assert_allclose(target, [0.0, 0.03, 0.04])
    assert sample_field(ctx.samples["odom"], "orientation_xyzw.w") == 1.0
    with pytest.raises(ValueError, match="ArraySample.data has 2 values; 'data.5' reads index 5"):
        sample_field(ArraySample(np.zeros(2)), "data.5")


def reward(kind: str, source: str = "", ctx: TermContext | None = None, **params) -> float:
    return REWARDS[kind].fn(ctx or context(), source, params)


def test_penalties_l2_and_l1():
    assert reward("action_rate_l2") == pytest.approx(0.5 ** 2 + 2.0 ** 2)
    assert reward("action_rate_l1") == pytest.approx(0.5 + 2.0)
    assert reward("action_l2") == pytest.approx(1.0 + 4.0)
    assert reward("joint_vel_l2", "joints", joints=["slider", "hinge"]) == pytest.approx(5.0)
    assert reward("joint_effort_l1", "joints", joints=["slider"]) == pytest.approx(4.0)
    assert reward("orientation_l2", "imu") == pytest.approx(1.0)
    assert reward("height_error_l2", "odom", target=0.2) == pytest.approx(0.05 ** 2)
    assert reward("lin_vel_z_l1", "odom") == pytest.approx(0.2)


def test_joint_acceleration_by_finite_difference_over_the_stamps():
    before = joints(velocity=(2.0, 0.0, 1.0), stamp=10.0)
    now = joints(velocity=(1.0, 0.0, 1.5), stamp=10.04)
    ctx = context(samples={"joints": now}, previous={"joints": before})
    # (0.5 / 0.04)^2 + (-1 / 0.04)^2, the stamps' interval, not dt = 0.02.
    assert reward("joint_acc_l2", "joints", ctx, joints=["slider", "hinge"]) == \
        pytest.approx(12.5 ** 2 + 25.0 ** 2)
    # An episode's first tick has no previous velocities: no acceleration.
    assert reward("joint_acc_l2", "joints", context(), joints=["slider"]) == 0.0


def test_tracking_distance_alive_and_termination():
    # |(0.5, 0) - (0.3, 0.1)|^2 = 0.05, std 0.5.
    assert reward("exp_tracking", "odom", command="v", command_indices=[0, 1],
                  fields=["linear.x", "linear.y"], std=0.5) == pytest.approx(math.exp(-0.2))
    assert reward("exp_tracking", "odom", command="v", command_indices=[2],
                  fields=["angular.z"], std=0.1) == pytest.approx(math.exp(-4.0))
    assert reward("site_distance", site="tip", target="goal") == pytest.approx(0.05)
    assert reward("alive") == 1.0 and reward("termination") == 0.0
    failed = context(failed=True)
    assert reward("alive", ctx=failed) == 0.0 and reward("termination", ctx=failed) == 1.0


def terminated(kind: str, source: str = "", ctx: TermContext | None = None, **params) -> bool:
    return TERMINATIONS[kind].fn(ctx or context(), source, params)


def test_terminations():
    assert terminated("episode_length", ctx=context(episode_step=10), max_steps=10)
    assert not terminated("episode_length", ctx=context(episode_step=9), max_steps=10)
    # Rolled 90 degrees: tilted pi/2.
    assert terminated("orientation_limit", "imu", limit=1.5)
    assert not terminated("orientation_limit", "imu", limit=1.6)
    assert not terminated("orientation_limit", "odom", limit=0.01)
    assert terminated("base_height_below", "odom", minimum=0.3)
    assert not terminated("base_height_below", "odom", minimum=0.2)
    bounds = {"joints": ["slider", "hinge"], "low": [-1.0, -0.25], "high": [1.0, 0.25]}
    assert terminated("joint_pos_out_of_bounds", "joints", **bounds)
    assert not terminated("joint_pos_out_of_bounds", "joints", **{**bounds, "low": -0.5})
    assert terminated("joint_vel_out_of_bounds", "joints", joints=["hinge"], limit=1.5)
    assert not terminated("joint_vel_out_of_bounds", "joints", joints=["slider"], limit=1.5)
    assert terminated("target_reached", site="tip", target="goal", threshold=0.06)
    assert not terminated("target_reached", site="tip", target="goal", threshold=0.04)


def cartpole(**changes) -> dict:
    import yaml
    data = yaml.safe_load((SPECS / "cartpole.yaml").read_text())
    data.update(changes)
    return data


def test_a_termination_may_be_declared_a_time_out():
    data = cartpole()
    data["terminations"][1]["time_out"] = True
    task = Task(spec_from_dict(data))
    fallen = joints(names=("slider", "hinge"), position=(0.0, 0.5), velocity=(0.0, 0.0),
                    effort=(0.0, 0.0))
    assert task.done(context(samples={"joints": fallen})) == \
        (DoneCode.TRUNCATED, ["joint_pos_out_of_bounds"])


def test_a_failure_wins_over_a_time_out_and_rewards_are_weight_value_dt():
    task = Task(load_spec(SPECS / "cartpole.yaml"))
    upright = joints(names=("slider", "hinge"), position=(0.0, 0.1), velocity=(0.0, 0.0),
                     effort=(0.0, 0.0))
    fallen = replace(upright, position=np.array([0.0, 0.5]))
    assert task.done(context(samples={"joints": upright}, episode_step=5)) == \
        (DoneCode.RUNNING, [])
    assert task.done(context(samples={"joints": upright}, episode_step=1000)) == \
        (DoneCode.TRUNCATED, ["episode_length"])
    code, fired = task.done(context(samples={"joints": fallen}, episode_step=1000))
    assert code == DoneCode.TERMINATED and fired == ["episode_length", "joint_pos_out_of_bounds"]
    # alive 1.0 x 0.02 on a running step; on a failure the -50 penalty instead.
    total, shares = task.reward(context(samples={"joints": upright}), DoneCode.RUNNING)
    assert total == pytest.approx(0.02) and shares == pytest.approx([0.02, 0.0, 0.0])
    assert task.reward(context(samples={"joints": fallen}), DoneCode.TERMINATED)[0] == \
        pytest.approx(-1.0)


def test_the_pipeline_clips_then_scales_then_keeps_history_oldest_first():
    spec = spec_from_dict(cartpole(observation=[
        {"kind": "joint_vel", "source": "joints", "joints": ["slider", "hinge"],
         "clip": [-1.0, 1.0], "scale": [2.0, 10.0], "history": 3},
        {"kind": "last_action"},
    ]))
    builder = ObservationBuilder(spec)
    assert builder.dim == 3 * 2 + 1
    first = builder.build({"joints": joints(velocity=(5.0, 0.0, 0.05))}, np.array([0.3]))
    # slider 0.05 -> 0.1; hinge 5 -> clipped to 1 -> 10; the first step fills the history.
    np.testing.assert_allclose(first, [0.1, 10.0] * 3 + [0.3], rtol=1e-6)
    second = builder.build({"joints": joints(velocity=(-0.02, 0.0, -3.0))}, np.array([-1.0]))
    np.testing.assert_allclose(second, [0.1, 10.0, 0.1, 10.0, -2.0, -0.2, -1.0], rtol=1e-6)
    third = builder.build({"joints": joints(velocity=(0.0, 0.0, 0.0))}, np.array([0.0]))
    np.testing.assert_allclose(third, [0.1, 10.0, -2.0, -0.2, 0.0, 0.0, 0.0], rtol=1e-6)
    builder.reset()
    again = builder.build({"joints": joints(velocity=(0.0, 0.0, 0.0))}, np.array([0.0]))
    np.testing.assert_allclose(again, np.zeros(7))
    assert again.dtype == np.float32
    layout = [s.to_dict() for s in builder.layout()]
    assert json.loads(json.dumps(layout)) == [
        {"term": "joint_vel", "start": 0, "stop": 6, "values": 2, "history": 3,
         "source": "joints", "joints": ["slider", "hinge"], "clip": [-1.0, 1.0],
         "scale": [2.0, 10.0]},
        {"term": "last_action", "start": 6, "stop": 7, "values": 1, "history": 1,
         "source": "", "joints": [], "clip": None, "scale": [1.0]},
    ]


def test_position_actions_are_default_plus_scale_times_action_within_limits():
    commands = JointCommands(load_spec(SPECS / "quadruped.yaml"))
    assert commands.dim == 8 and commands.joints[:2] == ("front_left_hip", "front_left_knee")
    np.testing.assert_allclose(commands.safe, [0.6, -1.2] * 4)
    action = np.array([1.0, 1.0, -1.0, 0.0, 4.0, 8.0, 0.0, 0.0])
    # 0.6 + 0.25; -1.2 + 0.25; 0.6 - 0.25; -1.2; 0.6 + 1.0; -1.2 + 2.0 -> clipped to 0.
    np.testing.assert_allclose(commands(action),
                               [0.85, -0.95, 0.35, -1.2, 1.2, 0.0, 0.6, -1.2])
    np.testing.assert_allclose(commands.policy_units(commands(action[:4].tolist() * 2)),
                               action[:4].tolist() * 2)
    with pytest.raises(ValueError, match="8 joints are commanded"):
        commands(np.zeros(3))


def test_effort_actions_scale_and_clip_and_are_safe_at_zero():
    commands = JointCommands(load_spec(SPECS / "cartpole.yaml"))
    np.testing.assert_allclose(commands(np.array([0.5])), [5.0])
    np.testing.assert_allclose(commands(np.array([-3.0])), [-20.0])
    np.testing.assert_allclose(commands.safe, [0.0])


def test_array_fields_and_commands_enter_the_observation_with_metadata():
    spec = spec_from_dict(cartpole(
        sources=[{"name": "joints", "topic": "joint_states", "type": "joint_state",
                  "max_age": 0.1},
                 {"name": "extra", "topic": "extra", "type": "float_array", "max_age": 0.1}],
        commands=[{"name": "speed", "ranges": [[0.0, 1.0], [2.0, 2.0]]},
                  {"name": "level", "source": "extra", "fields": ["data.0"]}],
        observation=[{"kind": "array_field", "source": "extra", "indices": [2, 0]},
                     {"kind": "command", "command": "speed", "history": 2},
                     {"kind": "command", "command": "level"}]))
    builder = ObservationBuilder(spec)
    samples = {"extra": ArraySample(np.array([7.0, 8.0, 9.0]))}
    obs = builder.build(samples, np.zeros(1), {"speed": np.array([0.5, 2.0])})
    # The "level" command is read from its source by the builder itself.
    np.testing.assert_allclose(obs, [9.0, 7.0, 0.5, 2.0, 0.5, 2.0, 7.0])
    metadata = json.loads(json.dumps(builder.metadata()))
    assert metadata["dim"] == 7 and metadata["history_order"] == "oldest_first"
    assert metadata["pipeline"] == "compute, clip, scale, history"
    assert [(s["term"], s["start"], s["stop"]) for s in metadata["slices"]] == \
        [("array_field", 0, 2), ("command", 2, 6), ("command", 6, 7)]
