"""Policy bundles: what a robot needs to run a trained policy, and nothing of the training.

A bundle is one safetensors file: the actor's layers, the observation normalizer's mean
and variance and the policy std (for sampled actions), plus JSON metadata under
``bundle``: sizes and optional labels, the action mapping, the architecture, the
normalization constants and versions. No optimizer, critic, random keys or counters, and
nothing pickled: any safetensors reader (C++, Rust, numpy) gets the arrays and the header
JSON. ``read_policy`` takes a bundle or a training checkpoint, so a deployment serves
either the same way.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from unilab_ros.rl.actions import ActionConfig
from unilab_ros.rl.agent import PPOAgent
from unilab_ros.rl.checkpoint import FORMAT as CHECKPOINT_FORMAT
from unilab_ros.rl.checkpoint import (
    SUFFIX,
    Checkpoint,
    check_stored_arrays,
    package_versions,
)
from unilab_ros.rl.files import write_atomically
from unilab_ros.rl.model import MLPActorCritic, ModelConfig

BUNDLE_FORMAT = "unilab_ros.bundle/1"
NORMALIZER_KEYS = ("normalizer.mean", "normalizer.var")


class BundleError(ValueError):
    """A bundle cannot be written or read: the message says why, in one line."""


@dataclass
class PolicyBundle:
    """A deployable policy: the actor's arrays and what it takes to run them."""

    obs_dim: int
    action_dim: int
    model_cfg: ModelConfig
    """The architecture (activation, layer sizes, std bounds, normalization)."""
    actions: ActionConfig | None
    """How the training mapped policy outputs to commands; None only for a checkpoint
    written before checkpoints carried it (a bundle always has one)."""
    arrays: dict[str, mx.array]
    """Flat model parameter names (``actor.layers.0.weight``, ``normalizer.mean``, ``std``
    or ``log_std``) to arrays, as ``MLPActorCritic`` names them."""
    seed: int = 0
    """Seed of the noise stream when actions are sampled."""
    obs_labels: list[str] = field(default_factory=list)
    """One name per observation element, or none."""
    action_labels: list[str] = field(default_factory=list)
    """One name per action element, or none."""
    source: dict[str, Any] = field(default_factory=dict)
    """Where it came from: checkpoint file name, iteration, env steps, training versions."""
    robot: dict[str, Any] = field(default_factory=dict)
    """The robot spec it was trained on and its observation layout (``robot.payload``,
    JSON-ready); empty: the topic contract."""

    def __post_init__(self) -> None:
        for name, labels, size in (
            ("obs_labels", self.obs_labels, self.obs_dim),
            ("action_labels", self.action_labels, self.action_dim),
        ):
            if labels and len(labels) != size:
                raise BundleError(
                    f"{name} needs {size} names (one per element), got {len(labels)}"
                )

    def model(self) -> MLPActorCritic:
        """An ``MLPActorCritic`` holding this actor. Its critic is freshly initialised (a
        bundle carries none): it serves acting, and fine-tuning relearns the values."""
        model = MLPActorCritic(self.obs_dim, self.action_dim, self.model_cfg)
        expected = {
            name: value.shape
            for name, value in tree_flatten(model.parameters())
            if _is_policy_array(name)
        }
        found = {name: tuple(value.shape) for name, value in self.arrays.items()}
        if found != {name: tuple(shape) for name, shape in expected.items()}:
            raise BundleError(
                f"the arrays do not fit a {self.obs_dim} -> {self.action_dim} actor with hidden "
                f"{self.model_cfg.actor_hidden_dims}: missing "
                f"{sorted(expected.keys() - found.keys())}, unexpected "
                f"{sorted(found.keys() - expected.keys())}, or other shapes"
            )
        try:
            check_stored_arrays(self.arrays)
        except ValueError as error:
            raise BundleError(str(error)) from None
        model.update(tree_unflatten(list(self.arrays.items())), strict=False)
        mx.eval(model.parameters())
        return model


def _is_policy_array(name: str) -> bool:
    return name.startswith("actor.") or name in (*NORMALIZER_KEYS, "std", "log_std",
                                                 "squash_center", "squash_scale")


def bundle_from_checkpoint(
    checkpoint: Checkpoint,
    actions: ActionConfig | None = None,
    obs_labels: list[str] | None = None,
    action_labels: list[str] | None = None,
) -> PolicyBundle:
    """The policy part of a checkpoint; ``actions`` replaces the checkpoint's mapping."""
    return PolicyBundle(
        obs_dim=checkpoint.agent_cfg.obs_dim,
        action_dim=checkpoint.agent_cfg.action_dim,
        model_cfg=checkpoint.model_cfg,
        actions=actions if actions is not None else checkpoint.action_cfg,
        arrays=_policy_arrays(checkpoint.group("model")),
        seed=checkpoint.agent_cfg.seed,
        obs_labels=list(obs_labels or []),
        action_labels=list(action_labels or []),
        robot=dict(checkpoint.extra.get("robot") or {}),
        source={
            "file": checkpoint.path.name,
            "kind": checkpoint.kind,
            "iteration": checkpoint.iteration,
            "env_steps": checkpoint.env_steps,
            "versions": checkpoint.versions,
        },
    )


