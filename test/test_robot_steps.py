"""RobotSteps, the clocked step source: segment starts and transitions at the tick, stale
data cut as a time-out, done codes, resets waiting for fresh data, per-episode commands,
and a short run against the MuJoCo robots."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from unilab_ros.loop.steps import SegmentStart, Transition
from unilab_ros.robot.extract import MissingJoint
from unilab_ros.robot.joint_commands import JointCommands
from unilab_ros.robot.observation import ObservationBuilder
from unilab_ros.robot.samples import (
    JointStateSample,
    PoseSample,
    TwistSample,
)
from unilab_ros.robot.spec import load_spec, spec_from_dict
from unilab_ros.robot.steps import RobotSteps

SPECS = Path(__file__).resolve().parents[1] / "config" / "robot_specs"


def cartpole_steps(**changes) -> RobotSteps:
    data = yaml.safe_load((SPECS / "cartpole.yaml").read_text())
    data.update(changes)
    return RobotSteps(spec_from_dict(data), np.random.default_rng(0))


def joints(t: float, hinge: float = 0.0, names=("hinge", "slider")) -> JointStateSample:
    position = {"hinge": hinge, "slider": 0.2}
    return JointStateSample(names, np.array([position[n] for n in names]), np.zeros(2),
                            np.zeros(2), t)


def step(steps: RobotSteps, t: float, hinge: float = 0.0, action=(0.5,)):
    """A sample at ``t``, the tick at ``t``; then act on what it returned."""
    steps.on_sample("joints", joints(t, hinge), t)
    event = steps.tick(t)
    if event is not None and not steps.needs_reset:
        obs = event.obs if isinstance(event, SegmentStart) else event.next_obs
        steps.action_sent(obs, np.array([action], np.float32), 0, t)
    return event


def test_a_segment_starts_then_each_tick_completes_the_step():
    steps = cartpole_steps()
    assert steps.tick(0.0) is None  # no data yet
    first = step(steps, 0.0, hinge=0.1)
    assert isinstance(first, SegmentStart)
    np.testing.assert_allclose(first.obs, [[0.2, 0.1, 0.0, 0.0]], rtol=1e-6)
    second = step(steps, 0.02, hinge=0.15)
    assert isinstance(second, Transition)
    assert second.obs is first.obs and second.action.tolist() == [[0.5]]
    np.testing.assert_allclose(second.next_obs, [[0.2, 0.15, 0.0, 0.0]], rtol=1e-6)
    assert second.reward.tolist() == pytest.approx([0.02])  # alive 1.0 x dt
    assert second.done.tolist() == [0] and second.done.dtype == np.uint8
    assert second.next_obs_stamp == 20_000_000
    assert steps.episode_step == 1 and steps.counters["steps_completed"] == 1


def test_stale_data_cuts_the_step_as_a_time_out_and_is_counted():
    steps = cartpole_steps()
    step(steps, 0.0)
    # The joint states stop; at 0.15 s they are 0.15 s old (max_age 0.1).
    assert steps.tick(0.05) is not None
    steps.action_sent(np.zeros((1, 4)), np.zeros((1, 1)), 0, 0.05)
    assert steps.tick(0.15) is None
    assert steps.stale == {"joints": pytest.approx(0.15)}
    assert steps.ages(0.15) == {"joints": pytest.approx(0.15)}
    counts = steps.counters
    assert (counts["stale_ticks"], counts["stale_joints"], counts["steps_dropped"],
            counts["stale_cuts"], counts["time_outs"]) == (1, 1, 1, 1, 1)
    assert steps.needs_reset
    # The loop learns of the cut once, and cuts the segment.
    assert steps.expired(0.15) and not steps.expired(0.16)
    assert steps.tick(0.2) is None


def test_stale_data_without_a_step_outstanding_only_waits():
    steps = cartpole_steps()
    steps.on_sample("joints", joints(0.0), 0.0)
    assert steps.tick(0.5) is None and steps.stale == {"joints": pytest.approx(0.5)}
    assert not steps.needs_reset and steps.counters["steps_dropped"] == 0
    assert isinstance(step(steps, 0.52), SegmentStart) and steps.stale == {}


def test_an_unstamped_sample_is_as_old_as_its_arrival():
    data = yaml.safe_load((SPECS / "cartpole.yaml").read_text())
    data["sources"] = data["sources"] + [
        {"name": "cmd", "topic": "cmd_vel", "type": "twist", "max_age": 0.5}]
    steps = RobotSteps(spec_from_dict(data), np.random.default_rng(0))
    steps.on_sample("cmd", TwistSample(np.zeros(3), np.zeros(3)), 3.0)
    assert steps.ages(3.25)["cmd"] == pytest.approx(0.25)
    assert steps.ages(3.25)["joints"] == math.inf


def test_a_failure_is_done_1_and_the_next_episode_waits_for_a_reset_and_fresh_data():
    steps = cartpole_steps()
    step(steps, 0.0)
    fell = step(steps, 0.02, hinge=0.5)
    assert fell.done.tolist() == [1] and steps.fired == ["joint_pos_out_of_bounds"]
    assert fell.reward.tolist() == pytest.approx([-1.0])  # termination -50 x dt
    assert steps.needs_reset and steps.counters["failures"] == 1
    assert step(steps, 0.04) is None
    steps.start_episode(0.1)
    # Data from before the reset finished is not the new episode's.
    steps.on_sample("joints", joints(0.09), 0.1)
    assert steps.tick(0.1) is None and steps.waiting == ["joints"]
    assert steps.counters["waiting_ticks"] == 1
    start = step(steps, 0.12)
    assert isinstance(start, SegmentStart) and steps.episode_step == 0 and steps.waiting == []


def test_the_episode_length_is_done_2():
    data = yaml.safe_load((SPECS / "cartpole.yaml").read_text())
    data["terminations"][0]["max_steps"] = 3
    steps = RobotSteps(spec_from_dict(data), np.random.default_rng(0))
    events = [step(steps, 0.02 * i) for i in range(4)]
    assert [e.done.tolist() for e in events[1:]] == [[0], [0], [2]]
    assert steps.counters["time_outs"] == 1 and steps.counters["episodes"] == 1


def test_a_late_step_expires_and_a_reset_forgets_it():
    steps = cartpole_steps()
    step(steps, 0.0)
    assert not steps.expired(0.06)  # 3 control periods
    assert steps.expired(0.07) and steps.counters["steps_dropped"] == 1
    assert not steps.drop()
    step(steps, 0.08)
    steps.reset()
    assert not steps.drop() and steps.counters["steps_dropped"] == 1


def test_last_action_and_action_rate_follow_the_actions_sent():
    data = yaml.safe_load((SPECS / "cartpole.yaml").read_text())
    data["observation"].append({"kind": "last_action"})
    data["rewards"] = [{"kind": "action_rate_l2", "weight": -1.0}]
    steps = RobotSteps(spec_from_dict(data), np.random.default_rng(0))
    step(steps, 0.0, action=(0.5,))
    second = step(steps, 0.02, action=(-0.5,))
    third = step(steps, 0.04)
    assert second.next_obs[0, -1] == pytest.approx(0.5)
    assert third.next_obs[0, -1] == pytest.approx(-0.5)
    assert second.reward[0] == pytest.approx(-(0.5 ** 2) * 0.02)
    assert third.reward[0] == pytest.approx(-(1.0 ** 2) * 0.02)


def test_bad_samples_are_clear_errors():
    steps = cartpole_steps()
    with pytest.raises(MissingJoint, match=r"\['hinge'\] not in joint_states"):
        steps.on_sample("joints", JointStateSample(("slider", "other"), np.zeros(2),
                                                   np.zeros(2), np.zeros(2), 0.0), 0.0)
    with pytest.raises(ValueError, match="takes a JointStateSample, got TwistSample"):
        steps.on_sample("joints", TwistSample(np.zeros(3), np.zeros(3)), 0.0)
    with pytest.raises(ValueError, match="no source named 'imu'"):
        steps.on_sample("imu", joints(0.0), 0.0)


def test_commands_are_drawn_per_episode_within_their_ranges():
    steps = RobotSteps(load_spec(SPECS / "quadruped.yaml"), np.random.default_rng(3))
    drawn = []
    for episode in range(20):
        steps.start_episode(float(episode))
        drawn.append(steps.commands["base_velocity"])
    drawn = np.array(drawn)
    assert np.all((drawn[:, 0] >= -0.2) & (drawn[:, 0] <= 0.4)) and np.all(drawn[:, 1] == 0)
    assert np.all(np.abs(drawn[:, 2]) <= 0.5) and np.ptp(drawn[:, 0]) > 0.2


def test_a_target_read_from_its_topic_enters_the_observation():
    steps = RobotSteps(load_spec(SPECS / "reacher.yaml"), np.random.default_rng(0))
    names = ("elbow", "shoulder")
    steps.on_sample("joints", JointStateSample(names, np.array([0.3, -0.2]), np.zeros(2),
                                               np.zeros(2), 1.0), 1.0)
    steps.on_sample("fingertip", PoseSample(np.array([0.2, 0.0, 0.01]),
                                            np.array([0, 0, 0, 1.0]), 1.0), 1.0)
    steps.on_sample("target", PoseSample(np.array([0.1, 0.05, 0.01]),
                                         np.array([0, 0, 0, 1.0]), 1.0), 1.0)
    event = steps.tick(1.0)
    # shoulder, elbow; velocities; (target - fingertip) x 10; last action.
    np.testing.assert_allclose(event.obs, [[-0.2, 0.3, 0, 0, -1.0, 0.5, 0.0, 0, 0]], atol=1e-6)
    # The deploy node builds the same vector from the same spec and samples.
    deployed = ObservationBuilder(steps.spec).build(steps.newest, np.zeros(2))
    np.testing.assert_array_equal(deployed, event.obs[0])
    steps.action_sent(event.obs, np.array([[1.0, 0.0]]), 0, 1.0)
    steps.on_sample("joints", JointStateSample(names, np.array([0.3, -0.2]), np.zeros(2),
                                               np.zeros(2), 1.02), 1.02)
    for source in ("fingertip", "target"):
        steps.on_sample(source, PoseSample(np.array([0.1, 0.05, 0.01]),
                                           np.array([0, 0, 0, 1.0]), 1.02), 1.02)
    step = steps.tick(1.02)
    # site_distance 0 (x -5), action_l2 1.0 x -0.05, each x dt.
    assert steps.reward_shares == pytest.approx([0.0, -0.05 * 0.02])
    assert step.reward[0] == pytest.approx(-0.001) and steps.fired == []


def robot_samples(world, spec) -> dict:
    """The MuJoCo world's samples as the ROS side will decode its messages."""
    t = world.time
    samples = {"joints": replace(world.joint_state(0), stamp=t)}
    for source in spec.sources:
        if source.type == "pose_stamped":
            site = world.site_pose(0, source.topic.removesuffix("/pose"))
            samples[source.name] = replace(site, stamp=t)
        elif source.type == "imu":
            samples[source.name] = replace(world.imu(0), stamp=t)
        elif source.type == "odometry":
            samples[source.name] = replace(world.odometry(0), child_frame_id="base_link",
                                           stamp=t)
    return samples


