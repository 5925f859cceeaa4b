"""A robot spec's guard between policy and command units (``JointCommands``, ROS-free)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from unilab_ros.loop.action_safety import ActionGuard, ActionSafetyConfig
from unilab_ros.robot.joint_commands import JointCommands
from unilab_ros.robot.spec import load_spec

SPECS = Path(__file__).resolve().parents[1] / "config" / "robot_specs"


@pytest.fixture
def joints(tmp_path) -> JointCommands:
    spec = yaml.safe_load((SPECS / "cartpole.yaml").read_text())
    spec["default_pose"]["hinge"] = 0.1
    spec["actions"].update(joints=["slider", "hinge"], interface="position",
                           scale=[10.0, -0.5], low=[-20.0, -1.0], high=[20.0, 1.0])
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return JointCommands(load_spec(path))


def test_a_spec_guard_in_policy_units_is_scale_times_larger_in_command_units(joints):
    guard = ActionSafetyConfig(max_action_change=[0.5], action_smoothing=0.2,
                               blend_in_steps=4)
    command = joints.guard_in_command_units(guard)
    assert command.max_action_change == [5.0, 0.25]
    assert (command.action_smoothing, command.blend_in_steps) == (0.2, 4)
    assert joints.guard_in_policy_units(command).max_action_change == [0.5, 0.5]


def test_a_command_unit_limit_bounds_the_commands_whatever_the_scale(joints):
    """Issue 41: an operator's 0.1 acted in policy units (10 x looser at scale 10)."""
    limit = ActionSafetyConfig(max_action_change=[0.1])
    guard = ActionGuard(joints.guard_in_policy_units(limit), np.zeros((1, 2), np.float32))
    rng = np.random.default_rng(0)
    previous = joints(guard.last)
    for _ in range(300):
        command = joints(guard(rng.uniform(-3.0, 3.0, (1, 2)).astype(np.float32)))
        assert np.abs(command - previous).max() <= 0.1 + 1e-12
        previous = command
