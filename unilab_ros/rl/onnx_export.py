"""ONNX export of a bundle's deterministic actor, for C++ deployers (rl_sar, ONNX Runtime).

The graph takes raw observations and returns the commands a robot receives, so a runtime
needs nothing but the file: normalization, the MLP and the action mapping are in it::

    observation  float32 [batch, obs_dim]
      -> clip((observation - mean) / sqrt(var + epsilon), -clip, clip)   (when enabled)
      -> Gemm, activation, ... Gemm                                      (the actor)
      -> min(max(action_scale * x, action_low), action_high)
      -> min(max(offset + scale * x, low), high)     (a robot spec: its joint commands)
    action       float32 [batch, action_dim]

A robot spec's policy (``bundle.robot``) acts in policy units (scale 1, the joint limits
over the spec's scale); the last stage is the spec's ``actions`` mapping, as
``robot.actions.JointCommands`` applies it (read here from the spec's JSON: the core
imports nothing of the robot layer; a test holds the two together): offset is the default
pose for a position interface, 0 for velocity and effort. What no stateless graph can do
is stated in the metadata (``action_output``, ``runtime_must_apply``, ``safe_command``,
``command_guard``): the spec's rate limit, smoothing and blend-in, and the safe command.

Built with ``onnx.helper`` from the bundle's arrays, at opset 17 (IR version 8), which
ONNX Runtime releases from 1.13 on load. Activations without an ONNX op of the same
definition as MLX's are composed from elementary ops (GELU from Erf, SiLU from Sigmoid).
Needs ``onnx`` (requirements-deploy.txt); running the graph needs ``onnxruntime``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from unilab_ros.rl.actions import ActionMapper
from unilab_ros.rl.bundle import BundleError, PolicyBundle
from unilab_ros.rl.files import write_atomically

OPSET = 17
IR_VERSION = 8
INPUT_NAME = "observation"
OUTPUT_NAME = "action"
BATCH = "batch"

# MLX's constants (mlx.nn.selu, mlx.nn.leaky_relu's default), not ONNX's defaults.
_SELU_ALPHA, _SELU_GAMMA = 1.67326, 1.0507
_LEAKY_SLOPE = 0.01


class _Graph:
    """Accumulates nodes and constants; names are made unique by a counter."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.constants: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, stem: str) -> str:
        self._count += 1
        return f"{stem}_{self._count}"

    def constant(self, stem: str, value: np.ndarray) -> str:
        name = self.name(stem)
        self.constants.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def op(self, op_type: str, inputs: list[str], output: str | None = None, **attrs) -> str:
        output = output or self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [output], **attrs))
        return output


def _unary(op_type: str, **attrs) -> Callable[[_Graph, str], str]:
    return lambda graph, x: graph.op(op_type, [x], **attrs)


def _gelu(graph: _Graph, x: str) -> str:
    # x * (1 + erf(x / sqrt(2))) / 2, as mlx.nn.gelu (the exact, not the tanh, GELU).
    scaled = graph.op("Mul", [x, graph.constant("inv_sqrt2", np.float32(1.0 / math.sqrt(2.0)))])
    one_plus = graph.op("Add", [graph.op("Erf", [scaled]), graph.constant("one", np.float32(1))])
    half = graph.constant("half", np.float32(0.5))
    return graph.op("Mul", [graph.op("Mul", [x, one_plus]), half])


def _silu(graph: _Graph, x: str) -> str:
    return graph.op("Mul", [x, graph.op("Sigmoid", [x])])


ACTIVATIONS: dict[str, Callable[[_Graph, str], str]] = {
    "elu": _unary("Elu", alpha=1.0),
    "relu": _unary("Relu"),
    "tanh": _unary("Tanh"),
    "selu": _unary("Selu", alpha=_SELU_ALPHA, gamma=_SELU_GAMMA),
    "gelu": _gelu,
    "silu": _silu,
    "leaky_relu": _unary("LeakyRelu", alpha=_LEAKY_SLOPE),
    # ONNX Runtime's Softplus is the overflow-safe log(1 + exp(x)), as mlx.nn.softplus.
    "softplus": _unary("Softplus"),
}
"""One builder per activation of ``unilab_ros.rl.activations.ACTIVATIONS``."""


