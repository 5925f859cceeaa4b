"""PPOTrainer's losses: advantage normalization (once over the rollout or per mini-batch,
with its floor) and the bounds loss on the action mean."""

from collections.abc import Iterator

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from ppo_harness import (
    OBS_DIM,
    assert_same_state,
    filled_buffer,
    make_model,
    make_trainer,
    ppo_config,
)

from unilab_ros.rl.buffer import MiniBatch, RolloutBuffer
from unilab_ros.rl.model import MLPActorCritic

# ---- advantage normalization ----------------------------------------------------------


def set_advantages(buffer: RolloutBuffer, scale: float, offset: float = 0.0,
                   seed: int = 0) -> np.ndarray:
    """Give the buffer raw advantages of the given spread; return a copy of them."""
    rng = np.random.default_rng(100 + seed)
    raw = offset + scale * rng.normal(size=buffer.advantages.shape)
    buffer.advantages = raw.astype(np.float32)
    return buffer.advantages.copy()


def record_batches(buffer: RolloutBuffer) -> list[np.ndarray]:
    """Make ``buffer`` remember the advantages of the mini-batches it serves."""
    seen: list[np.ndarray] = []
    generate = buffer.mini_batch_generator

    def recording(*args, **kwargs) -> Iterator[MiniBatch]:
        for batch in generate(*args, **kwargs):
            seen.append(np.array(batch.advantages, np.float64))
            yield batch

    buffer.mini_batch_generator = recording
    return seen


def test_advantages_are_normalized_once_over_the_rollout():
    model = make_model()
    trainer = make_trainer(model, ppo_config(num_learning_epochs=1))
    buffer = filled_buffer(model)
    raw = set_advantages(buffer, scale=3.0, offset=5.0).astype(np.float64)
    served = record_batches(buffer)
    metrics = trainer.update(buffer)
    expected = (raw - raw.mean()) / (raw.std() + 1e-8)
    np.testing.assert_allclose(buffer.advantages, expected, rtol=0.0, atol=1e-5)
    np.testing.assert_allclose(np.sort(np.concatenate(served)), np.sort(expected.ravel()),
                               rtol=0.0, atol=1e-5)
    # The loss uses the served advantages as they are: no second normalization per batch.
    batch_stds = [float(np.std(batch)) for batch in served]
    assert metrics["adv_std"] == pytest.approx(np.mean(batch_stds), rel=1e-4)
    assert abs(np.mean(batch_stds) - 1.0) > 1e-3
    assert metrics["adv_std_floor"] == 0.0  # no earlier rollout to floor it by


def test_per_mini_batch_flag_normalizes_each_mini_batch_alone():
    model = make_model()
    trainer = make_trainer(model, ppo_config(normalize_advantage_per_mini_batch=True))
    buffer = filled_buffer(model)
    raw = set_advantages(buffer, scale=3.0, offset=5.0)
    served = record_batches(buffer)
    metrics = trainer.update(buffer)
    # Served raw, each normalized in the loss to unit std.
    np.testing.assert_array_equal(buffer.advantages, raw)
    assert np.mean(np.concatenate(served)) > 3.0
    assert metrics["adv_std"] == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("per_mini_batch", [False, True])
@pytest.mark.parametrize("floor", [0.1, 0.0])
def test_a_rollout_with_almost_no_advantage_spread_is_not_blown_up(per_mini_batch, floor):
    model = make_model()
    cfg = ppo_config(num_learning_epochs=1, advantage_std_floor=floor,
                     normalize_advantage_per_mini_batch=per_mini_batch)
    trainer = make_trainer(model, cfg)
    first = filled_buffer(model)
    first_std = float(np.std(set_advantages(first, scale=2.0)))
    assert trainer.update(first)["adv_std_floor"] == 0.0
    assert trainer.schedule_state["adv_std_mean"].item() == pytest.approx(first_std, rel=1e-5)

    # A rollout whose advantages spread 1000x less than the earlier ones did.
    second = filled_buffer(model, seed=1)
    raw = set_advantages(second, scale=2e-3, seed=1)
    served = record_batches(second)
    metrics = trainer.update(second)
    std_floor = floor * first_std
    assert metrics["adv_std_floor"] == pytest.approx(std_floor, rel=1e-5)
    # The running mean takes the new rollout in after its own floor was set.
    running = trainer.schedule_state["adv_std_mean"].item()
    assert running == pytest.approx((first_std + float(np.std(raw))) / 2.0, rel=1e-5)
    if per_mini_batch:
        used = [np.std(b) / (max(np.std(b), std_floor) + 1e-8) for b in served]
        assert metrics["adv_std"] == pytest.approx(np.mean(used), rel=1e-3)
    else:
        used_std = float(np.std(second.advantages))
        assert used_std == pytest.approx(np.std(raw) / (max(np.std(raw), std_floor) + 1e-8),
                                         rel=1e-3)
    if floor:
        # Scaled by the floor (0.1 x a spread 1000x larger): std about 0.01, not 1.
        assert metrics["adv_std"] < 0.02
    else:
        assert metrics["adv_std"] == pytest.approx(1.0, abs=1e-3) if per_mini_batch else (
            np.std(second.advantages) == pytest.approx(1.0, abs=1e-4))


