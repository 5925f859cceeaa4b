"""PPOTrainer: metric keys, NaN roll-back, adaptive learning rate, early stop, config."""

import logging
import math
from collections.abc import Iterator

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map

from unilab_ros.rl.buffer import RolloutBuffer
from unilab_ros.rl.distributions import diag_gaussian_log_prob
from unilab_ros.rl.model import MLPActorCritic, ModelConfig
from unilab_ros.rl.ppo import PPOConfig, PPOTrainer

OBS_DIM, ACTION_DIM = 3, 2

REFERENCE_METRIC_KEYS = {
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
    "learning_rate",
    "updates_applied",
    "skipped_nonfinite_loss",
    "skipped_nonfinite_grads",
    "rolled_back_updates",
    "skipped_nonfinite_metrics",
    "early_stopped_kl",
}


def ppo_config(**overrides) -> PPOConfig:
    """Small test settings. Compiled steps are opted into per test: on CPU, mx.compile
    builds its fused kernels with the C++ compiler on first use (about a second each, cached
    under $TMPDIR/mlx), so the compiled tests share one mini-batch shape (8 of 32 samples).
    """
    fields = {"num_learning_epochs": 2, "num_mini_batches": 4, "enable_compile": False}
    return PPOConfig(**(fields | overrides))


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
            obs[t], actions_np[t], None, None, None, rng.normal(size=num_envs), dones[t], None
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
    metrics = PPOTrainer(model, ppo_config(enable_compile=True)).update(filled_buffer(model))
    assert set(metrics) == REFERENCE_METRIC_KEYS
    assert all(type(value) is float for value in metrics.values())
    assert all(math.isfinite(value) for value in metrics.values())


def test_first_update_starts_on_policy_and_moves_the_parameters():
    model = make_model()
    cfg = ppo_config(num_learning_epochs=1, num_mini_batches=1)
    trainer = PPOTrainer(model, cfg)
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
    metrics = PPOTrainer(model, cfg).update(filled_buffer(model, num_envs, num_steps))
    assert metrics["updates_applied"] == 2 * num_mini_batches
    assert metrics["rolled_back_updates"] == 0.0
    assert all(math.isfinite(value) for value in metrics.values())


@pytest.mark.parametrize("enable_compile", [True, False])
def test_nan_in_every_mini_batch_rolls_everything_back(enable_compile):
    model = make_model()
    buffer = filled_buffer(model)
    buffer.returns[:] = np.nan
    # Default check interval (8) with 4 steps: only the end-of-update check catches it.
    cfg = ppo_config(num_learning_epochs=1, enable_compile=enable_compile)
    trainer = PPOTrainer(model, cfg)
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

    def generator(num_mini_batches: int, num_epochs: int, key=None) -> Iterator[dict]:
        batches = list(generate(num_mini_batches, num_epochs, key=key))
        yield from batches[:-1]
        # Asked for the last batch: every earlier step has been applied and checked.
        recorded.append(state_copy(trainer))
        yield dict(batches[-1], **{field: batches[-1][field] * np.nan})

    buffer.mini_batch_generator = generator


@pytest.mark.parametrize("field", ["returns", "obs", "advantages"])
@pytest.mark.parametrize("enable_compile", [True, False])
def test_nan_mini_batch_is_rolled_back_to_the_state_before_it(field, enable_compile):
    model = make_model()
    buffer = filled_buffer(model)
    cfg = ppo_config(finite_check_interval=1, enable_compile=enable_compile)
    trainer = PPOTrainer(model, cfg)
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
    cfg = ppo_config(
        finite_check_interval=8,
        warmup_strict_iters=1,
        warmup_finite_check_interval=1,
        disable_finite_checks=disable_finite_checks,
    )
    trainer = PPOTrainer(model, cfg)
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
    cfg = ppo_config(num_mini_batches=2, finite_check_interval=1, enable_compile=False)
    trainer = PPOTrainer(model, cfg)
    loss_and_grad = trainer._loss_and_grad
    calls: list[dict] = []

    def poisoned(model_arg, batch):
        # Third step: a finite loss with NaN gradients (e.g. an overflow in the backward pass).
        calls.append(state_copy(trainer))
        (loss, metrics), grads = loss_and_grad(model_arg, batch)
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
        "num_learning_epochs": 3,
        "num_mini_batches": 4,
        # Deliberately not multiples of each other: the reference's rate never moved then.
        "metrics_interval": 8,
        "adaptive_lr_update_interval": 3,
    } | overrides
    return ppo_config(**fields)


def adaptations(ratio: float, factor: float) -> int:
    """How many times ``factor`` was applied to get ``ratio`` (asserting it is a power)."""
    count = round(math.log(ratio) / math.log(factor))
    assert ratio == pytest.approx(factor**count, rel=1e-4)
    return count


