"""ONNX export: the graph computes what the MLX actor and the action mapping compute.

onnx and onnxruntime are pinned in requirements-deploy.txt, which `make setup` installs.
"""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import onnx
import onnxruntime
import pytest

import unilab_ros.rl  # noqa: F401 - loads the optimized BLAS before mlx
from unilab_ros.deploy.export_bundle import main as export_main
from unilab_ros.rl.actions import ActionConfig, ActionMapper
from unilab_ros.rl.activations import ACTIVATIONS as MLX_ACTIVATIONS
from unilab_ros.rl.agent import AgentConfig, PPOAgent
from unilab_ros.rl.bundle import BundleError, bundle_from_agent, read_policy
from unilab_ros.rl.checkpoint import save_checkpoint
from unilab_ros.rl.model import ModelConfig
from unilab_ros.rl.onnx_export import ACTIVATIONS, actor_graph, save_onnx
from unilab_ros.robot.joint_commands import JointCommands
from unilab_ros.robot.payload import robot_payload
from unilab_ros.robot.spec import spec_from_dict

OBS_DIM, ACTION_DIM = 6, 3
TOLERANCE = 1e-5
ACTIONS = ActionConfig(action_scale=[2.0, 1.0, 0.5], action_low=[-1.5, -1.0, -0.2],
                       action_high=[1.5, 1.0, 0.3], safe_action=[0.0])


def make_bundle(tmp_path, activation: str, normalize: bool = True):
    agent = PPOAgent(
        AgentConfig(num_envs=1, obs_dim=OBS_DIM, action_dim=ACTION_DIM, seed=4),
        ModelConfig(actor_hidden_dims=[64, 32], critic_hidden_dims=[8], activation=activation,
                    normalize_observations=normalize),
    )
    last = agent.model.actor.layers[-1]
    # The output layer starts at gain 0.01: near-zero means would not reach the limits.
    last.weight = last.weight * 100.0
    agent.model.normalizer.update(
        mx.array(np.random.default_rng(0).normal(3.0, 5.0, (200, OBS_DIM)))
    )
    mx.eval(agent.model.parameters())
    checkpoint = save_checkpoint(tmp_path / activation, agent, actions=ACTIONS)
    return read_policy(checkpoint), agent.model


def run_onnx(model: onnx.ModelProto, obs: np.ndarray) -> np.ndarray:
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    return session.run(["action"], {"observation": obs})[0]


def mlx_actions(model, obs: np.ndarray) -> np.ndarray:
    return ActionMapper(ACTIONS, 1, ACTION_DIM)(np.array(model.policy(mx.array(obs))))


def test_every_model_activation_has_an_onnx_form():
    assert set(ACTIVATIONS) == set(MLX_ACTIVATIONS)


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_onnx_matches_mlx_within_1e_5_on_random_inputs(tmp_path, activation):
    bundle, model = make_bundle(tmp_path, activation)
    rng = np.random.default_rng(1)
    # Wide inputs: the normalizer's clip, both action limits and the interior all occur.
    obs = rng.normal(3.0, 30.0, (512, OBS_DIM)).astype(np.float32)
    expected = mlx_actions(model, obs)
    got = run_onnx(actor_graph(bundle), obs)
    assert got.shape == (512, ACTION_DIM) and got.dtype == np.float32
    error = float(np.max(np.abs(got - expected)))
    print(f"{activation}: max abs error {error:.3g}")
    assert error <= TOLERANCE
    inside = (expected > np.asarray(ACTIONS.action_low)) & (expected < ACTIONS.action_high)
    assert inside.mean() > 0.1 and (~inside).mean() > 0.1, "limits and interior both tested"


def test_without_normalization_the_graph_takes_observations_as_they_are(tmp_path):
    bundle, model = make_bundle(tmp_path, "elu", normalize=False)
    obs = np.random.default_rng(2).normal(0.0, 2.0, (64, OBS_DIM)).astype(np.float32)
    graph = actor_graph(bundle)
    assert "Clip" not in {node.op_type for node in graph.graph.node}
    np.testing.assert_allclose(run_onnx(graph, obs), mlx_actions(model, obs), atol=TOLERANCE)


