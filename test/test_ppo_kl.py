"""PPOTrainer's learning rate and KL control: rsl_rl's adaptive rule, mini-batch by
mini-batch, its bounds, the fixed schedule, and the KL early stop."""

import math
from collections.abc import Iterator

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from ppo_harness import (
    ACTION_DIM,
    adaptive_config,
    assert_same_state,
    filled_buffer,
    make_model,
    make_trainer,
    ppo_config,
    state_copy,
)

from unilab_ros.rl.buffer import MiniBatch, RolloutBuffer
from unilab_ros.rl.distributions import diag_gaussian_log_prob
from unilab_ros.rl.ppo import PPOTrainer
from unilab_ros.rl.ppo_config import PPOConfig


def adaptations(ratio: float, factor: float) -> int:
    """How many times ``factor`` was applied to get ``ratio`` (asserting it is a power)."""
    count = round(math.log(ratio) / math.log(factor))
    assert ratio == pytest.approx(factor**count, rel=1e-4)
    return count


def steer_kls(buffer: RolloutBuffer, trainer: PPOTrainer, kls: list[float], seen: list) -> None:
    """Serve the mini-batches with old policies that put batch k's KL at ``kls[k]``.

    Just before batch k is served, its old mean is set to the model's current mean shifted
    by std * sqrt(2 kl / ACTION_DIM) in every dim, so KL(old || new) = kl when its step
    measures it; the old log-probs follow. ``seen`` gets, per served batch, the state and
    the learning rate before its step, and the largest ratio that step measures.
    """
    generate = buffer.mini_batch_generator

    def generator(num_mini_batches: int, num_epochs: int, key=None) -> Iterator[MiniBatch]:
        batches = generate(num_mini_batches, num_epochs, key=key)
        for kl, batch in zip(kls, batches, strict=True):
            mean, std, log_std = trainer.model.distribution_params(batch.obs)
            old_mean = mean + std * math.sqrt(2.0 * kl / ACTION_DIM)
            old_log_probs = diag_gaussian_log_prob(batch.actions, old_mean, log_std)
            log_ratio = diag_gaussian_log_prob(batch.actions, mean, log_std) - old_log_probs
            seen.append({
                "state": state_copy(trainer),
                "lr": trainer.learning_rate,
                "ratio_max": float(mx.max(mx.exp(log_ratio)).item()),
            })
            yield batch._replace(old_mean=old_mean, old_std=std, old_log_probs=old_log_probs)

    buffer.mini_batch_generator = generator


def rsl_rl_rates(learning_rate: float, kls: list[float], cfg: PPOConfig) -> list[float]:
    """The rate each mini-batch steps with, by rsl_rl's rule (PPO.update, "adaptive")."""
    rates = []
    for kl in kls:
        if kl > cfg.desired_kl * 2.0:
            learning_rate = max(cfg.min_learning_rate, learning_rate / 1.5)
        elif kl < cfg.desired_kl / 2.0 and kl > 0.0:
            learning_rate = min(cfg.max_learning_rate, learning_rate * 1.5)
        rates.append(learning_rate)
    return rates


STEERED_KLS = [0.3, 0.3, 0.3, 0.001, 0.001, 0.01, 0.001, 0.015]
"""Above 2 x desired_kl three times, below half of it, in between (no change), ..."""


@pytest.mark.parametrize(
    "bounds",
    [
        pytest.param({}, id="default-bounds"),
        pytest.param({"min_learning_rate": 4e-4, "max_learning_rate": 1.2e-3}, id="bounded"),
    ],
)
@pytest.mark.parametrize("enable_compile", [True, False])
def test_adaptive_rate_follows_rsl_rl_mini_batch_by_mini_batch(bounds, enable_compile):
    model = make_model()
    cfg = adaptive_config(**bounds)
    trainer = make_trainer(model, cfg, enable_compile=enable_compile)
    buffer = filled_buffer(model)
    seen: list = []
    steer_kls(buffer, trainer, STEERED_KLS, seen)
    metrics = trainer.update(buffer)
    expected = rsl_rl_rates(cfg.learning_rate, STEERED_KLS, cfg)
    if bounds:
        # Both bounds are reached: 1e-3 / 1.5**3 < 4e-4 and 9e-4 * 1.5 > 1.2e-3.
        assert min(expected) == cfg.min_learning_rate and max(expected) == cfg.max_learning_rate
    # The rate before each step is the one the previous steps left.
    rates_before = [entry["lr"] for entry in seen]
    np.testing.assert_allclose(rates_before, [cfg.learning_rate, *expected[:-1]], rtol=1e-5)
    assert metrics["learning_rate"] == pytest.approx(expected[-1], rel=1e-5)
    assert trainer.learning_rate == pytest.approx(expected[-1], rel=1e-5)
    # The swing within the update shows, not only where it ended.
    assert metrics["learning_rate_min"] == pytest.approx(min(expected), rel=1e-5)
    assert metrics["learning_rate_max"] == pytest.approx(max(expected), rel=1e-5)
    assert metrics["approx_kl"] == pytest.approx(np.mean(STEERED_KLS), abs=1e-4)
    assert metrics["approx_kl_max"] == pytest.approx(max(STEERED_KLS), rel=1e-3)
    assert metrics["ratio_max"] == pytest.approx(max(e["ratio_max"] for e in seen), rel=1e-4)
    assert metrics["updates_applied"] == len(STEERED_KLS)


