"""Config dataclasses <-> ROS parameters on a real rclpy Node with parameter_overrides."""

import dataclasses

import pytest
import rclpy
from rcl_interfaces.msg import ParameterType
from rclpy.parameter import Parameter

from unilab_ros.config.parameter_files import field_docs
from unilab_ros.loop.config import LoopConfig
from unilab_ros.loop.watchdog import WatchdogConfig
from unilab_ros.rl.actions import ActionConfig
from unilab_ros.rl.agent import AgentConfig
from unilab_ros.rl.model import ModelConfig
from unilab_ros.rl.ppo_config import PPOConfig
from unilab_ros.rl.ppo_runtime import PPORuntimeConfig
from unilab_ros.ros.params import (
    ConfigError,
    declare_config,
    read_config,
    unknown_parameters,
)
from unilab_ros.trainer.config import TrainerNodeConfig

pytestmark = pytest.mark.ros


@pytest.fixture
def make_node():
    context = rclpy.Context()
    rclpy.init(context=context)
    nodes = []

    def make(**overrides):
        params = [Parameter(name, value=value) for name, value in overrides.items()]
        nodes.append(
            rclpy.create_node(
                f"params_test_{len(nodes)}", context=context, parameter_overrides=params
            )
        )
        return nodes[-1]

    yield make
    for node in nodes:
        node.destroy_node()
    rclpy.try_shutdown(context=context)


def test_defaults_round_trip_for_every_config(make_node):
    node = make_node()
    configs = [
        (AgentConfig(), ""),
        (ActionConfig(), ""),
        (LoopConfig(), ""),
        (WatchdogConfig(), ""),
        (TrainerNodeConfig(), ""),
        (ModelConfig(), "model"),
        (PPOConfig(), "ppo"),
        # Two configs under one prefix, as the trainer declares them.
        (PPORuntimeConfig(), "ppo"),
    ]
    for config, prefix in configs:
        declare_config(node, config, prefix)
    for config, prefix in configs:
        assert read_config(node, type(config), prefix) == config


def test_overrides_reach_nested_and_list_fields(make_node):
    node = make_node(
        **{
            "num_envs": 7,
            "reward_scale": 0.5,
            "action_scale": [2.0, 0.5],
            "model.actor_hidden_dims": [16, 8],
            "model.activation": "tanh",
            "ppo.learning_rate": 0.01,
            "ppo.schedule": "adaptive",
            "ppo.use_clipped_value_loss": False,
        }
    )
    declare_config(node, AgentConfig())
    declare_config(node, ActionConfig())
    declare_config(node, ModelConfig(), "model")
    declare_config(node, PPOConfig(), "ppo")
    agent = read_config(node, AgentConfig)
    assert (agent.num_envs, agent.reward_scale) == (7, 0.5)
    action = read_config(node, ActionConfig)
    assert action.action_scale == [2.0, 0.5] and type(action.action_scale) is list
    model = read_config(node, ModelConfig, "model")
    assert model.actor_hidden_dims == [16, 8] and type(model.actor_hidden_dims) is list
    assert model.critic_hidden_dims == ModelConfig().critic_hidden_dims
    assert model.activation == "tanh"
    ppo = read_config(node, PPOConfig, "ppo")
    assert ppo.learning_rate == 0.01 and ppo.schedule == "adaptive"
    assert ppo.use_clipped_value_loss is False
    # The prefix keeps names apart: the top-level namespace holds no 'learning_rate'.
    assert not node.has_parameter("learning_rate")
    assert node.has_parameter("ppo.learning_rate")


