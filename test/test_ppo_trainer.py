"""PPOTrainer: metric keys, NaN roll-back, rsl_rl's adaptive learning rate, the KL early
stop, advantage normalization with its floor, the bounds loss, config."""

import dataclasses
import logging
import math
from collections.abc import Iterator

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map

from unilab_ros.rl.buffer import MiniBatch, RolloutBuffer
from unilab_ros.rl.distributions import diag_gaussian_log_prob
from unilab_ros.rl.model import MLPActorCritic, ModelConfig
from unilab_ros.rl.ppo import PPOTrainer
from unilab_ros.rl.ppo_config import PPOConfig
from unilab_ros.rl.ppo_runtime import PPORuntimeConfig

OBS_DIM, ACTION_DIM = 3, 2

REFERENCE_METRIC_KEYS = {
    "anchor_kl",
    "surrogate",
    "value",
    "entropy",
    "approx_kl",
    "clip_fraction",
    "ratio_mean",
    "ratio_max",
    "std_mean",
    "adv_std",
    "value_explained_variance",
    "bounds_loss",
    "mean_out_of_bounds",
    "learning_rate",
    "approx_kl_max",
    "learning_rate_min",
    "learning_rate_max",
    "adv_std_floor",
    "updates_applied",
    "skipped_nonfinite_loss",
    "skipped_nonfinite_grads",
    "rolled_back_updates",
    "early_stopped_kl",
}


def ppo_config(**overrides) -> PPOConfig:
    """Small test settings."""
    fields = {"num_learning_epochs": 2, "num_mini_batches": 4}
    return PPOConfig(**(fields | overrides))


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


def test_metric_keys_are_the_reference_keys_and_values_are_floats():
    model = make_model()
    metrics = make_trainer(model, ppo_config(), enable_compile=True).update(filled_buffer(model))
    assert set(metrics) == REFERENCE_METRIC_KEYS
    assert all(type(value) is float for value in metrics.values())
    assert all(math.isfinite(value) for value in metrics.values())


def test_first_update_starts_on_policy_and_moves_the_parameters():
    model = make_model()
    cfg = ppo_config(num_learning_epochs=1, num_mini_batches=1)
    trainer = make_trainer(model, cfg)
    before = state_copy(trainer)
    metrics = trainer.update(filled_buffer(model))
    # One mini-batch of the rollout's own policy: ratio exactly 1, nothing clipped.
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["ratio_max"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["clip_fraction"] == 0.0
    assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-4)
    assert metrics["std_mean"] == pytest.approx(0.8, rel=1e-5)
    assert metrics["learning_rate"] == pytest.approx(cfg.learning_rate)
    assert metrics["updates_applied"] == 1.0
    after = state_copy(trainer)
    changed = {name for name in before if not np.array_equal(before[name], after[name])}
    assert "model.actor.layers.0.weight" in changed and "model.critic.layers.0.weight" in changed


@pytest.mark.parametrize(
    ("num_envs", "num_steps", "num_mini_batches"),
    [(7, 5, 4), (3, 1, 2), (1, 7, 3), (5, 5, 25), (2, 9, 4)],
)
def test_any_rollout_size_with_any_mini_batch_count(num_envs, num_steps, num_mini_batches):
    model = make_model()
    cfg = ppo_config(num_mini_batches=num_mini_batches)
    metrics = make_trainer(model, cfg).update(filled_buffer(model, num_envs, num_steps))
    assert metrics["updates_applied"] == 2 * num_mini_batches
    assert metrics["rolled_back_updates"] == 0.0
    assert all(math.isfinite(value) for value in metrics.values())


