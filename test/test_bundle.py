"""Policy bundles: round trip from a checkpoint, no training state, clear errors, the CLI."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import unilab_ros.rl  # noqa: F401 - loads the optimized BLAS before mlx
from unilab_ros.deploy.export_bundle import main as export_main
from unilab_ros.rl.actions import ActionConfig, override_actions
from unilab_ros.rl.agent import AgentConfig, PPOAgent
from unilab_ros.rl.bundle import (
    BUNDLE_FORMAT,
    BundleError,
    bundle_from_checkpoint,
    load_bundle,
    read_policy,
    save_bundle,
)
from unilab_ros.rl.checkpoint import Checkpoint, export_policy, save_checkpoint
from unilab_ros.rl.model import ModelConfig

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
SIZES = AgentConfig(num_envs=2, obs_dim=4, action_dim=2, seed=5)
TRAINED = ActionConfig(action_scale=[2.0], action_low=[-2.0, -1.0], action_high=[2.0, 1.0],
                       safe_action=[0.5, 0.0])


def trained_agent(noise_std_type: str = "scalar") -> PPOAgent:
    agent = PPOAgent(SIZES, ModelConfig(actor_hidden_dims=[16, 8], critic_hidden_dims=[8],
                                        activation="tanh", noise_std_type=noise_std_type))
    agent.model.normalizer.update(mx.array(np.random.default_rng(0).normal(1.0, 4.0, (50, 4))))
    mx.eval(agent.model.parameters())
    return agent


def safetensors_header(path: Path) -> dict:
    """The JSON header, read as a runtime without MLX would (8-byte length, then JSON)."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + length])


@pytest.mark.parametrize("noise_std_type", ["scalar", "log"])
def test_a_bundle_round_trips_and_acts_as_the_trained_actor(tmp_path, noise_std_type):
    agent = trained_agent(noise_std_type)
    checkpoint = save_checkpoint(tmp_path / "ckpt", agent, actions=TRAINED)
    bundle = bundle_from_checkpoint(Checkpoint(checkpoint), obs_labels=["a", "b", "c", "d"],
                                    action_labels=["left", "right"])
    path = save_bundle(tmp_path / "policy", bundle)
    assert path.name == "policy.safetensors"
    loaded = load_bundle(path)
    assert (loaded.obs_dim, loaded.action_dim, loaded.seed) == (4, 2, 5)
    assert loaded.actions == TRAINED
    assert loaded.model_cfg == agent.model_cfg
    assert loaded.obs_labels == ["a", "b", "c", "d"] and loaded.action_labels == ["left", "right"]
    assert loaded.source["iteration"] == 0 and loaded.source["file"] == checkpoint.name
    obs = mx.array(np.random.default_rng(1).normal(1.0, 4.0, (7, 4)).astype(np.float32))
    model = loaded.model()
    np.testing.assert_array_equal(np.array(model.policy(obs)), np.array(agent.model.policy(obs)))
    np.testing.assert_array_equal(np.array(model.std_and_log_std()[0]),
                                  np.array(agent.model.std_and_log_std()[0]))


def test_a_bundle_holds_the_actor_only_and_json_metadata(tmp_path):
    agent = trained_agent()
    checkpoint = save_checkpoint(tmp_path / "ckpt", agent, actions=TRAINED)
    path = save_bundle(tmp_path / "policy", read_policy(checkpoint))
    header = safetensors_header(path)
    names = sorted(name for name in header if name != "__metadata__")
    assert names == [
        "actor.layers.0.bias", "actor.layers.0.weight", "actor.layers.1.bias",
        "actor.layers.1.weight", "actor.layers.2.bias", "actor.layers.2.weight",
        "normalizer.mean", "normalizer.var", "std",
    ], "no critic, optimizer, random keys or normalizer count"
    meta = header["__metadata__"]
    assert meta["format"] == BUNDLE_FORMAT
    bundle = json.loads(meta["bundle"])
    assert bundle["actions"]["action_scale"] == [2.0]
    assert bundle["model"]["activation"] == "tanh"
    assert bundle["model"]["actor_hidden_dims"] == [16, 8]
    assert bundle["normalization"] == {
        "enabled": True, "epsilon": 1e-8, "clip": 10.0,
        "formula": "clip((obs - mean) / sqrt(var + epsilon), -clip, clip)",
    }
    assert {"unilab_ros", "mlx", "numpy"} <= set(bundle["versions"])


