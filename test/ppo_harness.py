"""The PPOTrainer tests' harness: small settings, a tiny actor-critic, a recorded rollout
whose old policy is shifted by a chosen offset (which sets the first mini-batch's KL), and
host copies of the trainer's state to compare before and after an update.
"""


import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from unilab_ros.rl.buffer import RolloutBuffer
from unilab_ros.rl.distributions import diag_gaussian_log_prob
from unilab_ros.rl.model import MLPActorCritic, ModelConfig
from unilab_ros.rl.ppo import PPOTrainer
from unilab_ros.rl.ppo_config import PPOConfig
from unilab_ros.rl.ppo_runtime import PPORuntimeConfig

OBS_DIM, ACTION_DIM = 3, 2


def ppo_config(**overrides) -> PPOConfig:
    """Small test settings."""
    fields = {"num_learning_epochs": 2, "num_mini_batches": 4}
    return PPOConfig(**(fields | overrides))


def adaptive_config(**overrides) -> PPOConfig:
    """Small settings with rsl_rl's adaptive learning rate."""
    fields = {
        "schedule": "adaptive",
        "learning_rate": 1e-3,
        "desired_kl": 0.01,
        "num_learning_epochs": 2,
        "num_mini_batches": 4,
    } | overrides
    return ppo_config(**fields)


def make_trainer(
    model: MLPActorCritic,
    cfg: PPOConfig,
    seed: int = 0,
    action_bounds: tuple[np.ndarray, np.ndarray] | None = None,
    **runtime,
) -> PPOTrainer:
    """A trainer with ``runtime`` settings. Compiled steps are opted into per test: on CPU,
    mx.compile builds its fused kernels with the C++ compiler on first use (about a second
    each, cached under $TMPDIR/mlx), so the compiled tests share one mini-batch shape (8 of
    32 samples)."""
    settings = PPORuntimeConfig(**({"enable_compile": False} | runtime))
    return PPOTrainer(model, cfg, seed, action_bounds, settings)


def make_model(seed: int = 0) -> MLPActorCritic:
    mx.random.seed(seed)
    cfg = ModelConfig(actor_hidden_dims=[16], critic_hidden_dims=[16], init_noise_std=0.8)
    model = MLPActorCritic(OBS_DIM, ACTION_DIM, cfg)
    mx.eval(model.parameters())
    return model


def filled_buffer(
    model: MLPActorCritic,
    num_envs: int = 4,
    num_steps: int = 8,
    old_mean_offset: float = 0.0,
    seed: int = 0,
) -> RolloutBuffer:
    """A full rollout recorded by ``model``, as if its policy had been shifted by the offset.

    The offset moves the recorded (old) policy mean away from the model's, which sets the
    KL of the first mini-batch to about ACTION_DIM * offset**2 / 2.
    """
    rng = np.random.default_rng(seed)
    shape = (num_steps, num_envs)
    obs = rng.normal(size=(*shape, OBS_DIM)).astype(np.float32)
    buffer = RolloutBuffer(num_steps, num_envs, OBS_DIM, ACTION_DIM, gamma=0.9, lam=0.9)
    mean, std, log_std = model.distribution_params(mx.array(obs.reshape(-1, OBS_DIM)))
    old_mean = mean + old_mean_offset
    actions = old_mean + std * mx.array(rng.normal(size=mean.shape).astype(np.float32))
    log_probs = diag_gaussian_log_prob(actions, old_mean, log_std)
    values = model.value(mx.array(obs.reshape(-1, OBS_DIM)))
    dones = rng.choice([0, 1, 2], p=[0.8, 0.1, 0.1], size=shape)
    actions_np = np.array(actions).reshape(*shape, ACTION_DIM)
    for t in range(num_steps):
        buffer.add(
            obs=obs[t], actions=actions_np[t], rewards=rng.normal(size=num_envs), dones=dones[t]
        )
    buffer.set_policy_outputs(log_probs, old_mean, std, values)
    buffer.compute_returns_and_advantages(rng.normal(size=num_envs))
    return buffer


def state_copy(trainer: PPOTrainer) -> dict[str, np.ndarray]:
    """Host copies of every model parameter (normalizer included) and Adam's m, v, step, lr."""
    tree = {"model": trainer.model.parameters(), "optimizer": trainer.optimizer.state}
    return {name: np.array(value) for name, value in tree_flatten(tree)}


def assert_same_state(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_array_equal(actual[name], value, err_msg=name)


def assert_all_finite(state: dict) -> None:
    for name, value in state.items():
        assert np.all(np.isfinite(value)), name