def bundle_from_agent(
    agent: PPOAgent, actions: ActionConfig, source: str, robot: dict[str, Any] | None = None
) -> PolicyBundle:
    """The current policy of a training session (e.g. the trainer's ~/export_bundle)."""
    return PolicyBundle(
        obs_dim=agent.cfg.obs_dim,
        action_dim=agent.cfg.action_dim,
        model_cfg=agent.model_cfg,
        actions=actions,
        arrays=_policy_arrays(agent.model.parameters()),
        seed=agent.cfg.seed,
        robot=dict(robot or {}),
        source={
            "file": source,
            "kind": "training",
            "iteration": agent.iteration,
            "env_steps": agent.env_steps,
            "versions": package_versions(),
        },
    )


def _policy_arrays(model_tree: Any) -> dict[str, mx.array]:
    return {name: value for name, value in tree_flatten(model_tree) if _is_policy_array(name)}


def save_bundle(path: str | os.PathLike[str], bundle: PolicyBundle) -> Path:
    """Write ``bundle`` atomically (``.safetensors`` is appended when missing)."""
    if bundle.actions is None:
        raise BundleError(
            "a bundle needs the action mapping (action_scale, action_low, action_high, "
            "safe_action): the source does not carry it, so give it"
        )
    # A bundle that could not be served is refused here, not on the robot.
    normalizer = bundle.model().normalizer
    meta = {
        "obs_dim": bundle.obs_dim,
        "action_dim": bundle.action_dim,
        "obs_labels": bundle.obs_labels,
        "action_labels": bundle.action_labels,
        "actions": asdict(bundle.actions),
        "model": asdict(bundle.model_cfg),
        "normalization": {
            "enabled": bundle.model_cfg.normalize_observations,
            "epsilon": normalizer.epsilon,
            "clip": normalizer.clip,
            "formula": "clip((obs - mean) / sqrt(var + epsilon), -clip, clip)",
        },
        "seed": bundle.seed,
        "source": bundle.source,
        "robot": bundle.robot,
        "versions": package_versions(),
    }
    path = Path(path)
    path = path if path.name.endswith(SUFFIX) else path.with_name(path.name + SUFFIX)
    header = {"format": BUNDLE_FORMAT, "bundle": json.dumps(meta)}
    return write_atomically(
        path, lambda tmp: mx.save_safetensors(str(tmp), bundle.arrays, metadata=header)
    )


def _read(path: Path) -> tuple[dict[str, mx.array], dict[str, str]]:
    if not path.is_file():
        raise BundleError(f"no policy file at {path}")
    try:
        return mx.load(str(path), return_metadata=True)
    except (RuntimeError, ValueError, OSError) as error:
        raise BundleError(f"cannot read {path}: {error}") from None


def load_bundle(path: str | os.PathLike[str]) -> PolicyBundle:
    """Read a bundle written by ``save_bundle``; its arrays are checked against its sizes."""
    path = Path(path)
    arrays, header = _read(path)
    if header.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"{path} is not a {BUNDLE_FORMAT} file")
    return _parse(path, arrays, header)


def _parse(path: Path, arrays: dict[str, mx.array], header: dict[str, str]) -> PolicyBundle:
    try:
        meta = json.loads(header["bundle"])
        bundle = PolicyBundle(
            obs_dim=int(meta["obs_dim"]),
            action_dim=int(meta["action_dim"]),
            model_cfg=ModelConfig(**meta["model"]),
            actions=ActionConfig(**meta["actions"]),
            arrays=arrays,
            seed=int(meta["seed"]),
            obs_labels=[str(label) for label in meta["obs_labels"]],
            action_labels=[str(label) for label in meta["action_labels"]],
            source=dict(meta["source"]),
            # Written before bundles carried a robot spec: the topic contract.
            robot=dict(meta.get("robot") or {}),
        )
        bundle.model_cfg.validate()
    except BundleError as error:
        raise BundleError(f"{path}: {error}") from None
    except (KeyError, TypeError, ValueError) as error:
        raise BundleError(
            f"{path} has malformed metadata ({type(error).__name__}: {error})"
        ) from None
    try:
        bundle.model()
    except BundleError as error:
        raise BundleError(f"{path}: {error}") from None
    return bundle


def read_policy(path: str | os.PathLike[str]) -> PolicyBundle:
    """A bundle, or the policy part of a training checkpoint or policy export."""
    path = Path(path)
    arrays, header = _read(path)
    if header.get("format") == BUNDLE_FORMAT:
        return _parse(path, arrays, header)
    if header.get("format") == CHECKPOINT_FORMAT:
        bundle = bundle_from_checkpoint(Checkpoint(path))
        try:
            bundle.model()  # refused here, as a bundle is, not when it first acts
        except BundleError as error:
            raise BundleError(f"{path}: {error}") from None
        return bundle
    raise BundleError(f"{path} is neither a {BUNDLE_FORMAT} bundle nor a checkpoint")