def test_read_policy_serves_a_checkpoint_an_export_and_a_bundle_alike(tmp_path):
    agent = trained_agent()
    checkpoint = save_checkpoint(tmp_path / "ckpt", agent, actions=TRAINED)
    export = export_policy(tmp_path / "export", agent, actions=TRAINED)
    bundle = save_bundle(tmp_path / "policy", read_policy(checkpoint))
    obs = mx.array(np.ones((1, 4), np.float32))
    outputs = [np.array(read_policy(path).model().policy(obs))
               for path in (checkpoint, export, bundle)]
    np.testing.assert_array_equal(outputs[0], outputs[1])
    np.testing.assert_array_equal(outputs[0], outputs[2])


def test_bad_files_and_inputs_are_one_line_errors(tmp_path):
    agent = trained_agent()
    with pytest.raises(BundleError, match="no policy file at"):
        read_policy(tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(BundleError, match="cannot read"):
        read_policy(tmp_path / "junk.safetensors")
    other = tmp_path / "other.safetensors"
    mx.save_safetensors(str(other), {"x": mx.zeros((2,))}, metadata={"format": "something"})
    with pytest.raises(BundleError, match="neither a unilab_ros.bundle/1 bundle nor"):
        read_policy(other)
    checkpoint = save_checkpoint(tmp_path / "ckpt", agent, actions=TRAINED)
    with pytest.raises(BundleError, match="is not a unilab_ros.bundle/1 file"):
        load_bundle(checkpoint)
    with pytest.raises(BundleError, match="action_labels needs 2 names"):
        bundle_from_checkpoint(Checkpoint(checkpoint), action_labels=["only one"])
    older = save_checkpoint(tmp_path / "older", agent)
    with pytest.raises(BundleError, match="needs the action mapping"):
        save_bundle(tmp_path / "policy", read_policy(older))


def test_a_tampered_bundle_is_refused(tmp_path):
    checkpoint = save_checkpoint(tmp_path / "ckpt", trained_agent(), actions=TRAINED)
    path = save_bundle(tmp_path / "policy", read_policy(checkpoint))
    arrays, meta = mx.load(str(path), return_metadata=True)
    shrunk = dict(arrays, **{"actor.layers.0.weight": arrays["actor.layers.0.weight"][:4]})
    mx.save_safetensors(str(tmp_path / "shape.safetensors"), shrunk, metadata=meta)
    with pytest.raises(BundleError, match="do not fit a 4 -> 2 actor"):
        load_bundle(tmp_path / "shape.safetensors")
    poisoned = dict(arrays, std=arrays["std"] * float("nan"))
    mx.save_safetensors(str(tmp_path / "nan.safetensors"), poisoned, metadata=meta)
    with pytest.raises(BundleError, match="non-finite"):
        load_bundle(tmp_path / "nan.safetensors")
    mx.save_safetensors(str(tmp_path / "meta.safetensors"), arrays,
                        metadata=dict(meta, bundle='{"obs_dim": 4}'))
    with pytest.raises(BundleError, match="malformed metadata"):
        load_bundle(tmp_path / "meta.safetensors")


def test_override_actions_takes_given_fields_and_says_so():
    given = ActionConfig(action_scale=[1.0], action_low=[-9.0])
    merged, notes = override_actions(TRAINED, given, {"action_scale"})
    assert merged.action_scale == [1.0] and merged.action_low == [-2.0, -1.0]
    assert notes == ["action_scale = [1.0] (given) overrides [2.0] (the training's)"]
    assert override_actions(TRAINED, TRAINED, {"action_scale"}) == (TRAINED, [])
    fallback, notes = override_actions(None, given, set())
    assert fallback == given and "older version" in notes[0]


def test_the_command_exports_with_overrides_and_labels(tmp_path, capsys):
    checkpoint = save_checkpoint(tmp_path / "ckpt", trained_agent(), actions=TRAINED)
    export_main([str(checkpoint), str(tmp_path / "out"), "--action-scale", "1.5",
                 "--action-labels", "l", "r"])
    printed = capsys.readouterr().out
    assert "action_scale = [1.5] (given) overrides [2.0]" in printed
    bundle = load_bundle(tmp_path / "out.safetensors")
    assert bundle.actions.action_scale == [1.5] and bundle.actions.safe_action == [0.5, 0.0]
    assert bundle.action_labels == ["l", "r"] and bundle.obs_labels == []


def run_command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "unilab_ros.deploy.export_bundle", *args],
                          capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


