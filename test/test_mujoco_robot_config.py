"""The shipped robot files (config/robots/*.yaml) fit the MuJoCo robot node and its models.

Like test_config_files.py (whose checker this reuses) but for the robot node's sections,
and each robot is built: its MJCF model loads and every joint, site and body it names
exists. No node is started.
"""

import dataclasses
import typing
from pathlib import Path

import pytest
import yaml
from test_config_files import flatten, type_problem

from unilab_ros.sims.mujoco_config import ROBOT_SECTIONS, RobotConfig, WorldConfig
from unilab_ros.sims.mujoco_robot_node import NODE_NAME, SECTIONS
from unilab_ros.sims.mujoco_world import MujocoWorld, model_path

ROBOTS_DIR = Path(__file__).resolve().parents[1] / "config" / "robots"
ROBOT_FILES = sorted(ROBOTS_DIR.glob("*.yaml"))


def declared() -> dict[str, typing.Any]:
    types: dict[str, typing.Any] = {"use_sim_time": bool}
    for prefix, cls in [("", WorldConfig)] + [(f"{s}.", c) for s, c in SECTIONS.items()]:
        hints = typing.get_type_hints(cls)
        types.update({prefix + f.name: hints[f.name] for f in dataclasses.fields(cls)})
    return types


def parameters(path: Path) -> dict[str, typing.Any]:
    (key, body), = yaml.safe_load(path.read_text()).items()
    assert key.rsplit("/", 1)[-1] == NODE_NAME and list(body) == ["ros__parameters"]
    return flatten(body["ros__parameters"])


def test_the_three_robots_are_shipped():
    assert [path.stem for path in ROBOT_FILES] == ["cartpole", "quadruped", "reacher"]
    assert set(SECTIONS) == set(ROBOT_SECTIONS)


@pytest.mark.parametrize("path", ROBOT_FILES, ids=lambda path: path.stem)
def test_every_key_is_a_declared_parameter_of_its_type(path):
    types = declared()
    problems = [f"{name}: not a parameter" if name not in types else
                f"{name}: {type_problem(value, types[name])}"
                for name, value in parameters(path).items()
                if name not in types or type_problem(value, types[name]) is not None]
    assert not problems, f"{path.name}: " + "; ".join(problems)


@pytest.mark.parametrize("path", ROBOT_FILES, ids=lambda path: path.stem)
def test_the_robot_builds_from_its_file(path):
    values = parameters(path)
    world = WorldConfig(**{k: v for k, v in values.items() if "." not in k})
    world.validate()
    sections = {section: cls(**{k.split(".", 1)[1]: v for k, v in values.items()
                                if k.startswith(f"{section}.")})
                for section, cls in SECTIONS.items()}
    robot = RobotConfig(**sections)
    robot.check(world.update_rate)
    built = MujocoWorld(model_path(world.model), 2, robot, world.update_rate, world.seed)
    for _ in range(50):
        built.step()
    assert built.joint_state(1).position.shape == (len(built.joint_names),)
    if robot.imu.site:
        assert built.imu(0).linear_acceleration[2] > 5.0, "standing: up is +z"