@pytest.mark.parametrize("enable_compile", [True, False])
def test_nan_in_every_mini_batch_rolls_everything_back(enable_compile):
    model = make_model()
    buffer = filled_buffer(model)
    buffer.returns[:] = np.nan
    # Default check interval (8) with 4 steps: only the end-of-update check catches it.
    cfg = ppo_config(num_learning_epochs=1)
    trainer = make_trainer(model, cfg, enable_compile=enable_compile)
    before = state_copy(trainer)
    metrics = trainer.update(buffer)
    after = state_copy(trainer)
    assert_same_state(after, before)
    assert metrics["rolled_back_updates"] >= 1.0
    assert metrics["updates_applied"] == 0.0
    assert metrics["skipped_nonfinite_loss"] == 4.0
    assert all(math.isfinite(value) for value in metrics.values())

    # The trainer is usable afterwards: a clean rollout trains normally.
    clean = trainer.update(filled_buffer(model, seed=1))
    assert clean["updates_applied"] == 4.0 and clean["rolled_back_updates"] == 0.0
    assert_all_finite(state_copy(trainer))


def poison_last_batch(
    buffer: RolloutBuffer, trainer: PPOTrainer, field: str, recorded: list
) -> None:
    """Make the buffer's last mini-batch carry NaN in ``field``; record the state before it."""
    generate = buffer.mini_batch_generator

    def generator(num_mini_batches: int, num_epochs: int, key=None) -> Iterator[MiniBatch]:
        batches = list(generate(num_mini_batches, num_epochs, key=key))
        yield from batches[:-1]
        # Asked for the last batch: every earlier step has been applied and checked.
        recorded.append(state_copy(trainer))
        last = batches[-1]
        yield last._replace(**{field: getattr(last, field) * np.nan})

    buffer.mini_batch_generator = generator


@pytest.mark.parametrize("field", ["returns", "obs", "advantages"])
@pytest.mark.parametrize("enable_compile", [True, False])
def test_nan_mini_batch_is_rolled_back_to_the_state_before_it(field, enable_compile):
    model = make_model()
    buffer = filled_buffer(model)
    trainer = make_trainer(
        model, ppo_config(), finite_check_interval=1, enable_compile=enable_compile
    )
    recorded: list = []
    poison_last_batch(buffer, trainer, field, recorded)
    metrics = trainer.update(buffer)
    assert len(recorded) == 1
    assert_same_state(state_copy(trainer), recorded[0])
    assert metrics["rolled_back_updates"] == 1.0
    assert metrics["updates_applied"] == 7.0
    assert metrics["skipped_nonfinite_loss"] == 1.0
    # The average covers the applied steps only, so NaN metrics do not leak into it.
    assert all(math.isfinite(value) for value in metrics.values())


@pytest.mark.parametrize(
    ("iteration", "disable_finite_checks", "kept_steps"),
    [
        pytest.param(0, False, 7, id="warm-up-checks-every-step"),
        pytest.param(1, False, 0, id="after-warm-up-one-check-per-8"),
        pytest.param(0, True, 0, id="disabled-only-the-final-check"),
    ],
)
def test_check_interval_decides_how_far_a_bad_step_rolls_back(
    iteration, disable_finite_checks, kept_steps
):
    model = make_model()
    buffer = filled_buffer(model)
    trainer = make_trainer(
        model,
        ppo_config(),
        finite_check_interval=8,
        warmup_strict_iters=1,
        warmup_finite_check_interval=1,
        disable_finite_checks=disable_finite_checks,
    )
    initial = state_copy(trainer)
    recorded: list = []
    poison_last_batch(buffer, trainer, "returns", recorded)
    metrics = trainer.update(buffer, iteration=iteration)
    # 8 steps, the last one bad: roll back to the last check, kept steps and all.
    assert_same_state(state_copy(trainer), recorded[0] if kept_steps else initial)
    assert metrics["updates_applied"] == kept_steps
    assert metrics["rolled_back_updates"] == 1.0
    assert metrics["skipped_nonfinite_loss"] == 8 - kept_steps