@pytest.mark.parametrize(
    ("schedule", "kl", "factor"),
    [
        pytest.param("adaptive", 0.3, 1.0 / 1.5, id="kl-large"),
        pytest.param("adaptive", 0.001, 1.5, id="kl-small"),
        pytest.param("adaptive", 0.01, 1.0, id="kl-on-target"),
        pytest.param("fixed", 0.3, 1.0, id="fixed"),
    ],
)
def test_the_rate_adapted_on_a_mini_batch_drives_that_mini_batchs_step(schedule, kl, factor):
    model = make_model()
    cfg = adaptive_config(schedule=schedule, num_learning_epochs=1, num_mini_batches=1)
    trainer = make_trainer(model, cfg)
    buffer = filled_buffer(model)
    steer_kls(buffer, trainer, [kl], [])
    before = state_copy(trainer)
    trainer.update(buffer)
    after = state_copy(trainer)
    trainable = [name for name, _ in tree_flatten(model.trainable_parameters())]
    largest = max(np.max(np.abs(after[f"model.{n}"] - before[f"model.{n}"])) for n in trainable)
    # Adam's first step moves every parameter with a gradient by the rate (m / sqrt(v) = +-1).
    assert largest == pytest.approx(cfg.learning_rate * factor, rel=1e-3)


@pytest.mark.parametrize(
    ("kl", "factor"),
    [
        pytest.param(0.03, 1.0 / 1.5, id="above-twice-desired"),
        pytest.param(0.015, 1.0, id="between"),
        pytest.param(0.001, 1.5, id="below-half-desired"),
        # rsl_rl grows the rate only on a positive KL (a guarded KL can come out <= 0).
        pytest.param(0.0, 1.0, id="zero"),
        pytest.param(-1e-6, 1.0, id="negative"),
    ],
)
def test_rsl_rl_rule_on_one_kl(kl, factor):
    trainer = make_trainer(make_model(), adaptive_config())
    trainer._adapt_learning_rate(mx.array(kl, mx.float32), mx.array(1.0))
    assert trainer.learning_rate == pytest.approx(1e-3 * factor, rel=1e-6)


@pytest.mark.parametrize("enable_compile", [True, False])
def test_adaptive_rate_falls_when_kl_is_large(enable_compile):
    model = make_model()
    cfg = adaptive_config(min_learning_rate=1e-7)
    trainer = make_trainer(model, cfg, enable_compile=enable_compile)
    # An old policy 1.0 away in each of 2 dims: KL about 1.5, far above 2 * desired_kl.
    metrics = trainer.update(filled_buffer(model, old_mean_offset=1.0))
    assert metrics["approx_kl"] > 2.0 * cfg.desired_kl
    # 8 mini-batches, each dividing the rate by 1.5 (rsl_rl).
    assert adaptations(cfg.learning_rate / metrics["learning_rate"], 1.5) == 8
    assert trainer.learning_rate == pytest.approx(metrics["learning_rate"])
    assert metrics["learning_rate_max"] == pytest.approx(cfg.learning_rate / 1.5, rel=1e-5)


@pytest.mark.parametrize("enable_compile", [True, False])
def test_adaptive_rate_rises_when_kl_is_tiny(enable_compile):
    model = make_model()
    cfg = adaptive_config(learning_rate=1e-5, min_learning_rate=1e-6)
    trainer = make_trainer(model, cfg, enable_compile=enable_compile)
    # KL about 2 * 0.01**2 / (2 * 0.8**2) = 1.6e-4: positive, and far below desired_kl / 2.
    metrics = trainer.update(filled_buffer(model, old_mean_offset=0.01))
    assert 0.0 < metrics["approx_kl"] < 0.5 * cfg.desired_kl
    assert adaptations(metrics["learning_rate"] / cfg.learning_rate, 1.5) == 8
    assert metrics["learning_rate_min"] == pytest.approx(cfg.learning_rate * 1.5, rel=1e-5)


