"""Every shipped YAML key is a declared parameter of its node, with the declared type.

The expected names and types come from the config dataclasses, which are what the nodes
declare (see params.py); no node is started. ROS parameters are statically typed, so a
float written `1` or a list of the wrong element type would make the node refuse to start.
"""

import dataclasses
import typing
from pathlib import Path

import pytest
import yaml

from unilab_ros.deploy.policy_node import PolicyNodeConfig
from unilab_ros.loop.action_safety import ActionSafetyConfig
from unilab_ros.loop.config import LoopConfig
from unilab_ros.loop.watchdog import WatchdogConfig
from unilab_ros.rl.actions import ActionConfig, ActionMapper
from unilab_ros.rl.agent import AgentConfig
from unilab_ros.rl.model import ModelConfig
from unilab_ros.rl.ppo_config import PPOConfig
from unilab_ros.rl.ppo_runtime import PPORuntimeConfig
from unilab_ros.rl.sac_config import SACConfig
from unilab_ros.ros.action_output import ActionOutputConfig
from unilab_ros.sims.gym_env_node import GymEnvParams
from unilab_ros.trainer.config import TrainerNodeConfig

CONFIG_DIR = Path(__file__).resolve().parents[1] / "config"
YAML_FILES = sorted(CONFIG_DIR.glob("*.yaml")) + sorted(
    (CONFIG_DIR / "robot_train").glob("*.yaml"))

NODE_CONFIGS: dict[str, list[tuple[str, type]]] = {
    "unilab_trainer": [
        ("", AgentConfig),
        ("", ActionConfig),
        ("", LoopConfig),
        ("", WatchdogConfig),
        ("", ActionOutputConfig),
        ("", TrainerNodeConfig),
        ("model.", ModelConfig),
        ("ppo.", PPOConfig),
        ("ppo.", PPORuntimeConfig),
        ("sac.", SACConfig),
    ],
    "unilab_policy": [
        ("", PolicyNodeConfig),
        ("", WatchdogConfig),
        ("", ActionOutputConfig),
        ("", ActionConfig),
        ("", ActionSafetyConfig),
    ],
    "gym_env": [("", GymEnvParams)],
}
BUILT_IN = {"use_sim_time": bool}
"""Declared by every rclpy node."""


def declared(node: str) -> dict[str, typing.Any]:
    """Parameter name -> annotated type, as declare_config / the gym node declare them."""
    types = dict(BUILT_IN)
    for prefix, cls in NODE_CONFIGS[node]:
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            name = prefix + field.name
            assert name not in types, f"{name} declared twice for {node}"
            types[name] = hints[field.name]
    return types


def flatten(params: dict, prefix: str = "") -> dict[str, typing.Any]:
    """Nested YAML maps are dotted parameter names, as ROS reads them."""
    flat = {}
    for key, value in params.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def sections() -> list:
    return [
        pytest.param(path.name, key, body, id=f"{path.name}:{key.rsplit('/', 1)[-1]}")
        for path in YAML_FILES
        for key, body in yaml.safe_load(path.read_text()).items()
    ]


def type_problem(value: typing.Any, expected: typing.Any) -> str | None:
    """Why ``value`` (as YAML parsed it) cannot set a parameter of type ``expected``."""
    if typing.get_origin(expected) is list:
        (element,) = typing.get_args(expected)
        if not isinstance(value, list):
            return f"needs a list of {element.__name__}, got {value!r}"
        if not value:
            return "an empty list has no ROS parameter type"
        if not all(type(item) is element for item in value):
            return f"needs every element a {element.__name__}, got {value!r}"
        return None
    # type(), not isinstance: a bool is an int to Python, not to ROS; PyYAML reads a
    # number without a decimal point as an int, which a float parameter refuses.
    if type(value) is not expected:
        return f"needs a {expected.__name__}, got {type(value).__name__} {value!r}"
    return None


def test_there_are_config_files():
    assert {path.name for path in YAML_FILES} >= {"pendulum.yaml", "trainer.yaml", "deploy.yaml"}


@pytest.mark.parametrize(("file", "key", "body"), sections())
def test_every_key_is_a_declared_parameter_of_its_type(file, key, body):
    node = key.rsplit("/", 1)[-1]
    assert node in NODE_CONFIGS, f"{file}: section {key!r} names no node of this package"
    assert list(body) == ["ros__parameters"], f"{file}: {key} needs one ros__parameters block"
    types = declared(node)
    problems = []
    for name, value in flatten(body["ros__parameters"]).items():
        if name not in types:
            problems.append(f"{name}: not a parameter of {node}")
        elif (problem := type_problem(value, types[name])) is not None:
            problems.append(f"{name}: {problem}")
    assert not problems, f"{file} [{key}]: " + "; ".join(problems)


@pytest.mark.parametrize(("file", "key", "body"), sections())
def test_the_values_pass_the_nodes_validation(file, key, body):
    node = key.rsplit("/", 1)[-1]
    values = flatten(body["ros__parameters"])
    configs = {}
    for prefix, cls in NODE_CONFIGS[node]:
        fields = {f.name for f in dataclasses.fields(cls)}
        mine = {
            name[len(prefix) :]: value
            for name, value in values.items()
            if name.startswith(prefix) and name[len(prefix) :] in fields
        }
        configs[cls] = cls(**mine)
    if PolicyNodeConfig in configs:
        # deploy.launch.py fills in the checkpoint; the rest must already be valid.
        configs[PolicyNodeConfig].checkpoint = "set by the launch file"
    for config in configs.values():
        for method in ("validate", "check"):
            if hasattr(config, method):
                getattr(config, method)()
    if AgentConfig in configs:
        agent = configs[AgentConfig]
        ActionMapper(configs[ActionConfig], agent.num_envs, agent.action_dim)


def test_the_checker_catches_the_classic_mistakes():
    assert type_problem(1, float) is not None, "an int for a float"
    assert type_problem(True, int) is not None, "a bool for an int"
    assert type_problem([1, 2], list[float]) is not None, "ints in a float list"
    assert type_problem([], list[int]) is not None, "an empty list"
    assert type_problem(1.0, float) is None and type_problem([64, 64], list[int]) is None
    assert "learning_rate" not in declared("unilab_trainer"), "PPO fields are under ppo."
    assert "ppo.learning_rate" in declared("unilab_trainer")