def actor_graph(bundle: PolicyBundle) -> onnx.ModelProto:
    """The ONNX model of ``bundle``'s deterministic actor with its action mapping."""
    if bundle.actions is None:
        raise BundleError("the ONNX graph needs the action mapping, which the source lacks")
    cfg = bundle.model_cfg
    if cfg.activation not in ACTIVATIONS:
        raise BundleError(f"activation '{cfg.activation}' has no ONNX form here")
    model = bundle.model()
    graph = _Graph()
    x = INPUT_NAME
    if cfg.normalize_observations:
        normalizer = model.normalizer
        mean = np.array(normalizer.mean, np.float32)
        # The reciprocal as MLX's rsqrt gives it, in float32: the graph multiplies by it.
        inv_std = 1.0 / np.sqrt(np.array(normalizer.var, np.float32) + np.float32(
            normalizer.epsilon))
        x = graph.op("Sub", [x, graph.constant("obs_mean", mean)])
        x = graph.op("Mul", [x, graph.constant("obs_inv_std", inv_std)])
        clip = np.float32(normalizer.clip)
        x = graph.op("Clip", [x, graph.constant("obs_clip_low", -clip),
                              graph.constant("obs_clip_high", clip)])
    activation = ACTIVATIONS[cfg.activation]
    layers = model.actor.layers
    for index, layer in enumerate(layers):
        weight = graph.constant(f"actor_{index}_weight", np.array(layer.weight, np.float32))
        bias = graph.constant(f"actor_{index}_bias", np.array(layer.bias, np.float32))
        # MLX stores weights as (out, in): Gemm computes x @ weight.T + bias.
        x = graph.op("Gemm", [x, weight, bias], transB=1)
        if index < len(layers) - 1:
            x = activation(graph, x)
    if cfg.squash_output:
        x = graph.op("Tanh", [x])
        x = graph.op("Mul", [x, graph.constant("squash_scale", np.array(model.squash_scale,
                                                                        np.float32))])
        x = graph.op("Add", [x, graph.constant("squash_center", np.array(model.squash_center,
                                                                         np.float32))])
    mapper = ActionMapper(bundle.actions, 1, bundle.action_dim)
    x = graph.op("Mul", [x, graph.constant("action_scale", mapper.scale)])
    x = graph.op("Max", [x, graph.constant("action_low", mapper.low)])
    joints = _joint_commands(bundle)
    if joints is None:
        graph.op("Min", [x, graph.constant("action_high", mapper.high)], output=OUTPUT_NAME)
        safe = mapper.safe[0]
    else:
        x = graph.op("Min", [x, graph.constant("action_high", mapper.high)])
        x = graph.op("Add", [graph.constant("joint_offset", joints.offset),
                             graph.op("Mul", [x, graph.constant("joint_scale", joints.scale)])])
        x = graph.op("Max", [x, graph.constant("joint_low", joints.low)])
        graph.op("Min", [x, graph.constant("joint_high", joints.high)], output=OUTPUT_NAME)
        safe = joints.safe
    onnx_graph = helper.make_graph(
        graph.nodes,
        "unilab_policy",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, [BATCH, bundle.obs_dim])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT,
                                       [BATCH, bundle.action_dim])],
        initializer=graph.constants,
    )
    onnx_model = helper.make_model(
        onnx_graph,
        producer_name="unilab_ros",
        opset_imports=[helper.make_opsetid("", OPSET)],
        doc_string="Deterministic actor: raw observation -> the command to send (scale, "
                   "offset and limits applied).",
    )
    onnx_model.ir_version = IR_VERSION
    labels = {"obs_labels": bundle.obs_labels, "action_labels": bundle.action_labels}
    props = {name: ",".join(value) for name, value in labels.items() if value}
    props.update(_command_props(joints, safe))
    # A robot spec's policy: the spec, and each input slice (term, joints, clip, scale,
    # history), so a C++ runtime can build the observation the training built.
    props.update({f"robot_{name}": json.dumps(value) for name, value in bundle.robot.items()})
    helper.set_model_props(onnx_model, props)
    onnx.checker.check_model(onnx_model, full_check=True)
    return onnx_model


@dataclass
class _JointCommands:
    """A robot spec's action -> joint command mapping, one value per joint."""

    scale: np.ndarray
    offset: np.ndarray
    low: np.ndarray
    high: np.ndarray
    safe: np.ndarray
    guard: dict
    """The spec's guard with its rate limit in command units (x |scale|)."""


def _joint_commands(bundle: PolicyBundle) -> _JointCommands | None:
    """The joint command stage of a robot spec's policy (None: the topic contract, whose
    action mapping already gives the command)."""
    spec = bundle.robot.get("spec")
    if not spec:
        return None
    actions, n = spec["actions"], bundle.action_dim

    def per_joint(values: list[float]) -> np.ndarray:
        return np.broadcast_to(np.asarray(values, np.float64), (n,)).copy()

    scale = per_joint(actions["scale"])
    offset = (np.array([spec["default_pose"][joint] for joint in actions["joints"]],
                       np.float64) if actions["interface"] == "position" else np.zeros(n))
    # A spec written before specs had a guard has none: no limit.
    guard = {"max_action_change": [0.0], "action_smoothing": 0.0, "blend_in_steps": 0,
             **actions.get("guard", {})}
    guard["max_action_change"] = (per_joint(guard["max_action_change"])
                                  * np.abs(scale)).tolist()
    return _JointCommands(scale, offset, per_joint(actions["low"]), per_joint(actions["high"]),
                          per_joint(actions["safe"]) if actions.get("safe") else offset.copy(),
                          guard)


def _command_props(joints: _JointCommands | None, safe: np.ndarray) -> dict[str, str]:
    """What the output is and what a runtime must add, for the model's metadata."""
    props = {
        "action_output": "command: the values to send, scale, offset and limits applied"
                         + (" (the robot spec's joint commands, in robot_spec.actions.joints "
                            "order)" if joints else ""),
        "safe_command": json.dumps(np.asarray(safe, np.float64).tolist()),
    }
    if joints is None:
        props["runtime_must_apply"] = (
            "safe_command whenever the policy must not act (e-stop, stale or missing "
            "observations, a non-finite output)")
    else:
        props["command_guard"] = json.dumps(joints.guard)
        props["runtime_must_apply"] = (
            "command_guard between consecutive commands (max_action_change in command "
            "units, 0: none; action_smoothing; blend_in_steps from safe_command after a "
            "start or a hold), and safe_command whenever the policy must not act (e-stop, "
            "stale data, joints that do not match, a non-finite output)")
    return props


def save_onnx(path: str | os.PathLike[str], bundle: PolicyBundle) -> Path:
    """Write the actor graph of ``bundle`` to ``path`` atomically."""
    serialized = actor_graph(bundle).SerializeToString()
    return write_atomically(Path(path), lambda tmp: tmp.write_bytes(serialized))
