"""Fine-tuning from a policy (rl/finetune.py) and the sim -> export -> deploy -> fine-tune path.

The path runs in-process on Pendulum (rl/demo.train, the trainer node's own loop), with a
short budget; the options are checked on tiny sizes.
"""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from unilab_ros.config.paths import config_file
from unilab_ros.config.training_setup import load_setup
from unilab_ros.rl.actions import ActionConfig, ActionMapper
from unilab_ros.rl.agent import AgentConfig, PPOAgent
from unilab_ros.rl.bundle import bundle_from_agent, read_policy, save_bundle
from unilab_ros.rl.finetune import FineTuneConfig, make_agent
from unilab_ros.rl.model import ModelConfig
from unilab_ros.rl.policy import PolicySampler
from unilab_ros.rl.ppo_config import PPOConfig
from unilab_ros.rl.ppo_runtime import PPORuntimeConfig
from unilab_ros.sims.gym_vector import GymVectorSim
from unilab_ros.tools.demo import train

SIZES = AgentConfig(num_envs=4, obs_dim=3, action_dim=2, num_steps=8)
MODEL = ModelConfig(actor_hidden_dims=[16], critic_hidden_dims=[16])
ACTIONS = ActionConfig(action_scale=[2.0], action_low=[-2.0], action_high=[2.0])
EAGER = PPORuntimeConfig(enable_compile=False)
"""Uncompiled steps: these tests run a handful of tiny updates."""


def ppo(**fields) -> PPOConfig:
    return PPOConfig(num_learning_epochs=2, num_mini_batches=2, **fields)


def rollout(agent: PPOAgent, rng: np.random.Generator) -> None:
    """Fill the rollout with random observations and rewards, then update."""
    while not agent.rollout_full:
        obs = rng.normal(2.0, 3.0, (SIZES.num_envs, SIZES.obs_dim)).astype(np.float32)
        agent.record(
            obs,
            agent.act(obs),
            rng.normal(size=SIZES.num_envs),
            np.zeros(SIZES.num_envs, np.uint8),
        )
    agent.update(rng.normal(size=(SIZES.num_envs, SIZES.obs_dim)).astype(np.float32))


@pytest.fixture
def trained_bundle(tmp_path):
    """A bundle of a policy with non-trivial observation statistics."""
    agent = PPOAgent(SIZES, MODEL, ppo(), runtime_cfg=EAGER)
    rollout(agent, np.random.default_rng(0))
    return save_bundle(tmp_path / "policy", bundle_from_agent(agent, ACTIONS, "test")), agent


def actor_arrays(agent: PPOAgent) -> dict[str, np.ndarray]:
    return {
        name: np.array(value)
        for name, value in tree_flatten(agent.model.parameters())
        if not name.startswith("critic.")
    }


def test_the_deployed_bundle_acts_as_the_trainer_for_the_same_observations(trained_bundle):
    path, trainer = trained_bundle
    # What policy_node does on configure and per observation (deterministic by default).
    policy = read_policy(path)
    deployed = PolicySampler(policy.model(), policy.seed)
    mapper = ActionMapper(policy.actions, SIZES.num_envs, SIZES.action_dim)
    trainer_mapper = ActionMapper(ACTIONS, SIZES.num_envs, SIZES.action_dim)
    obs = np.random.default_rng(1).normal(2.0, 3.0, (SIZES.num_envs, SIZES.obs_dim))
    obs = obs.astype(np.float32)
    np.testing.assert_array_equal(
        mapper(deployed(obs, deterministic=True)),
        trainer_mapper(trainer.act(obs, deterministic=True)),
    )


def test_fine_tuning_starts_from_the_actor_and_normalizer_with_a_fresh_critic(trained_bundle):
    path, source = trained_bundle
    agent, notes = make_agent(
        SIZES, MODEL, ppo(), None, ACTIONS, FineTuneConfig(str(path)), runtime_cfg=EAGER
    )
    assert notes == []
    for name, value in actor_arrays(source).items():
        if name != "normalizer.count":
            np.testing.assert_array_equal(actor_arrays(agent)[name], value, err_msg=name)
    # The statistics weigh as the env steps they came from.
    assert float(agent.model.normalizer.count.item()) == source.env_steps
    fresh = PPOAgent(SIZES, MODEL, ppo(), runtime_cfg=EAGER)
    for (name, ours), (_, theirs) in zip(
        tree_flatten(agent.model.critic.parameters()),
        tree_flatten(fresh.model.critic.parameters()),
        strict=True,
    ):
        np.testing.assert_array_equal(np.array(ours), np.array(theirs), err_msg=name)
    assert agent.iteration == 0 and agent.env_steps == 0