def test_nan_gradients_of_one_step_are_rolled_back(monkeypatch):
    model = make_model()
    buffer = filled_buffer(model)
    # Eager steps, so the patched gradient function runs at every step, not once in a trace.
    cfg = ppo_config(num_mini_batches=2)
    trainer = make_trainer(model, cfg, finite_check_interval=1, enable_compile=False)
    loss_and_grad = trainer._loss_and_grad
    calls: list[dict] = []

    def poisoned(model_arg, batch, *scalars):
        # Third step: a finite loss with NaN gradients (e.g. an overflow in the backward pass).
        calls.append(state_copy(trainer))
        (loss, metrics), grads = loss_and_grad(model_arg, batch, *scalars)
        if len(calls) == 3:
            grads = tree_map(lambda g: g * np.nan, grads)
        return (loss, metrics), grads

    monkeypatch.setattr(trainer, "_loss_and_grad", poisoned)
    metrics = trainer.update(buffer)
    assert len(calls) == 4
    # The bad third step was undone, so the fourth started where the third did.
    assert_same_state(calls[3], calls[2])
    assert metrics["rolled_back_updates"] == 1.0
    assert metrics["skipped_nonfinite_grads"] == 1.0
    assert metrics["skipped_nonfinite_loss"] == 0.0
    assert metrics["updates_applied"] == 3.0
    assert_all_finite(state_copy(trainer))


def adaptive_config(**overrides) -> PPOConfig:
    fields = {
        "schedule": "adaptive",
        "learning_rate": 1e-3,
        "desired_kl": 0.01,
        "num_learning_epochs": 2,
        "num_mini_batches": 4,
    } | overrides
    return ppo_config(**fields)


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


@pytest.mark.parametrize("enable_compile", [True, False])
def test_target_kl_stop_on_the_first_mini_batch_changes_nothing(enable_compile):
    model = make_model()
    cfg = ppo_config(num_learning_epochs=4, target_kl_stop=0.05)
    trainer = make_trainer(model, cfg, enable_compile=enable_compile)
    before = state_copy(trainer)
    metrics = trainer.update(filled_buffer(model, old_mean_offset=1.0))
    assert metrics["early_stopped_kl"] == 1.0
    # The first mini-batch's KL (about 1.5) is over the target: it is not applied.
    assert metrics["updates_applied"] == 0.0
    assert_same_state(state_copy(trainer), before)
    assert all(math.isfinite(value) for value in metrics.values())


@pytest.mark.parametrize("enable_compile", [True, False])
def test_target_kl_stop_drops_the_step_over_the_target_and_ends_the_epochs(enable_compile):
    model = make_model()
    cfg = ppo_config(num_learning_epochs=4, target_kl_stop=0.05)
    trainer = make_trainer(model, cfg, enable_compile=enable_compile)
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


