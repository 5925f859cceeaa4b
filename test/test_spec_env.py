"""A robot spec's task in process (sims.spec_env): the trainer's RobotSteps on MujocoWorld."""

import gymnasium as gym
import numpy as np
import pytest
import yaml

from unilab_ros.config.paths import config_file
from unilab_ros.sims.spec_env import RobotSpecEnv, robot_config


def test_the_cartpole_env_has_the_specs_sizes_and_action_mapping():
    env = gym.make("unilab_ros.sims.spec_env:UnilabRobot-cartpole-v0")
    inner: RobotSpecEnv = env.unwrapped
    # Slider and hinge positions and velocities; one force, in policy units: the spec's
    # scale 10 maps +-2 to its +-20 N limit.
    assert env.observation_space.shape == (4,)
    np.testing.assert_allclose(env.action_space.low, [-2.0])
    np.testing.assert_allclose(env.action_space.high, [2.0])
    obs, _ = env.reset(seed=3)
    world = inner._world
    state = world.joint_state(0)
    # joint_pos_rel (default pose 0) then joint_vel x 0.2, in the spec's joint order.
    order = [state.names.index(name) for name in ("slider", "hinge")]
    np.testing.assert_allclose(obs, np.concatenate([state.position[order],
                                                    0.2 * state.velocity[order]]), atol=1e-6)
    env.step(np.array([0.5], np.float32))
    np.testing.assert_allclose(world.held_command(0), [5.0])
    env.step(np.array([2.0], np.float32))
    np.testing.assert_allclose(world.held_command(0), [20.0])
    env.close()


def test_a_failure_is_terminated_and_the_episode_length_truncates(tmp_path):
    env = gym.make("unilab_ros.sims.spec_env:UnilabRobot-cartpole-v0")
    env.reset(seed=0)
    # Full force one way: the cart reaches the end of its rail or the pole tips over.
    steps, terminated, truncated = 0, False, False
    while not (terminated or truncated) and steps < 1000:
        _, _, terminated, truncated, info = env.step(np.array([2.0], np.float32))
        steps += 1
    assert terminated and not truncated and steps < 200
    assert info["fired"] == ["joint_pos_out_of_bounds"]
    assert info["reward_terms"]["termination"] == pytest.approx(-50.0 * 0.02)
    # Each weighted term's own value (share / (weight x dt)), as the deploy node reports.
    values = info["term_values"]
    assert values["0:alive"] == 0.0 and values["1:termination"] == 1.0  # a failure step
    slider = env.unwrapped._world.joint_state(0)
    speed = slider.velocity[slider.names.index("slider")]
    assert values["2:joint_vel_l2"] == pytest.approx(speed**2, rel=1e-4)
    spec = yaml.safe_load(config_file("robot_specs/cartpole.yaml").read_text())
    spec["terminations"] = [{"kind": "episode_length", "max_steps": 7}]
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(spec))
    short = RobotSpecEnv(spec=str(path), robot_params=str(config_file("robots/cartpole.yaml")))
    short.reset(seed=0)
    flags = [short.step(np.zeros(1, np.float32))[2:4] for _ in range(7)]
    assert flags == [(False, False)] * 6 + [(False, True)]


def test_same_seed_same_episode_and_every_shipped_robot_builds():
    def rollout(env: gym.Env) -> np.ndarray:
        obs, _ = env.reset(seed=5)
        rows = [obs]
        for _ in range(20):
            rows.append(env.step(np.full(env.action_space.shape, 0.3, np.float32))[0])
        return np.array(rows)

    first = rollout(gym.make("unilab_ros.sims.spec_env:UnilabRobot-reacher-v0"))
    second = rollout(gym.make("unilab_ros.sims.spec_env:UnilabRobot-reacher-v0"))
    np.testing.assert_array_equal(first, second)
    quadruped = gym.make("unilab_ros.sims.spec_env:UnilabRobot-quadruped-v0")
    obs, _ = quadruped.reset(seed=0)
    assert obs.shape == quadruped.observation_space.shape and np.all(np.isfinite(obs))


def test_a_source_the_world_cannot_produce_is_named(tmp_path):
    spec = yaml.safe_load(config_file("robot_specs/cartpole.yaml").read_text())
    spec["sources"].append({"name": "imu", "topic": "imu", "type": "imu", "max_age": 0.1})
    path = tmp_path / "with_imu.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ValueError, match="source type 'imu' on 'imu' has no counterpart"):
        RobotSpecEnv(spec=str(path), robot_params=str(config_file("robots/cartpole.yaml")))


def test_the_robot_params_file_is_read_as_the_node_reads_it(tmp_path):
    world, robot = robot_config(config_file("robots/reacher.yaml"))
    assert world.model == "reacher.xml" and world.update_rate == 100.0
    assert robot.site_poses.sites == ["fingertip", "target"]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"/**/mujoco_robot": {"ros__parameters": {"modle": "x"}}}))
    with pytest.raises(ValueError, match=r"unknown parameters \['modle'\]"):
        robot_config(path)
