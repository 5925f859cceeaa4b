"""PPOTrainer: metric keys, NaN roll-back, compiled and eager steps, config. The adaptive
learning rate and the KL stop: test_ppo_kl.py; advantage normalization and the bounds
loss: test_ppo_losses.py."""

import dataclasses
import logging
import math
from collections.abc import Iterator

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_map
from ppo_harness import (
    adaptive_config,
    assert_all_finite,
    assert_same_state,
    filled_buffer,
    make_model,
    make_trainer,
    ppo_config,
    state_copy,
)

from unilab_ros.rl.buffer import MiniBatch, RolloutBuffer
from unilab_ros.rl.ppo import PPOTrainer
from unilab_ros.rl.ppo_config import PPOConfig
from unilab_ros.rl.ppo_runtime import PPORuntimeConfig

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