@pytest.mark.parametrize("name", ["cartpole", "reacher", "quadruped"])
def test_a_short_run_against_the_mujoco_robot(name):
    from test_robot_spec import mujoco_world
    world, _config = mujoco_world(name)
    spec = load_spec(SPECS / f"{name}.yaml")
    steps, commands = RobotSteps(spec, np.random.default_rng(0)), JointCommands(spec)
    rng = np.random.default_rng(1)
    transitions = []
    while len(transitions) < 20:
        for source, sample in robot_samples(world, spec).items():
            steps.on_sample(source, sample, world.time)
        event = steps.tick(world.time)
        assert event is not None, steps.stale
        if isinstance(event, Transition):
            transitions.append(event)
            assert event.next_obs.shape == (1, steps.observation.dim)
        if steps.needs_reset:
            world.reset(0)
            steps.start_episode(world.time)
            continue
        obs = event.obs if isinstance(event, SegmentStart) else event.next_obs
        action = rng.uniform(-1.0, 1.0, commands.dim)
        steps.action_sent(obs, action[None, :], 0, world.time)
        world.set_command(0, commands(action))
        next_tick = world.time + spec.dt
        while world.time < next_tick - 1e-9:
            world.step()
    assert all(np.all(np.isfinite(t.next_obs)) and np.isfinite(t.reward[0])
               for t in transitions)
    assert steps.counters["stale_ticks"] == 0
