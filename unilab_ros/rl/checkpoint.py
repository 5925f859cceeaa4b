"""Checkpoints: safetensors arrays plus JSON metadata, written atomically, loaded without pickle.

A training checkpoint holds the model (with its observation normalizer), the Adam
state, the adaptive-schedule state, the reward normalization's statistics and returns
(when it is on), the random keys, the iteration and env-step counts and every config, so
resuming continues bit-exactly. A policy export holds the model and configs only, for
deployment.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, fields
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from unilab_ros.rl.actions import ActionConfig
from unilab_ros.rl.agent import AgentConfig, PPOAgent
from unilab_ros.rl.files import write_atomically
from unilab_ros.rl.model import MLPActorCritic, ModelConfig
from unilab_ros.rl.ppo_config import PPOConfig

FORMAT = "unilab_ros.checkpoint/1"
SUFFIX = ".safetensors"


class CheckpointError(ValueError):
    """A checkpoint file is missing, unreadable, or does not fit the agent."""


def package_versions() -> dict[str, str]:
    """The versions of the packages that decide what a saved file holds."""
    versions = {}
    for package in ("unilab_ros", "mlx", "numpy"):
        try:
            versions[package] = importlib_metadata.version(package)
        except importlib_metadata.PackageNotFoundError:
            versions[package] = "unknown"
    return versions


def _write_atomically(path: Path, arrays: dict[str, mx.array], meta: dict[str, str]) -> Path:
    return write_atomically(
        path, lambda tmp: mx.save_safetensors(str(tmp), arrays, metadata=meta)
    )


def remove_stale_temporaries(folder: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary files of writes that never finished (a process killed while
    saving); returns them. Only names ``_write_atomically`` makes are touched."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    stale = [path for path in folder.glob(f".*{SUFFIX}.*{SUFFIX}") if path.is_file()]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def _metadata(
    agent: PPOAgent,
    kind: str,
    extra: dict[str, Any] | None,
    actions: ActionConfig | None = None,
) -> dict[str, str]:
    action_meta = {"actions": json.dumps(asdict(actions))} if actions is not None else {}
    return {
        **action_meta,
        "format": FORMAT,
        "kind": kind,
        "agent": json.dumps(asdict(agent.cfg)),
        "model": json.dumps(asdict(agent.model_cfg)),
        "ppo": json.dumps(asdict(agent.ppo_cfg)),
        "iteration": str(agent.iteration),
        "env_steps": str(agent.env_steps),
        "versions": json.dumps(package_versions()),
        "extra": json.dumps(extra or {}),
    }


def _prefixed(prefix: str, tree: Any) -> dict[str, mx.array]:
    return {f"{prefix}/{name}": value for name, value in tree_flatten(tree)}


def _with_suffix(path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    return path if path.name.endswith(SUFFIX) else path.with_name(path.name + SUFFIX)


def save_checkpoint(
    path: str | os.PathLike[str],
    agent: PPOAgent,
    extra: dict[str, Any] | None = None,
    actions: ActionConfig | None = None,
) -> Path:
    """Save everything needed to resume training; returns the file written. ``actions``
    (how the policy's outputs became commands) lets a deployment act the same way."""
    trainer = agent.trainer
    arrays = {
        **_prefixed("model", agent.model.parameters()),
        **_prefixed("optimizer", trainer.optimizer.state),
        **_prefixed("schedule", trainer.schedule_state),
        "rng/noise_key": agent.sampler.key,
        "rng/shuffle_key": trainer.shuffle_key,
    }
    if agent.reward_normalizer is not None:
        reward_state = agent.reward_normalizer.state()
        arrays |= {f"rewards/{name}": mx.array(value) for name, value in reward_state.items()}
    meta = _metadata(agent, "training", extra, actions)
    return _write_atomically(_with_suffix(path), arrays, meta)


def export_policy(
    path: str | os.PathLike[str], agent: PPOAgent, actions: ActionConfig | None = None
) -> Path:
    """Save the model and configs only (and the action mapping), for inference."""
    arrays = _prefixed("model", agent.model.parameters())
    return _write_atomically(_with_suffix(path), arrays, _metadata(agent, "policy", None, actions))


class Checkpoint:
    """A loaded checkpoint: arrays grouped by prefix and the parsed metadata."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"no checkpoint at {self.path}")
        try:
            arrays, meta = mx.load(str(self.path), return_metadata=True)
        except (RuntimeError, ValueError, OSError) as error:
            raise CheckpointError(f"cannot read {self.path}: {error}") from error
        if meta.get("format") != FORMAT:
            raise CheckpointError(f"{self.path} is not a {FORMAT} file")
        self.arrays: dict[str, mx.array] = arrays
        self.metadata: dict[str, str] = meta
        """The raw metadata (a learner's own entries beside the common ones)."""
        self.ignored_fields: list[str] = []
        """Config fields named by the file that this version no longer has."""
        try:
            self.kind = meta["kind"]
            self.agent_cfg = self._config(AgentConfig, "agent", meta)
            self.model_cfg = self._config(ModelConfig, "model", meta)
            self.algorithm = meta.get("algorithm", "ppo")
            """Which learner wrote it: ppo, or sac (``sac_checkpoint``: its ``model`` is the
            deployable actor, its training state under ``sac/``)."""
            self.ppo_cfg = self._config(PPOConfig, "ppo", meta) if "ppo" in meta else None
            self.action_cfg: ActionConfig | None = (
                self._config(ActionConfig, "actions", meta) if "actions" in meta else None
            )
            """The action mapping the policy was trained with (None in older files)."""
            self.iteration = int(meta["iteration"])
            self.env_steps = int(meta["env_steps"])
            if self.iteration < 0 or self.env_steps < 0:
                raise ValueError(f"iteration {self.iteration} and env_steps "
                                 f"{self.env_steps} must be >= 0")
            self.versions: dict[str, str] = json.loads(meta.get("versions", "{}"))
            self.extra: dict[str, Any] = json.loads(meta.get("extra", "{}"))
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(
                f"{self.path} has malformed metadata ({type(error).__name__}: {error})"
            ) from None

    def _config(self, cls: type, key: str, meta: dict[str, str]) -> Any:
        """A config from the metadata; fields this version dropped are set aside (a
        checkpoint written before a field was removed still loads), missing ones keep
        their defaults."""
        values = json.loads(meta[key])
        known = {f.name for f in fields(cls)}
        self.ignored_fields += [f"{key}.{name}" for name in values if name not in known]
        return cls(**{name: value for name, value in values.items() if name in known})

    def group(self, prefix: str) -> Any:
        """The nested tree stored under ``prefix/``."""
        start = len(prefix) + 1
        items = [(k[start:], v) for k, v in self.arrays.items() if k.startswith(prefix + "/")]
        return tree_unflatten(items)

    def load_model_into(self, model: MLPActorCritic) -> None:
        params = self.group("model")
        expected = dict(tree_flatten(model.parameters()))
        found = dict(tree_flatten(params))
        if expected.keys() != found.keys() or any(
            expected[k].shape != found[k].shape for k in expected
        ):
            raise CheckpointError(
                f"{self.path} holds a model of another shape than the configured one "
                f"(obs_dim/action_dim/hidden dims/std type differ)"
            )
        try:
            check_stored_arrays(found, prefix="model/")
        except ValueError as error:
            raise CheckpointError(f"{self.path}: {error}") from None
        model.update(params)
        mx.eval(model.parameters())


def restore_agent(agent: PPOAgent, checkpoint: Checkpoint) -> None:
    """Continue training from ``checkpoint``: weights, optimizer, schedule, RNG, counters."""
    if checkpoint.kind != "training":
        raise CheckpointError(f"{checkpoint.path} is a policy export, not a training checkpoint")
    if checkpoint.algorithm != "ppo":
        raise CheckpointError(f"{checkpoint.path} was trained with algorithm "
                              f"{checkpoint.algorithm}, not ppo")
    checkpoint.load_model_into(agent.model)
    trainer = agent.trainer
    optimizer_state = checkpoint.group("optimizer")
    if not tree_flatten(optimizer_state):
        raise CheckpointError(f"{checkpoint.path} holds no optimizer state")
    schedule_state = checkpoint.group("schedule")
    try:
        _check_like("optimizer/", optimizer_state, trainer.optimizer.state)
        _check_optimizer_values(dict(tree_flatten(optimizer_state)))
        _check_like("schedule/", schedule_state, trainer.schedule_state)
        _check_schedule_values(schedule_state)
        for name, key in (("noise_key", agent.sampler.key), ("shuffle_key", trainer.shuffle_key)):
            stored = checkpoint.arrays.get(f"rng/{name}")
            if stored is None or stored.shape != key.shape or stored.dtype != key.dtype:
                raise ValueError(f"rng/{name} is missing or not a {key.dtype} {key.shape} key")
        reward_state = _reward_state(checkpoint, agent)
    except ValueError as error:
        raise CheckpointError(f"{checkpoint.path}: {error}") from None
    # Only a state that passed every check replaces the agent's.
    trainer.optimizer.state.update(optimizer_state)
    trainer.schedule_state.update(schedule_state)
    agent.sampler.key = checkpoint.arrays["rng/noise_key"]
    trainer.shuffle_key = checkpoint.arrays["rng/shuffle_key"]
    if reward_state is not None:
        agent.reward_normalizer.load_state(reward_state)
    agent.iteration = checkpoint.iteration
    agent.env_steps = checkpoint.env_steps
    mx.eval(trainer.optimizer.state, trainer.schedule_state)


def load_policy(path: str | os.PathLike[str]) -> tuple[MLPActorCritic, Checkpoint]:
    """The model stored in a checkpoint or export, ready for inference."""
    checkpoint = Checkpoint(path)
    cfg = checkpoint.agent_cfg
    model = MLPActorCritic(cfg.obs_dim, cfg.action_dim, checkpoint.model_cfg)
    checkpoint.load_model_into(model)
    return model, checkpoint


def arrays_equal(a: Any, b: Any) -> bool:
    """True when two trees hold the same names, shapes, dtypes and bits."""
    flat_a, flat_b = dict(tree_flatten(a)), dict(tree_flatten(b))
    return flat_a.keys() == flat_b.keys() and all(
        flat_a[k].dtype == flat_b[k].dtype
        and np.array_equal(np.array(flat_a[k]), np.array(flat_b[k]))
        for k in flat_a
    )


def all_finite(tree: Any) -> bool:
    """True when every array of ``tree`` holds only finite values."""
    return all(bool(mx.all(mx.isfinite(value)).item()) for _, value in tree_flatten(tree))


def _minimum(value: mx.array) -> float:
    return float(mx.min(value.astype(mx.float32)).item())


def check_stored_arrays(flat: dict[str, mx.array], prefix: str = "") -> None:
    """Raise ValueError naming the first stored array no training produces: a non-finite
    value anywhere, a negative normalizer variance (every action would be NaN) or count.
    ``flat`` maps ``tree_flatten`` names to arrays; ``prefix`` is how the file names them.
    (A variance of exactly 0 is an observation that never changed: it is kept.)"""
    for name, value in flat.items():
        if not bool(mx.all(mx.isfinite(value)).item()):
            raise ValueError(f"{prefix}{name} holds non-finite (NaN or Inf) values")
    for name in ("normalizer.var", "normalizer.count"):
        if name in flat and (lowest := _minimum(flat[name])) < 0.0:
            raise ValueError(f"{prefix}{name} holds {lowest:g}: it must be >= 0")


def _check_like(prefix: str, stored: Any, expected: Any) -> None:
    """The stored tree has the names and shapes of the agent's own."""
    found = {name: value.shape for name, value in tree_flatten(stored)}
    wanted = {name: value.shape for name, value in tree_flatten(expected)}
    if found != wanted:
        missing = sorted(wanted.keys() - found.keys())
        unexpected = sorted(found.keys() - wanted.keys())
        other = sorted(k for k in found.keys() & wanted.keys() if found[k] != wanted[k])
        raise ValueError(f"{prefix} does not fit this agent: missing {missing}, unexpected "
                         f"{unexpected}, other shapes {other}")


def _check_optimizer_values(flat: dict[str, mx.array]) -> None:
    """Adam's moments finite (second ones >= 0), its step >= 0, its rate finite and > 0:
    a NaN in any of them rolls every later update back in silence."""
    check_stored_arrays(flat, prefix="optimizer/")
    if (rate := float(flat["learning_rate"].item())) <= 0.0:
        raise ValueError(f"optimizer/learning_rate is {rate:g}: it must be > 0")
    for name, value in flat.items():
        if (name == "step" or name.endswith(".v")) and (lowest := _minimum(value)) < 0.0:
            raise ValueError(f"optimizer/{name} holds {lowest:g}: it must be >= 0")


def _check_schedule_values(state: dict[str, mx.array]) -> None:
    check_stored_arrays(state, prefix="schedule/")
    for name in ("adv_std_mean", "rollouts_seen"):
        if (value := float(state[name].item())) < 0.0:
            raise ValueError(f"schedule/{name} is {value:g}: it must be >= 0")


def _reward_state(checkpoint: Checkpoint, agent: PPOAgent) -> dict[str, mx.array] | None:
    """The checkpoint's reward normalization state (flat names), checked; None when the
    agent does not normalize rewards or the file has none (written without it, or before
    it existed: the statistics then start afresh). Returns stored for another number of
    envs start at 0: they cannot be matched to the envs of this run."""
    normalizer = agent.reward_normalizer
    stored = dict(tree_flatten(checkpoint.group("rewards")))
    if normalizer is None or not stored:
        return None
    expected = normalizer.state()
    _check_like("rewards/", {k: v for k, v in stored.items() if k != "returns"},
                {k: v for k, v in expected.items() if k != "returns"})
    returns = stored.get("returns")
    if returns is None or returns.ndim != 1:
        raise ValueError("rewards/returns is missing or not one value per env")
    check_stored_arrays(stored, prefix="rewards/")
    if returns.shape != expected["returns"].shape:
        stored["returns"] = mx.zeros(expected["returns"].shape)
    return stored
