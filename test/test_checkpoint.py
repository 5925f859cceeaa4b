"""Checkpoints: exact round trip, bit-exact resume, atomic writes, no pickle."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import mlx.core as mx  # conftest loaded the optimized BLAS first
import numpy as np
import pytest
from mlx.utils import tree_flatten

import unilab_ros.rl  # noqa: F401 - loads the optimized BLAS before mlx
from unilab_ros.rl.actions import ActionConfig
from unilab_ros.rl.agent import AgentConfig, PPOAgent
from unilab_ros.rl.checkpoint import (
    Checkpoint,
    CheckpointError,
    arrays_equal,
    export_policy,
    load_policy,
    restore_agent,
    save_checkpoint,
)
from unilab_ros.rl.model import ModelConfig
from unilab_ros.rl.ppo_config import PPOConfig

SIZES = AgentConfig(num_envs=3, obs_dim=4, action_dim=2, num_steps=5, seed=7)


def make_agent(schedule: str = "adaptive") -> PPOAgent:
    return PPOAgent(
        SIZES,
        ModelConfig(actor_hidden_dims=[16], critic_hidden_dims=[16]),
        PPOConfig(num_mini_batches=2, num_learning_epochs=2, schedule=schedule),
    )


def run_iterations(agent: PPOAgent, iterations: int, seed: int) -> list[np.ndarray]:
    """Drive the agent on deterministic synthetic data; return the actions it took."""
    rng = np.random.default_rng(seed)
    taken = []
    for _ in range(iterations):
        obs = rng.standard_normal((SIZES.num_envs, SIZES.obs_dim)).astype(np.float32)
        while not agent.rollout_full:
            actions = agent.act(obs)
            taken.append(actions)
            rewards = -np.square(actions).sum(axis=1)
            dones = (rng.random(SIZES.num_envs) < 0.2).astype(np.uint8)
            agent.record(obs, actions, rewards, dones)
            obs = rng.standard_normal(obs.shape).astype(np.float32)
        agent.update(obs)
    return taken


def test_round_trip_restores_everything_exactly(tmp_path: Path) -> None:
    agent = make_agent()
    run_iterations(agent, 2, seed=1)
    path = save_checkpoint(tmp_path / "ckpt", agent, {"note": "x"})
    assert path.name == "ckpt.safetensors"

    fresh = make_agent()
    restore_agent(fresh, Checkpoint(path))
    assert arrays_equal(agent.model.parameters(), fresh.model.parameters())
    assert arrays_equal(agent.trainer.optimizer.state, fresh.trainer.optimizer.state)
    assert arrays_equal(agent.trainer.schedule_state, fresh.trainer.schedule_state)
    assert fresh.iteration == agent.iteration == 2
    assert fresh.env_steps == agent.env_steps
    assert Checkpoint(path).extra == {"note": "x"}
    normalizer_count = float(fresh.model.normalizer.count.item())
    assert normalizer_count == SIZES.num_envs * SIZES.num_steps * 2


def test_resume_continues_bit_exactly(tmp_path: Path) -> None:
    straight = make_agent()
    run_iterations(straight, 2, seed=3)
    path = save_checkpoint(tmp_path / "mid", straight)
    actions_straight = run_iterations(straight, 2, seed=4)

    resumed = make_agent()
    restore_agent(resumed, Checkpoint(path))
    actions_resumed = run_iterations(resumed, 2, seed=4)

    for a, b in zip(actions_straight, actions_resumed, strict=True):
        np.testing.assert_array_equal(a, b)
    assert arrays_equal(straight.model.parameters(), resumed.model.parameters())
    assert arrays_equal(straight.trainer.optimizer.state, resumed.trainer.optimizer.state)


def test_policy_export_loads_for_inference_only(tmp_path: Path) -> None:
    agent = make_agent()
    run_iterations(agent, 1, seed=5)
    path = export_policy(tmp_path / "policy.safetensors", agent)
    model, checkpoint = load_policy(path)
    obs = np.ones((2, SIZES.obs_dim), np.float32)
    import mlx.core as mx

    np.testing.assert_array_equal(
        np.array(model.policy(mx.array(obs))), np.array(agent.model.policy(mx.array(obs)))
    )
    with pytest.raises(CheckpointError, match="policy export"):
        restore_agent(make_agent(), checkpoint)


def test_mismatched_model_is_refused(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path / "a", make_agent())
    other = PPOAgent(SIZES, ModelConfig(actor_hidden_dims=[32], critic_hidden_dims=[16]))
    with pytest.raises(CheckpointError, match="another shape"):
        restore_agent(other, Checkpoint(path))


def test_unreadable_files_raise_checkpoint_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint"):
        Checkpoint(tmp_path / "missing.safetensors")
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00not a safetensors file")
    with pytest.raises(CheckpointError):
        Checkpoint(garbage)


def test_failed_write_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch) -> None:
    agent = make_agent()
    path = save_checkpoint(tmp_path / "latest", agent)
    before = path.read_bytes()
    run_iterations(agent, 1, seed=6)

    import mlx.core as mx

    def crash(file: str, arrays: dict, metadata: dict) -> None:
        Path(file).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(mx, "save_safetensors", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path / "latest", agent)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["latest.safetensors"]


def test_checkpoint_code_never_unpickles() -> None:
    package = Path(unilab_ros.rl.__file__).resolve().parent.parent
    pattern = re.compile(r"import pickle|pickle\.loads?\(|cloudpickle|allow_pickle=True")
    offenders = [p for p in package.rglob("*.py") if pattern.search(p.read_text())]
    assert offenders == []


def test_a_checkpoint_with_non_finite_weights_is_refused(tmp_path):
    agent = make_agent()
    layer = agent.model.actor.layers[0]
    layer.weight = layer.weight * float("nan")
    path = save_checkpoint(tmp_path / "nan.safetensors", agent)
    with pytest.raises(CheckpointError, match="non-finite"):
        restore_agent(make_agent(), Checkpoint(path))
    with pytest.raises(CheckpointError, match="non-finite"):
        load_policy(path)


def test_the_action_mapping_travels_with_the_checkpoint(tmp_path):
    agent = make_agent()
    actions = ActionConfig(action_scale=[2.0], action_low=[-2.0, -1.0], action_high=[2.0, 1.0],
                           safe_action=[0.0])
    for path in (save_checkpoint(tmp_path / "train", agent, actions=actions),
                 export_policy(tmp_path / "policy", agent, actions=actions)):
        assert Checkpoint(path).action_cfg == actions
    assert Checkpoint(save_checkpoint(tmp_path / "none", agent)).action_cfg is None


def test_a_checkpoint_that_names_the_run_time_knobs_under_ppo_resumes(tmp_path):
    """Files written while PPOConfig also held how the update runs name those fields in
    their ppo metadata; they now belong to PPORuntimeConfig, which no checkpoint holds."""
    agent = make_agent()
    run_iterations(agent, 1, seed=1)
    path = save_checkpoint(tmp_path / "new", agent)
    arrays, meta = mx.load(str(path), return_metadata=True)
    run_time = {
        "finite_check_interval": 8,
        "enable_compile": True,
        "warmup_strict_iters": 0,
        "warmup_finite_check_interval": 1,
        "disable_finite_checks": False,
    }
    meta["ppo"] = json.dumps(json.loads(meta["ppo"]) | run_time)
    old_path = tmp_path / "old.safetensors"
    mx.save_safetensors(str(old_path), arrays, metadata=meta)
    checkpoint = Checkpoint(old_path)
    assert checkpoint.ppo_cfg == agent.ppo_cfg
    assert sorted(checkpoint.ignored_fields) == sorted(f"ppo.{name}" for name in run_time)
    resumed = make_agent()
    restore_agent(resumed, checkpoint)
    assert resumed.iteration == agent.iteration == 1
    assert arrays_equal(resumed.model.parameters(), agent.model.parameters())


@pytest.mark.parametrize("change", ["drop_kind", "extra_field", "bad_json"])
def test_malformed_metadata_is_one_clear_error(tmp_path, change):
    path = save_checkpoint(tmp_path / "ok", make_agent())
    arrays, meta = mx.load(str(path), return_metadata=True)
    if change == "drop_kind":
        del meta["kind"]
    elif change == "extra_field":
        ppo = json.loads(meta["ppo"])
        ppo["a_field_from_the_future"] = 1
        meta["ppo"] = json.dumps(ppo)
    else:
        meta["agent"] = "{not json"
    mx.save_safetensors(str(tmp_path / "changed.safetensors"), arrays, metadata=meta)
    if change == "extra_field":
        checkpoint = Checkpoint(tmp_path / "changed.safetensors")
        assert checkpoint.ignored_fields == ["ppo.a_field_from_the_future"]
        return
    with pytest.raises(CheckpointError, match="malformed metadata") as caught:
        Checkpoint(tmp_path / "changed.safetensors")
    assert "\n" not in str(caught.value)


def _tampered(tmp_path: Path, path: Path, name: str, value: float | None,
              meta_change: dict[str, str] | None = None) -> Path:
    """``path`` rewritten with ``name`` holding ``value`` (every element; None drops it)."""
    arrays, meta = mx.load(str(path), return_metadata=True)
    if value is None:
        del arrays[name]
    else:
        arrays[name] = mx.full(arrays[name].shape, value, arrays[name].dtype)
    changed = tmp_path / f"bad-{name.replace('/', '_')}.safetensors"
    mx.save_safetensors(str(changed), arrays, metadata=meta | (meta_change or {}))
    return changed


@pytest.mark.parametrize(("name", "value", "message"), [
    ("model/normalizer.var", -1.0, "model/normalizer.var holds -1: it must be >= 0"),
    ("model/normalizer.var", float("inf"), "model/normalizer.var holds non-finite"),
    ("model/normalizer.count", -3.0, "model/normalizer.count holds -3: it must be >= 0"),
    ("model/normalizer.mean", float("nan"), "model/normalizer.mean holds non-finite"),
    ("model/std", float("nan"), "model/std holds non-finite"),
])
def test_a_checkpoint_with_an_impossible_model_value_is_refused(tmp_path, name, value, message):
    agent = make_agent()
    run_iterations(agent, 1, seed=1)
    bad = _tampered(tmp_path, save_checkpoint(tmp_path / "ok", agent), name, value)
    for load in (lambda: restore_agent(make_agent(), Checkpoint(bad)), lambda: load_policy(bad)):
        with pytest.raises(CheckpointError, match=re.escape(message)) as caught:
            load()
        assert str(caught.value).startswith(str(bad)) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("name", "value", "message"), [
    ("optimizer/learning_rate", float("nan"), "optimizer/learning_rate holds non-finite"),
    ("optimizer/learning_rate", 0.0, "optimizer/learning_rate is 0: it must be > 0"),
    ("optimizer/learning_rate", -1e-3, "optimizer/learning_rate is -0.001: it must be > 0"),
    ("optimizer/actor.layers.0.weight.m", float("nan"),
     "optimizer/actor.layers.0.weight.m holds non-finite"),
    ("optimizer/critic.layers.0.bias.v", -1.0,
     "optimizer/critic.layers.0.bias.v holds -1: it must be >= 0"),
    ("optimizer/std.v", float("inf"), "optimizer/std.v holds non-finite"),
    ("optimizer/actor.layers.1.bias.m", None, "missing ['actor.layers.1.bias.m']"),
    ("schedule/adv_std_mean", float("nan"), "schedule/adv_std_mean holds non-finite"),
    ("schedule/rollouts_seen", -2.0, "schedule/rollouts_seen is -2: it must be >= 0"),
    ("rng/noise_key", None, "rng/noise_key is missing or not a"),
])
def test_a_checkpoint_with_an_impossible_training_state_is_refused(
    tmp_path, name, value, message
):
    agent = make_agent()
    run_iterations(agent, 1, seed=1)
    bad = _tampered(tmp_path, save_checkpoint(tmp_path / "ok", agent), name, value)
    resumed = make_agent()
    before = dict(tree_flatten(resumed.trainer.optimizer.state))
    with pytest.raises(CheckpointError, match=re.escape(message)) as caught:
        restore_agent(resumed, Checkpoint(bad))
    assert str(caught.value).startswith(str(bad)) and "\n" not in str(caught.value)
    assert arrays_equal(dict(tree_flatten(resumed.trainer.optimizer.state)), before)


def test_an_optimizer_step_stored_as_a_negative_number_is_refused(tmp_path):
    path = save_checkpoint(tmp_path / "ok", make_agent())
    arrays, meta = mx.load(str(path), return_metadata=True)
    arrays["optimizer/step"] = mx.array(-1.0)
    mx.save_safetensors(str(tmp_path / "step.safetensors"), arrays, metadata=meta)
    with pytest.raises(CheckpointError, match=re.escape("optimizer/step holds -1")):
        restore_agent(make_agent(), Checkpoint(tmp_path / "step.safetensors"))


@pytest.mark.parametrize("field", ["iteration", "env_steps"])
def test_a_negative_count_in_the_metadata_is_refused(tmp_path, field):
    path = save_checkpoint(tmp_path / "ok", make_agent())
    arrays, meta = mx.load(str(path), return_metadata=True)
    mx.save_safetensors(str(tmp_path / "neg.safetensors"), arrays, metadata=meta | {field: "-5"})
    with pytest.raises(CheckpointError, match=f"malformed metadata.*{field}"):
        Checkpoint(tmp_path / "neg.safetensors")


def test_a_constant_observation_with_zero_variance_still_loads(tmp_path):
    agent = make_agent()
    agent.model.normalizer.update(mx.ones((10, SIZES.obs_dim)))
    path = save_checkpoint(tmp_path / "constant", agent)
    assert float(mx.min(Checkpoint(path).arrays["model/normalizer.var"]).item()) == 0.0
    restore_agent(make_agent(), Checkpoint(path))