def test_the_command_exits_2_with_one_line_on_bad_input(tmp_path):
    older = save_checkpoint(tmp_path / "older", trained_agent())
    checkpoint = save_checkpoint(tmp_path / "ckpt", trained_agent(), actions=TRAINED)
    cases = [
        ([str(tmp_path / "missing.safetensors"), "out"], "no policy file at"),
        ([str(older), "out"], "does not carry the action mapping"),
        ([str(older), "out", "--action-scale", "1", "--action-low", "1", "--action-high", "-1",
          "--safe-action", "0"], "action_low must not exceed action_high"),
        ([str(older), "out", "--action-scale", "1", "1", "1", "--action-low", "-1",
          "--action-high", "1", "--safe-action", "0"], "action_scale needs 1 or action_dim=2"),
        ([str(checkpoint), "out", "--obs-labels", "x"], "obs_labels needs 4 names"),
    ]
    for args, reason in cases:
        result = run_command(*args, cwd=tmp_path)
        assert result.returncode == 2, result.stdout + result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and reason in lines[0], (args, result.stderr)
    assert not (tmp_path / "out.safetensors").exists()


@pytest.mark.parametrize(("name", "value", "message"), [
    ("normalizer.var", -1.0, "normalizer.var holds -1: it must be >= 0"),
    ("normalizer.var", float("nan"), "normalizer.var holds non-finite"),
    ("normalizer.mean", float("inf"), "normalizer.mean holds non-finite"),
    ("actor.layers.1.bias", float("nan"), "actor.layers.1.bias holds non-finite"),
])
def test_a_bundle_with_an_impossible_value_is_refused_in_one_line(tmp_path, name, value, message):
    checkpoint = save_checkpoint(tmp_path / "ckpt", trained_agent(), actions=TRAINED)
    path = save_bundle(tmp_path / "policy", read_policy(checkpoint))
    arrays, meta = mx.load(str(path), return_metadata=True)
    arrays[name] = mx.full(arrays[name].shape, value)
    bad = tmp_path / "bad.safetensors"
    mx.save_safetensors(str(bad), arrays, metadata=meta)
    for load in (load_bundle, read_policy):
        with pytest.raises(BundleError, match=message) as caught:
            load(bad)
        assert str(caught.value).startswith(str(bad)) and "\n" not in str(caught.value)


def test_read_policy_refuses_a_checkpoint_with_a_negative_variance(tmp_path):
    checkpoint = save_checkpoint(tmp_path / "ckpt", trained_agent(), actions=TRAINED)
    arrays, meta = mx.load(str(checkpoint), return_metadata=True)
    arrays["model/normalizer.var"] = -arrays["model/normalizer.var"]
    bad = tmp_path / "bad.safetensors"
    mx.save_safetensors(str(bad), arrays, metadata=meta)
    with pytest.raises(BundleError, match="bad.safetensors: normalizer.var holds -"):
        read_policy(bad)