def test_adaptive_rate_respects_its_bounds():
    model = make_model()
    cfg = adaptive_config(min_learning_rate=5e-4)
    metrics = make_trainer(model, cfg).update(filled_buffer(model, old_mean_offset=1.0))
    assert metrics["learning_rate"] == pytest.approx(5e-4)

    model = make_model()
    cfg = adaptive_config(learning_rate=1e-5, min_learning_rate=1e-6, max_learning_rate=1.5e-5)
    metrics = make_trainer(model, cfg).update(filled_buffer(model, old_mean_offset=0.01))
    assert metrics["learning_rate"] == pytest.approx(1.5e-5)


def test_fixed_schedule_keeps_the_rate():
    model = make_model()
    cfg = adaptive_config(schedule="fixed")
    metrics = make_trainer(model, cfg).update(filled_buffer(model, old_mean_offset=1.0))
    assert metrics["learning_rate"] == pytest.approx(cfg.learning_rate)
    assert metrics["learning_rate_min"] == metrics["learning_rate_max"] == metrics[
        "learning_rate"]


def kl_stop_trainer(enable_compile: bool) -> tuple:
    """A fresh model and a trainer that stops an update's epochs at a KL of 0.05."""
    model = make_model()
    cfg = ppo_config(num_learning_epochs=4, target_kl_stop=0.05)
    return model, make_trainer(model, cfg, enable_compile=enable_compile)


@pytest.mark.parametrize("enable_compile", [True, False])
def test_target_kl_stop_on_the_first_mini_batch_changes_nothing(enable_compile):
    model, trainer = kl_stop_trainer(enable_compile)
    before = state_copy(trainer)
    metrics = trainer.update(filled_buffer(model, old_mean_offset=1.0))
    assert metrics["early_stopped_kl"] == 1.0
    # The first mini-batch's KL (about 1.5) is over the target: it is not applied.
    assert metrics["updates_applied"] == 0.0
    assert_same_state(state_copy(trainer), before)
    assert all(math.isfinite(value) for value in metrics.values())


@pytest.mark.parametrize("enable_compile", [True, False])
def test_target_kl_stop_drops_the_step_over_the_target_and_ends_the_epochs(enable_compile):
    model, trainer = kl_stop_trainer(enable_compile)
    buffer = filled_buffer(model)
    seen: list = []
    steer_kls(buffer, trainer, [0.001, 0.002, 0.2] + [0.001] * 13, seen)
    metrics = trainer.update(buffer)
    # No mini-batch after the third was served; the third's step left the model and
    # Adam's moments (and step count) as they were before it.
    assert len(seen) == 3
    assert_same_state(state_copy(trainer), seen[2]["state"])
    assert not np.array_equal(seen[2]["state"]["model.std"], seen[0]["state"]["model.std"])
    assert metrics["early_stopped_kl"] == 1.0
    assert metrics["updates_applied"] == 2.0
    # The metrics cover the two applied steps only.
    assert metrics["approx_kl_max"] == pytest.approx(0.002, abs=1e-4)
    assert metrics["approx_kl"] == pytest.approx(0.0015, abs=1e-4)

    # The next update starts afresh.
    buffer = filled_buffer(model, seed=1)
    steer_kls(buffer, trainer, [0.001] * 16, seen)
    metrics = trainer.update(buffer)
    assert metrics["early_stopped_kl"] == 0.0
    assert metrics["updates_applied"] == 16.0


def test_target_kl_stop_keeps_the_rate_the_schedule_set_for_the_stopped_step():
    model = make_model()
    cfg = adaptive_config(target_kl_stop=0.05)
    trainer = make_trainer(model, cfg)
    buffer = filled_buffer(model)
    steer_kls(buffer, trainer, [0.001, 0.3] + [0.001] * 6, [])
    metrics = trainer.update(buffer)
    assert metrics["updates_applied"] == 1.0 and metrics["early_stopped_kl"] == 1.0
    # Step 1 raised the rate and was applied; step 2 lowered it and was stopped.
    assert metrics["learning_rate"] == pytest.approx(cfg.learning_rate, rel=1e-5)
    assert metrics["learning_rate_min"] == pytest.approx(1.5 * cfg.learning_rate, rel=1e-5)
    assert metrics["learning_rate_max"] == pytest.approx(1.5 * cfg.learning_rate, rel=1e-5)


def test_target_kl_stop_does_not_fire_below_the_target():
    model = make_model()
    cfg = ppo_config(target_kl_stop=10.0)
    metrics = make_trainer(model, cfg).update(filled_buffer(model, old_mean_offset=0.01))
    assert metrics["early_stopped_kl"] == 0.0
    assert metrics["updates_applied"] == 8.0