def test_the_graph_names_its_input_and_output_with_a_free_batch(tmp_path):
    bundle, _ = make_bundle(tmp_path, "elu")
    path = save_onnx(tmp_path / "policy.onnx", bundle)
    graph = onnx.load(str(path))
    onnx.checker.check_model(graph, full_check=True)
    assert graph.opset_import[0].version == 17 and graph.ir_version == 8

    def shape(value_info) -> list:
        return [dim.dim_param or dim.dim_value for dim in value_info.type.tensor_type.shape.dim]

    (inp,), (out,) = graph.graph.input, graph.graph.output
    assert (inp.name, shape(inp)) == ("observation", ["batch", OBS_DIM])
    assert (out.name, shape(out)) == ("action", ["batch", ACTION_DIM])
    single = np.zeros((1, OBS_DIM), np.float32)
    assert run_onnx(graph, single).shape == (1, ACTION_DIM)


def test_the_command_writes_bundle_and_onnx_with_labels(tmp_path, capsys):
    agent = PPOAgent(AgentConfig(num_envs=1, obs_dim=2, action_dim=1),
                     ModelConfig(actor_hidden_dims=[4], critic_hidden_dims=[4]))
    checkpoint = save_checkpoint(tmp_path / "ckpt", agent, actions=ActionConfig())
    export_main([str(checkpoint), str(tmp_path / "policy"), "--onnx",
                 str(tmp_path / "policy.onnx"), "--obs-labels", "x", "v"])
    assert "onnx: " in capsys.readouterr().out
    props = {prop.key: prop.value for prop in onnx.load(str(tmp_path / "policy.onnx"))
             .metadata_props}
    assert props["obs_labels"] == "x,v" and "action_labels" not in props
    # The topic contract's output is the command already; the metadata says so.
    assert props["action_output"].startswith("command:")
    assert json.loads(props["safe_command"]) == [0.0]
    assert "command_guard" not in props


def test_a_source_without_action_mapping_has_no_graph(tmp_path):
    agent = PPOAgent(AgentConfig(num_envs=1, obs_dim=2, action_dim=1),
                     ModelConfig(actor_hidden_dims=[4], critic_hidden_dims=[4]))
    with pytest.raises(BundleError, match="needs the action mapping"):
        actor_graph(read_policy(save_checkpoint(tmp_path / "older", agent)))


def test_a_robot_spec_policy_outputs_the_joint_command():
    """Issue 41: the output was the policy's action (a tenth of the cart-pole's effort at
    scale 10, and no default-pose offset for a position interface)."""
    spec = spec_from_dict({
        "name": "arm", "control_rate": 50.0,
        "sources": [{"name": "joints", "topic": "joint_states", "type": "joint_state",
                     "max_age": 0.1}],
        "default_pose": {"a": 0.3, "b": -0.2, "c": 0.0},
        "observation": [{"kind": "joint_pos_rel", "source": "joints", "joints": ["a", "b", "c"]},
                        {"kind": "joint_vel", "source": "joints", "joints": ["a", "b", "c"]}],
        "rewards": [{"kind": "alive", "weight": 1.0}],
        "terminations": [{"kind": "episode_length", "max_steps": 10}],
        "actions": {"joints": ["a", "b", "c"], "interface": "position", "topic": "cmd",
                    "scale": [0.5, 2.0, 0.25], "low": [-0.4, -1.5, -0.3],
                    "high": [0.8, 0.5, 0.3], "guard": {"max_action_change": [0.1]}},
    })
    joints = JointCommands(spec)
    actions = joints.action_config()
    agent = PPOAgent(AgentConfig(num_envs=1, obs_dim=OBS_DIM, action_dim=ACTION_DIM, seed=4),
                     ModelConfig(actor_hidden_dims=[16], critic_hidden_dims=[8]))
    last = agent.model.actor.layers[-1]
    last.weight = last.weight * 100.0
    mx.eval(agent.model.parameters())
    bundle = bundle_from_agent(agent, actions, "test", robot_payload(spec))
    obs = np.random.default_rng(5).normal(0.0, 3.0, (256, OBS_DIM)).astype(np.float32)
    mapped = ActionMapper(actions, 1, ACTION_DIM)(np.array(agent.model.policy(mx.array(obs))))
    expected = np.stack([joints(row) for row in mapped])
    graph = actor_graph(bundle)
    np.testing.assert_allclose(run_onnx(graph, obs), expected, atol=TOLERANCE)
    inside = (expected > joints.low) & (expected < joints.high)
    assert inside.mean() > 0.1 and (~inside).mean() > 0.1, "limits and interior both tested"
    props = {prop.key: prop.value for prop in graph.metadata_props}
    assert json.loads(props["safe_command"]) == [0.3, -0.2, 0.0]
    # The stateful part a runtime must add, in command units (0.1 policy units x |scale|).
    assert json.loads(props["command_guard"])["max_action_change"] == [0.05, 0.2, 0.025]
    assert "command_guard" in props["runtime_must_apply"]