def test_the_critic_warm_up_and_a_frozen_normalizer_leave_the_actor_as_it_came(trained_bundle):
    path, _ = trained_bundle
    options = FineTuneConfig(str(path), freeze_normalizer=True, critic_warmup_iterations=2)
    agent, _ = make_agent(
        SIZES, MODEL, ppo(schedule="adaptive"), None, ACTIONS, options, runtime_cfg=EAGER
    )
    start, critic = actor_arrays(agent), np.array(agent.model.critic.layers[0].weight)
    rate = agent.trainer.learning_rate
    rng = np.random.default_rng(2)
    for _ in range(2):
        rollout(agent, rng)
    for name, value in actor_arrays(agent).items():
        np.testing.assert_array_equal(value, start[name], err_msg=name)
    assert not np.array_equal(np.array(agent.model.critic.layers[0].weight), critic)
    assert agent.trainer.learning_rate == pytest.approx(rate)  # no KL to adapt to
    rollout(agent, rng)  # the warm-up is over: the actor learns
    assert not np.array_equal(
        actor_arrays(agent)["actor.layers.0.weight"], start["actor.layers.0.weight"]
    )
    np.testing.assert_array_equal(actor_arrays(agent)["normalizer.mean"], start["normalizer.mean"])


def test_an_initial_std_override_and_the_anchor(trained_bundle):
    path, _ = trained_bundle
    options = FineTuneConfig(str(path), init_std=0.3)
    far, near = (
        make_agent(
            SIZES,
            MODEL,
            ppo(anchor_coef=coef, learning_rate=3e-3),
            None,
            ACTIONS,
            options,
            runtime_cfg=EAGER,
        )[0]
        for coef in (0.0, 100.0)
    )
    np.testing.assert_allclose(np.array(far.model.std), 0.3)
    for agent in (far, near):
        rng = np.random.default_rng(3)
        for _ in range(3):
            rollout(agent, rng)
    obs = mx.array(np.random.default_rng(4).normal(2.0, 3.0, (64, SIZES.obs_dim)), mx.float32)
    anchor_mean = np.array(read_policy(path).model().policy(obs))
    drift = {
        name: float(np.mean((np.array(agent.model.policy(obs)) - anchor_mean) ** 2))
        for name, agent in (("far", far), ("near", near))
    }
    assert drift["near"] < 0.5 * drift["far"], drift


def test_fine_tuning_options_without_a_policy_or_with_a_wrong_one_are_refused(
    trained_bundle, tmp_path
):
    path, _ = trained_bundle
    with pytest.raises(ValueError, match="anchor_coef needs init_from"):
        make_agent(SIZES, MODEL, ppo(anchor_coef=1.0), None, ACTIONS, runtime_cfg=EAGER)
    with pytest.raises(ValueError, match="need init_from"):
        make_agent(
            SIZES,
            MODEL,
            ppo(),
            None,
            ACTIONS,
            FineTuneConfig(critic_warmup_iterations=1),
            runtime_cfg=EAGER,
        )
    other = AgentConfig(num_envs=4, obs_dim=5, action_dim=2, num_steps=8)
    with pytest.raises(ValueError, match="2 policy; the trainer is configured for 5 -> 2"):
        make_agent(
            other, MODEL, ppo(), None, ACTIONS, FineTuneConfig(str(path)), runtime_cfg=EAGER
        )
    with pytest.raises(ValueError, match="no policy file"):
        make_agent(
            SIZES,
            MODEL,
            ppo(),
            None,
            ACTIONS,
            FineTuneConfig(str(tmp_path / "none")),
            runtime_cfg=EAGER,
        )
    with pytest.raises(ValueError, match="outside the policy's std bounds"):
        make_agent(
            SIZES,
            MODEL,
            ppo(),
            None,
            ACTIONS,
            FineTuneConfig(str(path), init_std=99.0),
            runtime_cfg=EAGER,
        )
    # Other actor settings are taken from the policy, and said.
    wide = ModelConfig(actor_hidden_dims=[32], critic_hidden_dims=[16])
    agent, notes = make_agent(
        SIZES, wide, ppo(), None, ACTIONS, FineTuneConfig(str(path)), runtime_cfg=EAGER
    )
    assert agent.model_cfg.actor_hidden_dims == [16]
    assert any("actor_hidden_dims = [16] (the policy's) replaces [32]" in n for n in notes)


