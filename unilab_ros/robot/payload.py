"""The robot spec as a policy carries it: in training checkpoints, bundles and the ONNX
model's metadata (JSON-ready, ROS-free).

``{"spec": <spec_to_dict>, "observation": <ObservationBuilder.metadata>}``: the spec to
rebuild the observation with the same code, and the vector's layout (each term's slice,
joints, clip, scale and history) for a runtime in another language. An empty payload is a
policy of the topic contract.
"""

from __future__ import annotations

from typing import Any

from unilab_ros.robot.observation import ObservationBuilder
from unilab_ros.robot.spec import SpecError, spec_from_dict, spec_to_dict
from unilab_ros.robot.spec_types import RobotSpec


def robot_payload(spec: RobotSpec | None) -> dict[str, Any]:
    """What a policy trained on ``spec`` carries (empty for none)."""
    if spec is None:
        return {}
    return {"spec": spec_to_dict(spec), "observation": ObservationBuilder(spec).metadata()}


def spec_of(payload: dict[str, Any], obs_dim: int, action_dim: int) -> RobotSpec | None:
    """The spec a policy carries (None: the topic contract), checked against the policy's
    sizes; raises SpecError when it is malformed or does not fit."""
    if not payload:
        return None
    if "spec" not in payload:
        raise SpecError("the policy's robot entry has no spec")
    spec = spec_from_dict(payload["spec"])
    sizes = (ObservationBuilder(spec).dim, len(spec.actions.joints))
    if sizes != (obs_dim, action_dim):
        raise SpecError(f"robot spec {spec.name!r} makes obs {sizes[0]} -> action {sizes[1]}, "
                        f"the policy is {obs_dim} -> {action_dim}")
    return spec