def test_compiled_and_eager_updates_agree():
    results = []
    for enable_compile in (True, False):
        model = make_model()
        trainer = make_trainer(model, adaptive_config(), seed=3, enable_compile=enable_compile)
        metrics = trainer.update(filled_buffer(model, old_mean_offset=0.3))
        results.append((state_copy(trainer), metrics))
    (compiled, compiled_metrics), (eager, eager_metrics) = results
    for name, value in eager.items():
        np.testing.assert_allclose(compiled[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    for name, value in eager_metrics.items():
        assert compiled_metrics[name] == pytest.approx(value, rel=1e-3, abs=1e-5), name


def test_compile_failure_falls_back_to_eager_and_says_so(monkeypatch, caplog):
    model = make_model()
    trainer = make_trainer(model, ppo_config(num_learning_epochs=1), enable_compile=True)

    def broken_compiled_step(*_args):
        raise RuntimeError("cannot compile this")

    monkeypatch.setattr(trainer, "_step", broken_compiled_step)
    with caplog.at_level(logging.WARNING):
        metrics = trainer.update(filled_buffer(model))
    assert metrics["updates_applied"] == 4.0
    assert "cannot compile this" in (trainer.compile_error or "")
    assert any("compile" in record.getMessage() for record in caplog.records)


def test_default_config_is_valid():
    PPOConfig().validate()


@pytest.mark.parametrize(
    "overrides",
    [
        {"num_learning_epochs": 0},
        {"num_mini_batches": 0},
        {"schedule": "cosine"},
        {"gamma": 1.5},
        {"lam": -0.1},
        {"learning_rate": 0.0},
        {"clip_param": -0.2},
        {"min_learning_rate": 0.0},
        {"min_learning_rate": 1e-2, "max_learning_rate": 1e-3},
        {"target_kl_stop": -0.1},
        {"advantage_std_floor": -0.1},
        {"bounds_loss_coef": -1.0},
        {"adaptive_lr_decay": 1.0},
        {"adaptive_lr_growth": 0.9},
    ],
)
def test_validate_rejects_bad_values(overrides):
    with pytest.raises(ValueError):
        PPOConfig(**overrides).validate()
    with pytest.raises(ValueError):
        PPOTrainer(make_model(), PPOConfig(**overrides))


@pytest.mark.parametrize(
    "overrides",
    [
        {"finite_check_interval": 0},
        {"warmup_finite_check_interval": 0},
        {"warmup_strict_iters": -1},
    ],
)
def test_runtime_validate_rejects_bad_values(overrides):
    with pytest.raises(ValueError):
        PPORuntimeConfig(**overrides).validate()
    with pytest.raises(ValueError):
        PPOTrainer(make_model(), PPOConfig(), runtime=PPORuntimeConfig(**overrides))


@pytest.mark.parametrize(
    "overrides",
    [
        # Every adaptive step would see KL > 2 * 0 and cut the rate to its minimum.
        pytest.param({"schedule": "adaptive", "desired_kl": 0.0}, id="desired_kl-zero"),
        # clip(log_ratio, -0, 0) pins the ratio at 1: the policy gradient vanishes.
        pytest.param({"log_ratio_clip": 0.0}, id="log_ratio_clip-zero"),
    ],
)
def test_validate_rejects_values_that_silently_stop_learning(overrides):
    with pytest.raises(ValueError):
        PPOConfig(**overrides).validate()


@pytest.mark.parametrize(
    "name",
    # The EMA of the KL and the rate / metrics intervals are gone with rsl_rl's exact rule.
    ["adaptive_kl_beta", "adaptive_lr_update_interval", "metrics_interval",
     "warmup_metrics_interval"],
)
def test_removed_fields_are_refused(name):
    assert name not in {field.name for field in dataclasses.fields(PPOConfig)}
    with pytest.raises(TypeError):
        PPOConfig(**{name: 1})


def test_a_compile_failure_is_logged_through_the_package_logger(monkeypatch, caplog, capsys):
    def refuse(*_args, **_kwargs):
        raise ValueError("no compiler here")

    monkeypatch.setattr(mx, "compile", refuse)
    model = make_model()
    trainer = make_trainer(model, ppo_config(), enable_compile=True)
    trainer.update(filled_buffer(model))
    assert trainer.compile_error == "ValueError: no compiler here"
    [record] = [r for r in caplog.records if "mx.compile failed" in r.getMessage()]
    assert record.name == "unilab_ros.rl.ppo"
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("schedule", ["fixed", "adaptive"])
@pytest.mark.parametrize("rate", [1e9, 1e-9, float("nan"), float("inf"), -3e-4])
def test_a_learning_rate_outside_its_bounds_is_refused_at_start_and_when_set(schedule, rate):
    cfg = PPOConfig(schedule=schedule)
    with pytest.raises(ValueError, match=r"outside min_learning_rate \.\. max_learning_rate "
                                         r"\(1e-05 \.\. 0\.01\)"):
        cfg.check_learning_rate(rate)
    with pytest.raises(ValueError, match="outside min_learning_rate"):
        PPOConfig(schedule=schedule, learning_rate=rate).validate()
    for inside in (1e-5, 3e-4, 1e-2):
        cfg.check_learning_rate(inside)