@pytest.mark.learning
def test_sim_export_deploy_fine_tune_keeps_learning(tmp_path):
    setup = load_setup(config_file("pendulum.yaml"))
    sim_returns: list[float] = []
    agent, _ = train(setup, 20, lambda _a, stats, _m: sim_returns.append(stats.mean_return))
    path = save_bundle(tmp_path / "pendulum", bundle_from_agent(agent, setup.actions, "sim"))
    # Deploy: the bundle's deterministic policy, as policy_node runs it, balances.
    policy = read_policy(path)
    assert deployed_return(policy, setup) > -400.0
    setup.ppo.anchor_coef = 1.0
    tuned: list[float] = []
    tuned_agent, _ = train(
        setup,
        8,
        lambda _a, stats, _m: tuned.append(stats.mean_return),
        fine_tune=FineTuneConfig(str(path), critic_warmup_iterations=4),
    )
    # The run holds what the bundle does and improves on its rolling mean. The hold is
    # judged on the same 32 evaluation episodes for both policies, with a margin that
    # holds over seeds: eight updates move a half-trained Pendulum policy's deterministic
    # return, and on seeds 0-3 (2026-12-03, AMD EPYC) the tuned policy scored 0-13% under
    # the bundle's (a fixed 10 failed three of the four).
    after = save_bundle(tmp_path / "tuned", bundle_from_agent(tuned_agent, setup.actions, "sim"))
    before_return = deployed_return(policy, setup)
    after_return = deployed_return(read_policy(after), setup)
    print(f"sim {sim_returns[-1]:.1f}; fine-tuning {tuned[1]:.1f} -> {tuned[-1]:.1f}; "
          f"deployed {before_return:.1f} -> {after_return:.1f}")
    assert after_return > before_return - 0.25 * abs(before_return)
    assert tuned[-1] > sim_returns[-1]


def deployed_return(policy, setup) -> float:
    """Mean return of one 200-step episode per env with the deterministic policy, over 32
    start states (a mean of 4 moves by tens with the start states alone)."""
    num_envs = 32
    sim = GymVectorSim(setup.env_id, num_envs, 100, setup.max_episode_steps)
    try:
        sampler = PolicySampler(policy.model(), policy.seed)
        mapper = ActionMapper(policy.actions, num_envs, policy.action_dim)
        obs, total = sim.reset(), np.zeros(num_envs)
        for _ in range(200):
            step = sim.step(mapper(sampler(obs, deterministic=True)))
            total += step.reward
            obs = step.observation
        return float(total.mean())
    finally:
        sim.close()


@pytest.mark.parametrize(("name", "value", "message"), [
    ("normalizer.var", -1.0, "normalizer.var holds -1: it must be >= 0"),
    ("std", float("nan"), "std holds non-finite"),
    ("source", -10, "source.env_steps is -10: it must be a count >= 0"),
])
def test_fine_tuning_refuses_a_policy_with_an_impossible_value(
    trained_bundle, tmp_path, name, value, message
):
    path, _ = trained_bundle
    arrays, header = mx.load(str(path), return_metadata=True)
    if name == "source":
        meta = json.loads(header["bundle"])
        meta["source"]["env_steps"] = value
        header = header | {"bundle": json.dumps(meta)}
    else:
        arrays[name] = mx.full(arrays[name].shape, value)
    bad = tmp_path / "bad.safetensors"
    mx.save_safetensors(str(bad), arrays, metadata=header)
    with pytest.raises(ValueError, match=message):
        make_agent(SIZES, MODEL, ppo(), None, ACTIONS, FineTuneConfig(str(bad)),
                   runtime_cfg=EAGER)


def test_the_anchor_loss_runs_compiled_with_the_uncompiled_result(trained_bundle, caplog):
    path, _ = trained_bundle
    agents = [
        make_agent(SIZES, MODEL, ppo(anchor_coef=1.0, learning_rate=3e-3), None, ACTIONS,
                   FineTuneConfig(str(path), init_std=0.3),
                   runtime_cfg=PPORuntimeConfig(enable_compile=compiled))[0]
        for compiled in (True, False)
    ]
    for agent in agents:
        rollout(agent, np.random.default_rng(5))
    compiled, eager = agents
    assert compiled.trainer.compile_error is None
    assert not [r for r in caplog.records if "mx.compile failed" in r.getMessage()]
    expected = actor_arrays(eager)
    for name, value in actor_arrays(compiled).items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-4, atol=1e-6, err_msg=name)
    assert not np.array_equal(expected["actor.layers.0.weight"],
                              np.array(read_policy(path).arrays["actor.layers.0.weight"]))
