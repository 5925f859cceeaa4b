"""The robot spec: each error names its field path, the spec survives a trip through JSON,
and the shipped specs load and fit the shipped MuJoCo robots."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from unilab_ros.robot.spec import SpecError, load_spec, spec_from_dict, spec_to_dict

REPO = Path(__file__).resolve().parents[1]
SPECS = REPO / "config" / "robot_specs"
SHIPPED = ("cartpole", "reacher", "quadruped")


def raw(name: str) -> dict:
    return yaml.safe_load((SPECS / f"{name}.yaml").read_text())


def _set(data: dict, path: list, value) -> dict:
    data = copy.deepcopy(data)
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    elif isinstance(target, list) and path[-1] == len(target):
        target.append(value)
    else:
        target[path[-1]] = value
    return data


_DELETE = object()

# (spec, field path as keys, new value, the message's start)
ERRORS = [
    ("cartpole", ["observation", 1, "joints", 1], 5,
     "observation[1].joints[1]: must be a non-empty string, got 5"),
    ("cartpole", ["observation", 0, "joints", 1], "pole",
     "observation[0].joints[1]: 'pole' has no default_pose entry"),
    ("cartpole", ["observation", 0, "joints", 1], "slider",
     "observation[0].joints[1]: 'slider' appears twice"),
    ("cartpole", ["sources", 0, "type"], "laser", "sources[0].type: 'laser' is not one of"),
    ("cartpole", ["sources", 0, "max_age"], 0.0, "sources[0].max_age: must be > 0, got 0.0"),
    ("cartpole", ["sources", 0, "topic"], _DELETE, "sources[0].topic: missing"),
    ("cartpole", ["observation", 0, "source"], "nope",
     "observation[0].source: no source named 'nope' (sources: ['joints'])"),
    ("cartpole", ["observation", 0, "kind"], "joint_position",
     "observation[0].kind: 'joint_position' is not one of"),
    ("cartpole", ["observation", 0, "scale"], [1.0, 2.0, 3.0],
     "observation[0].scale: needs 1 or 2 values, got 3"),
    ("cartpole", ["observation", 1, "clip"], [1.0, -1.0],
     "observation[1].clip: low 1.0 exceeds high -1.0"),
    ("cartpole", ["observation", 0, "history"], 0,
     "observation[0].history: must be a whole number >= 1, got 0"),
    ("cartpole", ["observation", 0, "extra"], 1, "observation[0].extra: unknown field"),
    ("cartpole", ["observation"], [], "observation: must be a non-empty list"),
    ("cartpole", ["rewards", 0, "weight"], _DELETE, "rewards[0].weight: missing"),
    ("cartpole", ["rewards", 0, "source"], "joints", "rewards[0].source: alive reads no source"),
    ("cartpole", ["terminations", 0, "max_steps"], 0,
     "terminations[0].max_steps: must be a whole number >= 1, got 0"),
    ("cartpole", ["terminations", 1, "low"], [1.0, 2.0, 3.0],
     "terminations[1].low: needs 1 or 2 values, got 3"),
    ("cartpole", ["terminations", 1, "time_out"], "yes",
     "terminations[1].time_out: must be true or false"),
    ("cartpole", ["actions", "interface"], "torque", "actions.interface: 'torque' is not one of"),
    ("cartpole", ["actions", "output"], "twist", "actions.output: 'twist' is not one of"),
    ("cartpole", ["actions", "low"], 30.0, "actions.low: exceeds high"),
    ("cartpole", ["actions", "safe"], [25.0],
     "actions.safe: 25.0 lies outside the limits [-20.0, 20.0]"),
    # Issue 41: a scale of 0 was accepted (the joint never moves, whatever the policy).
    ("cartpole", ["actions", "scale"], 0.0, "actions.scale[0]: must not be 0"),
    ("quadruped", ["actions", "scale"], [0.25] * 7 + [0.0], "actions.scale[7]: must not be 0"),
    ("cartpole", ["actions", "guard"], {"action_smoothing": 1.5},
     "actions.guard: action_smoothing must be in [0, 1)"),
    ("cartpole", ["actions", "guard"], {"max_action_change": [1.0, 2.0]},
     "actions.guard.max_action_change: needs 1 value, got 2"),
    ("cartpole", ["control_rate"], -1.0, "control_rate: must be > 0, got -1.0"),
    ("cartpole", ["reset", "mode"], "manual", "reset.mode: 'manual' is not one of"),
    ("cartpole", ["commands"], [{"name": "v", "ranges": [[1.0, 0.0]]}],
     "commands[0].ranges[0]: low 1.0 exceeds high 0.0"),
    ("cartpole", ["observation", 1], {"kind": "command", "command": "x"},
     "observation[1].command: no command named 'x' (commands: [])"),
    ("cartpole", ["sources", 1], {"name": "joints", "topic": "j", "type": "imu", "max_age": 1.0},
     "sources[1]: 'joints' appears twice"),
    ("reacher", ["rewards", 0, "site"], "joints",
     "rewards[0].site: source 'joints' is a joint_state; this needs one of"),
    ("reacher", ["commands", 0, "fields", 0], "position.w",
     "commands[0].fields[0]: 'position' has no w"),
    ("reacher", ["commands", 0, "fields"], ["position.x"],
     "observation[2].command: command 'target' has 1 values; a target position needs 3"),
    ("reacher", ["observation", 3, "source"], "joints",
     "observation[3].source: last_action reads no source"),
    ("quadruped", ["rewards", 0, "command_indices"], [0],
     "rewards[0].command_indices: 1 indices for 2 fields"),
    ("quadruped", ["rewards", 1, "fields", 0], "angular.z",
     "rewards[1].fields[0]: ImuSample has no field 'angular'"),
    ("quadruped", ["observation", 0, "source"], "imu",
     "observation[0].source: source 'imu' is a imu; this needs one of"),
    ("quadruped", ["default_pose", "rear_right_knee"], _DELETE,
     "actions.joints[7]: 'rear_right_knee' has no default_pose entry"),
]


@pytest.mark.parametrize(("name", "path", "value", "message"), ERRORS,
                         ids=[e[3].split(":")[0] for e in ERRORS])
def test_each_error_names_its_field(name, path, value, message):
    with pytest.raises(SpecError) as error:
        spec_from_dict(_set(raw(name), path, value))
    assert str(error.value).startswith(message), str(error.value)


def test_a_spec_that_is_no_mapping_and_a_missing_file_are_errors(tmp_path):
    with pytest.raises(SpecError, match="the spec: must be a mapping, got list"):
        spec_from_dict([1, 2])
    with pytest.raises(SpecError, match="nothing.yaml"):
        load_spec(tmp_path / "nothing.yaml")


def test_kind_defaults_fill_in_time_out_and_params():
    spec = load_spec(SPECS / "cartpole.yaml")
    assert [t.time_out for t in spec.terminations] == [True, False]
    reacher = raw("reacher")
    reacher["observation"][2].pop("relative_to")
    assert spec_from_dict(reacher).observation[2].params["relative_to"] == ""


@pytest.mark.parametrize("name", SHIPPED)
def test_the_spec_survives_a_trip_through_json(name):
    spec = load_spec(SPECS / f"{name}.yaml")
    data = json.loads(json.dumps(spec_to_dict(spec)))
    assert spec_from_dict(data) == spec
    # The dict is what a bundle carries: params sit at their term's level, as in YAML.
    for term, written in zip(spec.observation, data["observation"], strict=True):
        assert {k: written[k] for k in term.params} == term.params


# The MuJoCo side of each shipped spec: robot file sections the world needs.
def mujoco_world(name: str):
    from unilab_ros.sims.mujoco_config import (
        CommandConfig,
        ImuConfig,
        OdomConfig,
        RobotConfig,
        SitePosesConfig,
    )
    from unilab_ros.sims.mujoco_world import MujocoWorld, model_path
    params = yaml.safe_load((REPO / "config" / "robots" / f"{name}.yaml").read_text())
    params = params["/**/mujoco_robot"]["ros__parameters"]
    config = RobotConfig(command=CommandConfig(**params["command"]),
                         imu=ImuConfig(**params.get("imu", {})),
                         odom=OdomConfig(**params.get("odom", {})),
                         site_poses=SitePosesConfig(**params.get("site_poses", {})))
    return MujocoWorld(model_path(params["model"]), 1, config, params["update_rate"]), config


@pytest.mark.parametrize("name", SHIPPED)
def test_the_shipped_spec_fits_its_mujoco_robot(name):
    spec = load_spec(SPECS / f"{name}.yaml")
    world, config = mujoco_world(name)
    published = set(world.joint_state(0).names)
    named = set(spec.actions.joints) | set(spec.default_pose)
    for term in (*spec.observation, *spec.rewards, *spec.terminations):
        named |= set(term.params.get("joints", ()))
    assert named <= published, named - published
    assert spec.actions.joints == world.command_joints
    assert spec.actions.interface == config.command.interface
    assert spec.actions.topic == f"{config.command.controller}/commands"
    topics = {"joint_states"} | {f"{site}/pose" for site in config.site_poses.sites}
    topics |= {"imu"} if config.imu.site else set()
    topics |= {"odom"} if config.odom.body else set()
    assert {s.topic for s in spec.sources} <= topics
    # Position actions of 0 command the default pose, which must lie inside the joint ranges.
    if spec.actions.interface == "position":
        ids = [world.model.joint(j).id for j in spec.actions.joints]
        low, high = world.model.jnt_range[ids].T
        pose = np.array([spec.default_pose[j] for j in spec.actions.joints])
        assert np.all((low <= pose) & (pose <= high))


def test_the_specs_documentation_names_every_kind():
    from unilab_ros.robot.observation_terms import OBSERVATIONS
    from unilab_ros.robot.reward_terms import REWARDS
    from unilab_ros.robot.termination_terms import TERMINATIONS
    text = (REPO / "docs" / "robot_specs.md").read_text()
    kinds = [*OBSERVATIONS, *TERMINATIONS,
             *(k for k in REWARDS if not k.endswith(("_l2", "_l1"))),
             *{k.rsplit("_", 1)[0] for k in REWARDS if k.endswith(("_l2", "_l1"))}]
    missing = [kind for kind in kinds if f"`{kind}`" not in text]
    assert not missing, missing