# ---- bounds loss ------------------------------------------------------------------------

BOUNDS = (np.array([-1.0, -0.5], np.float32), np.array([1.0, 0.2], np.float32))


def constant_mean_model(mean: list[float]) -> MLPActorCritic:
    """A model whose action mean is ``mean`` for every observation."""
    model = make_model()
    last = model.actor.layers[-1]
    last.weight = mx.zeros(last.weight.shape)
    last.bias = mx.array(mean, mx.float32)
    mx.eval(model.parameters())
    return model


def zero_advantage_buffer(model: MLPActorCritic) -> RolloutBuffer:
    buffer = filled_buffer(model)
    buffer.advantages[:] = 0.0
    return buffer


def actor_state(model: MLPActorCritic) -> dict[str, np.ndarray]:
    tree = {"actor": model.actor.parameters(), "std": model.std}
    return {name: np.array(value) for name, value in tree_flatten(tree)}


@pytest.mark.parametrize(
    ("mean", "loss", "out_of_bounds"),
    [
        pytest.param([3.0, 0.1], 2.0**2, 0.5, id="one-dim-above"),
        pytest.param([-2.5, 0.7], 1.5**2 + 0.5**2, 1.0, id="below-and-above"),
        pytest.param([0.5, -0.4], 0.0, 0.0, id="inside"),
    ],
)
def test_bounds_loss_is_the_squared_excess_beyond_the_limits(mean, loss, out_of_bounds):
    model = constant_mean_model(mean)
    cfg = ppo_config(num_learning_epochs=1, num_mini_batches=1, bounds_loss_coef=1.0)
    trainer = make_trainer(model, cfg, action_bounds=BOUNDS)
    before = actor_state(model)
    metrics = trainer.update(zero_advantage_buffer(model))
    assert metrics["bounds_loss"] == pytest.approx(loss, rel=1e-5)
    assert metrics["mean_out_of_bounds"] == out_of_bounds
    moved = {name for name, value in actor_state(model).items()
             if not np.array_equal(value, before[name])}
    # With zero advantages only the bounds loss moves the actor, and only from outside.
    assert moved == ({"actor.layers.1.bias", "actor.layers.1.weight"} if loss else set())


@pytest.mark.parametrize("coef", [1.0, 0.0])
def test_bounds_loss_pulls_a_mean_outside_the_limits_back_inside(coef):
    model = constant_mean_model([3.0, -2.0])
    # Full-batch steps: the pull is the same for every sample.
    cfg = ppo_config(bounds_loss_coef=coef, learning_rate=0.02, max_learning_rate=0.02,
                     num_mini_batches=1, num_learning_epochs=8)
    trainer = make_trainer(model, cfg, action_bounds=BOUNDS)
    buffer = zero_advantage_buffer(model)
    obs = mx.array(buffer.observations.reshape(-1, OBS_DIM))
    before = actor_state(model)
    history = [trainer.update(buffer) for _ in range(8)]
    mean = np.array(model.policy(obs))
    low, high = BOUNDS
    assert history[0]["mean_out_of_bounds"] > 0.99
    if coef:
        assert history[0]["bounds_loss"] > 1.0
        assert np.all(mean >= low) and np.all(mean <= high)
        assert history[-1]["bounds_loss"] == 0.0 and history[-1]["mean_out_of_bounds"] == 0.0
    else:
        # Nothing else pulls: the clipped command would hide the runaway mean.
        assert_same_state(actor_state(model), before)
        assert history[-1]["mean_out_of_bounds"] == 1.0


def test_no_action_bounds_means_no_bounds_loss():
    model = constant_mean_model([30.0, -20.0])
    cfg = ppo_config(num_learning_epochs=1, bounds_loss_coef=1.0)
    metrics = make_trainer(model, cfg).update(zero_advantage_buffer(model))
    assert metrics["bounds_loss"] == 0.0 and metrics["mean_out_of_bounds"] == 0.0


