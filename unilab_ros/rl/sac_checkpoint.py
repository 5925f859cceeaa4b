"""The off-policy learner's checkpoints and its replay on disk, written atomically.

A training checkpoint holds every array of the model (actor, critics, targets, entropy
coefficient, observation normalizer), the three Adam states, the numpy streams of acting
and batch drawing, the counters and the configs: a resumed run goes on where it stopped.
MLX offers no way to set its global random key, so the gradient steps' noise restarts from
a seed derived from the run's seed and its gradient steps (deterministic, but not the
stream an uninterrupted run would have drawn). The replay buffer goes to a file of its
own beside it (``<name>.replay.safetensors``): at most ``sac.buffer_size`` transitions,
oldest first, raw observations, so a restarted trainer learns on with its data, and a
replay saved by another run of the same sizes (or recorded from a deployed policy's
episodes) can seed a new one (``load_replay``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_map_with_path

from unilab_ros.rl.actions import ActionConfig
from unilab_ros.rl.checkpoint import FORMAT as CHECKPOINT_FORMAT
from unilab_ros.rl.checkpoint import (
    SUFFIX,
    Checkpoint,
    CheckpointError,
    _prefixed,
    check_stored_arrays,
    package_versions,
)
from unilab_ros.rl.files import write_atomically
from unilab_ros.rl.sac_agent import SACAgent
from unilab_ros.rl.sac_bundle import sac_model_config, sac_policy_arrays

REPLAY_FORMAT = "unilab_ros.replay/1"
REPLAY_SUFFIX = ".replay" + SUFFIX


def replay_path(checkpoint: str | os.PathLike[str]) -> Path:
    """Where the replay of ``checkpoint`` is kept."""
    path = Path(checkpoint)
    stem = path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else path.name
    return path.with_name(stem + REPLAY_SUFFIX)


def save_sac_checkpoint(path: str | os.PathLike[str], agent: SACAgent,
                        extra: dict[str, Any] | None = None,
                        actions: ActionConfig | None = None, with_replay: bool = True,
                        kind: str = "training") -> Path:
    """Everything needed to resume training (``kind`` "policy": the deployable actor only),
    and (``with_replay``) the replay beside it. The file is a checkpoint of the package's
    one format (``checkpoint.Checkpoint`` reads it, ``algorithm: sac``): its ``model`` is
    the deployable actor (``sac_bundle``), so bundles and deployments take it as they take
    PPO's; the learner's own state is under ``sac/`` and ``optimizer<i>/``."""
    path = Path(path)
    path = path if path.name.endswith(SUFFIX) else path.with_name(path.name + SUFFIX)
    arrays = {f"model/{name}": value for name, value in sac_policy_arrays(agent).items()}
    meta = {
        "format": CHECKPOINT_FORMAT, "algorithm": "sac", "kind": kind,
        "agent": json.dumps(asdict(agent.cfg)),
        "model": json.dumps(asdict(sac_model_config(agent))),
        "sac": json.dumps(asdict(agent.sac_cfg)),
        "iteration": str(agent.iteration), "env_steps": str(agent.env_steps),
        "versions": json.dumps(package_versions()), "extra": json.dumps(extra or {}),
        **({"actions": json.dumps(asdict(actions))} if actions is not None else {}),
    }
    if kind == "training":
        learner = agent.learner
        arrays |= _prefixed("sac", agent.model.parameters())
        for i, optimizer in enumerate(learner.optimizers):
            arrays |= _prefixed(f"optimizer{i}", optimizer.state)
        meta["counters"] = json.dumps({"updates_owed": agent.updates_owed,
                                       "nonfinite_steps": agent.nonfinite_steps,
                                       "gradient_steps": learner.steps})
        meta["rng"] = json.dumps({"act": agent.act_rng_state(),
                                  "batch": agent.batch_rng_state()})
        if with_replay:
            save_replay(replay_path(path), agent)
    return write_atomically(path, lambda tmp: mx.save_safetensors(str(tmp), arrays,
                                                                 metadata=meta))


def save_replay(path: str | os.PathLike[str], agent: SACAgent) -> Path:
    """The replay buffer's rows, oldest first (bounded by its capacity)."""
    arrays = {name: mx.array(value) for name, value in agent.replay.state_dict().items()}
    meta = {"format": REPLAY_FORMAT, "obs_dim": str(agent.obs_dim),
            "action_dim": str(agent.action_dim)}
    return write_atomically(Path(path), lambda tmp: mx.save_safetensors(str(tmp), arrays,
                                                                       metadata=meta))


def load_replay(path: str | os.PathLike[str], agent: SACAgent) -> int:
    """Take the transitions of a saved replay into ``agent``'s; returns how many."""
    try:
        arrays, meta = mx.load(str(path), return_metadata=True)
    except (RuntimeError, ValueError, OSError) as error:
        raise CheckpointError(f"cannot read the replay {path}: {error}") from error
    if meta.get("format") != REPLAY_FORMAT:
        raise CheckpointError(f"{path} is not a {REPLAY_FORMAT} file")
    state = {name: np.array(value) for name, value in arrays.items()}
    for name in ("obs", "actions", "rewards", "next_obs"):
        if name not in state or not np.all(np.isfinite(state[name])):
            raise CheckpointError(f"{path}: {name} is missing or not finite")
    try:
        agent.replay.load_state_dict(state)
    except (KeyError, ValueError) as error:
        raise CheckpointError(f"{path}: {error}") from None
    return agent.replay.size


def restore_sac(agent: SACAgent, checkpoint: Checkpoint, with_replay: bool = True) -> None:
    """Continue training from ``checkpoint`` (and its replay, when there is one)."""
    path = checkpoint.path
    if checkpoint.kind != "training" or checkpoint.algorithm != "sac":
        raise CheckpointError(f"{path} is not a training checkpoint of algorithm sac")
    model = checkpoint.group("sac")
    expected = dict(tree_flatten(agent.model.parameters()))
    found = dict(tree_flatten(model))
    if expected.keys() != found.keys() or any(expected[k].shape != found[k].shape
                                               for k in expected):
        raise CheckpointError(f"{path} holds networks of another shape than the configured "
                              "ones (obs_dim/action_dim/hidden dims/critics differ)")
    states = []
    for i, optimizer in enumerate(agent.learner.optimizers):
        stored = dict(tree_flatten(checkpoint.group(f"optimizer{i}")))
        if stored.keys() != dict(tree_flatten(optimizer.state)).keys():
            raise CheckpointError(f"{path}: optimizer {i}'s state does not fit the networks")
        states.append(tree_map_with_path(lambda name, _, s=stored: s[name], optimizer.state))
    try:
        check_stored_arrays(found, prefix="sac/")
        meta = checkpoint.metadata
        counters, rng = json.loads(meta["counters"]), json.loads(meta["rng"])
    except (ValueError, KeyError) as error:
        raise CheckpointError(f"{path}: {error}") from None
    agent.set_rng_states(rng["act"], rng["batch"])
    agent.iteration, agent.env_steps = checkpoint.iteration, checkpoint.env_steps
    agent.load_learner_state(model, states, counters)
    replay = replay_path(path)
    if with_replay and replay.is_file():
        load_replay(replay, agent)
