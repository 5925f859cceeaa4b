"""The off-policy learner's actor deploys through the same bundle, numpy acting and ONNX
graph as PPO's: each gives the learner's own deterministic action (or its command)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from unilab_ros.rl.actions import ActionConfig, ActionMapper
from unilab_ros.rl.agent import AgentConfig, PPOAgent
from unilab_ros.rl.bundle import load_bundle, save_bundle
from unilab_ros.rl.policy import PolicySampler
from unilab_ros.rl.sac_agent import SACAgent
from unilab_ros.rl.sac_bundle import bundle_from_sac, sac_model_config
from unilab_ros.rl.sac_config import SACConfig

ACTIONS = ActionConfig(action_scale=[10.0, 0.5], action_low=[-20.0, -0.3],
                       action_high=[20.0, 0.4], safe_action=[0.0, 0.0])


def trained_agent() -> SACAgent:
    mapper = ActionMapper(ACTIONS, 1, 2)
    cfg = SACConfig(actor_hidden_dims=[16, 8], critic_hidden_dims=[16], batch_size=8,
                    buffer_size=100, learning_starts=0, activation="elu")
    agent = SACAgent(AgentConfig(num_envs=1, obs_dim=4, action_dim=2), cfg,
                     action_bounds=mapper.policy_bounds())
    rng = np.random.default_rng(0)
    for _ in range(30):
        obs = rng.standard_normal((1, 4)).astype(np.float32) * 3
        agent.record(obs, agent.act(obs), rng.standard_normal(1), np.zeros(1, np.uint8))
        agent.learn()
    return agent


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    agent = trained_agent()
    path = save_bundle(tmp_path_factory.mktemp("sac") / "policy",
                       bundle_from_sac(agent, ACTIONS, "test"))
    obs = np.random.default_rng(1).standard_normal((16, 4)).astype(np.float32) * 3
    return agent, load_bundle(path), obs


def test_the_bundle_acts_as_the_learner_does(saved):
    agent, bundle, obs = saved
    expected = agent.act(obs, deterministic=True)
    model = bundle.model()
    np.testing.assert_allclose(np.array(model.policy(mx.array(obs))), expected, atol=1e-5)
    sampler = PolicySampler(model, seed=0)
    for row in obs:  # the numpy path a deploy node acts through, one robot at a time
        np.testing.assert_allclose(sampler(row[None], deterministic=True)[0],
                                   agent.act(row[None], deterministic=True)[0], atol=1e-5)
    low, high = ActionMapper(ACTIONS, 1, 2).policy_bounds()
    assert np.all(expected >= low - 1e-6) and np.all(expected <= high + 1e-6)


def test_the_onnx_graph_outputs_the_learners_command(saved):
    onnx_export = pytest.importorskip("unilab_ros.rl.onnx_export")
    onnxruntime = pytest.importorskip("onnxruntime")
    agent, bundle, obs = saved
    graph = onnx_export.actor_graph(bundle)
    session = onnxruntime.InferenceSession(graph.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    (commands,) = session.run(None, {session.get_inputs()[0].name: obs})
    expected = ActionMapper(ACTIONS, len(obs), 2)(agent.act(obs, deterministic=True))
    np.testing.assert_allclose(commands, expected, atol=1e-4)


def test_ppo_refuses_a_squashed_actor():
    with pytest.raises(ValueError, match="squash_output"):
        PPOAgent(AgentConfig(obs_dim=4, action_dim=2), sac_model_config(trained_agent()))