@pytest.mark.parametrize(
    ("name", "value", "config", "prefix"),
    [
        ("ppo.learning_rate", 1, PPOConfig(), "ppo"),
        ("ppo.max_grad_norm", 1, PPOConfig(), "ppo"),
        ("model.actor_hidden_dims", [4.0, 4.0], ModelConfig(), "model"),
        ("num_envs", "four", AgentConfig(), ""),
    ],
)
def test_a_value_of_the_wrong_type_is_a_one_line_config_error(
    make_node, name, value, config, prefix
):
    node = make_node(**{name: value})
    with pytest.raises(ConfigError) as caught:
        declare_config(node, config, prefix)
    message = str(caught.value)
    assert "\n" not in message
    assert f"'{name}'" in message
    assert "Traceback" not in message


def test_an_int_for_a_float_says_floats_need_a_decimal_point(make_node):
    node = make_node(**{"ppo.learning_rate": 1})
    with pytest.raises(ConfigError, match=r"'ppo\.learning_rate' must be a float.*decimal"):
        declare_config(node, PPOConfig(), "ppo")


def test_a_list_of_the_wrong_element_type_names_the_list_type(make_node):
    node = make_node(**{"model.actor_hidden_dims": [4.0]})
    with pytest.raises(ConfigError, match="must be a list of integers"):
        declare_config(node, ModelConfig(), "model")


@pytest.mark.parametrize(
    ("overrides", "config", "prefix", "match"),
    [
        ({"model.activation": "foo"}, ModelConfig(), "model", "activation 'foo' unknown"),
        ({"num_envs": -1}, AgentConfig(), "", "num_envs must be >= 1"),
        ({"update_trigger": "never"}, LoopConfig(), "", "update_trigger"),
        ({"step_timeout": 0.0}, LoopConfig(), "", "step_timeout"),
        ({"obs_timeout": 0.0}, WatchdogConfig(), "", "obs_timeout"),
    ],
)
def test_validate_failures_become_config_errors(make_node, overrides, config, prefix, match):
    node = make_node(**overrides)
    declare_config(node, config, prefix)
    with pytest.raises(ConfigError, match=match) as caught:
        read_config(node, type(config), prefix)
    assert "\n" not in str(caught.value)


def test_field_docstrings_are_the_parameter_descriptions(make_node):
    node = make_node()
    declare_config(node, PPOConfig(), "ppo")
    declare_config(node, LoopConfig())
    docs = field_docs(PPOConfig)
    assert docs["learning_rate"].startswith("Adam learning rate")
    for field in dataclasses.fields(PPOConfig):
        described = node.describe_parameter(f"ppo.{field.name}")
        assert described.description == f"{docs[field.name]} (read at start)", field.name
        assert docs[field.name], f"ppo.{field.name} has no docstring"
        assert described.read_only
    # Multi-line docstrings become one line.
    step_timeout = node.describe_parameter("step_timeout").description
    assert step_timeout.startswith("Seconds (node clock") and "\n" not in step_timeout


def test_declared_types_follow_the_defaults(make_node):
    node = make_node()
    declare_config(node, ModelConfig(), "model")
    declare_config(node, ActionConfig())
    expected = {
        "model.actor_hidden_dims": ParameterType.PARAMETER_INTEGER_ARRAY,
        "model.activation": ParameterType.PARAMETER_STRING,
        "model.init_noise_std": ParameterType.PARAMETER_DOUBLE,
        "model.normalize_observations": ParameterType.PARAMETER_BOOL,
        "action_scale": ParameterType.PARAMETER_DOUBLE_ARRAY,
    }
    for name, param_type in expected.items():
        assert node.describe_parameter(name).type == param_type, name


def test_live_fields_are_declared_writable_and_say_so(make_node):
    node = make_node()
    declare_config(node, LoopConfig(), live={"training"})
    training = node.describe_parameter("training")
    assert not training.read_only and training.description.endswith("(may be set while running)")
    assert node.describe_parameter("step_timeout").read_only


def test_unknown_parameter_names_are_listed(make_node):
    node = make_node(**{"step_timout": 2.0, "step_timeout": 2.0})
    declare_config(node, LoopConfig())
    assert unknown_parameters(node) == ["step_timout"]