@pytest.mark.parametrize("enable_compile", [True, False])
def test_adaptive_rate_falls_when_kl_is_large(enable_compile):
    model = make_model()
    cfg = adaptive_config(enable_compile=enable_compile)
    trainer = PPOTrainer(model, cfg)
    # An old policy 1.0 away in each of 2 dims: KL about 1, far above 2 * desired_kl.
    metrics = trainer.update(filled_buffer(model, old_mean_offset=1.0))
    assert metrics["approx_kl"] > 2.0 * cfg.desired_kl
    # 12 mini-batches, adapting every 3rd: 4 decays of 1.5 each.
    assert adaptations(cfg.learning_rate / metrics["learning_rate"], cfg.adaptive_lr_decay) == 4
    assert trainer.learning_rate == pytest.approx(metrics["learning_rate"])


@pytest.mark.parametrize("enable_compile", [True, False])
def test_adaptive_rate_rises_when_kl_is_tiny(enable_compile):
    model = make_model()
    cfg = adaptive_config(learning_rate=1e-4, enable_compile=enable_compile)
    trainer = PPOTrainer(model, cfg)
    # KL about 2 * 0.01**2 / 2 = 1e-4: positive, and far below desired_kl / 2.
    metrics = trainer.update(filled_buffer(model, old_mean_offset=0.01))
    assert 0.0 < metrics["approx_kl"] < 0.5 * cfg.desired_kl
    growths = adaptations(metrics["learning_rate"] / cfg.learning_rate, cfg.adaptive_lr_growth)
    assert growths == 4


def test_adaptive_rate_respects_its_bounds():
    model = make_model()
    cfg = adaptive_config(min_learning_rate=5e-4)
    metrics = PPOTrainer(model, cfg).update(filled_buffer(model, old_mean_offset=1.0))
    assert metrics["learning_rate"] == pytest.approx(5e-4)

    model = make_model()
    cfg = adaptive_config(learning_rate=1e-4, max_learning_rate=1.5e-4)
    metrics = PPOTrainer(model, cfg).update(filled_buffer(model, old_mean_offset=0.01))
    assert metrics["learning_rate"] == pytest.approx(1.5e-4)


def test_fixed_schedule_keeps_the_rate():
    model = make_model()
    cfg = adaptive_config(schedule="fixed")
    metrics = PPOTrainer(model, cfg).update(filled_buffer(model, old_mean_offset=1.0))
    assert metrics["learning_rate"] == pytest.approx(cfg.learning_rate)


@pytest.mark.parametrize("enable_compile", [True, False])
def test_target_kl_stop_ends_the_update_early(enable_compile):
    model = make_model()
    cfg = ppo_config(
        num_learning_epochs=4,
        target_kl_stop=0.05,
        metrics_interval=2,
        enable_compile=enable_compile,
    )
    metrics = PPOTrainer(model, cfg).update(filled_buffer(model, old_mean_offset=1.0))
    assert metrics["early_stopped_kl"] == 1.0
    # The KL is read after every 2nd mini-batch, and the first read already exceeds it.
    assert metrics["updates_applied"] == 2.0


def test_target_kl_stop_does_not_fire_below_the_target():
    model = make_model()
    cfg = ppo_config(target_kl_stop=10.0)
    metrics = PPOTrainer(model, cfg).update(filled_buffer(model, old_mean_offset=0.01))
    assert metrics["early_stopped_kl"] == 0.0
    assert metrics["updates_applied"] == 8.0


def test_compiled_and_eager_updates_agree():
    results = []
    for enable_compile in (True, False):
        model = make_model()
        cfg = adaptive_config(enable_compile=enable_compile)
        trainer = PPOTrainer(model, cfg, seed=3)
        metrics = trainer.update(filled_buffer(model, old_mean_offset=0.3))
        results.append((state_copy(trainer), metrics))
    (compiled, compiled_metrics), (eager, eager_metrics) = results
    for name, value in eager.items():
        np.testing.assert_allclose(compiled[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    for name, value in eager_metrics.items():
        assert compiled_metrics[name] == pytest.approx(value, rel=1e-3, abs=1e-5), name


def test_compile_failure_falls_back_to_eager_and_says_so(monkeypatch, caplog):
    model = make_model()
    trainer = PPOTrainer(model, ppo_config(num_learning_epochs=1, enable_compile=True))

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
        {"adaptive_lr_update_interval": 0},
        {"metrics_interval": 0},
        {"finite_check_interval": 0},
        {"warmup_metrics_interval": 0},
        {"warmup_finite_check_interval": 0},
        {"schedule": "cosine"},
        {"gamma": 1.5},
        {"lam": -0.1},
        {"learning_rate": 0.0},
        {"clip_param": -0.2},
        {"min_learning_rate": 0.0},
        {"min_learning_rate": 1e-2, "max_learning_rate": 1e-3},
        {"warmup_strict_iters": -1},
        {"target_kl_stop": -0.1},
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
        # Every adaptive step would see KL > 2 * 0 and cut the rate to its minimum.
        pytest.param({"schedule": "adaptive", "desired_kl": 0.0}, id="desired_kl-zero"),
        # clip(log_ratio, -0, 0) pins the ratio at 1: the policy gradient vanishes.
        pytest.param({"log_ratio_clip": 0.0}, id="log_ratio_clip-zero"),
    ],
)
def test_validate_rejects_values_that_silently_stop_learning(overrides):
    with pytest.raises(ValueError):
        PPOConfig(**overrides).validate()
