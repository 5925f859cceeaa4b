"""PPO update (clipped surrogate, clipped value loss, adaptive learning rate) in MLX."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_map

from unilab_ros.rl.buffer import RolloutBuffer
from unilab_ros.rl.distributions import (
    diag_gaussian_entropy,
    diag_gaussian_kl,
    diag_gaussian_log_prob,
)
from unilab_ros.rl.model import MLPActorCritic

_LOG = logging.getLogger(__name__)

METRIC_KEYS = (
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
)
"""Per-mini-batch metrics, averaged over the applied mini-batches of an update."""

SCHEDULES = ("fixed", "adaptive")


@dataclass
class PPOConfig:
    """PPO hyperparameters (the fields and meanings of the earlier MLX trainer)."""

    num_learning_epochs: int = 4
    """Passes over the rollout per update."""
    num_mini_batches: int = 4
    """Mini-batches per epoch (any count up to the rollout size)."""
    clip_param: float = 0.2
    """PPO ratio clip, also the value-prediction clip."""
    gamma: float = 0.99
    """Discount factor."""
    lam: float = 0.95
    """GAE lambda."""
    value_loss_coef: float = 0.5
    """Weight of the value loss."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""
    learning_rate: float = 3e-4
    """Adam learning rate (the initial one under the adaptive schedule)."""
    use_clipped_value_loss: bool = True
    """Clip value predictions around the rollout's values, as rsl_rl does."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip; <= 0 disables it."""
    log_ratio_clip: float = 20.0
    """Clip on log(pi/pi_old) before the exp, against overflow."""
    schedule: str = "fixed"
    """"fixed" or "adaptive" (KL-driven learning rate)."""
    desired_kl: float = 0.01
    """Adaptive schedule: target KL per mini-batch."""
    min_learning_rate: float = 1e-5
    """Adaptive schedule: lower bound."""
    max_learning_rate: float = 1e-2
    """Adaptive schedule: upper bound."""
    normalize_advantage_per_mini_batch: bool = False
    """Normalize advantages within each mini-batch (else over the whole rollout)."""
    adaptive_kl_beta: float = 0.9
    """Adaptive schedule: EMA factor of the KL (0 reacts to each mini-batch, as rsl_rl)."""
    adaptive_lr_decay: float = 1.5
    """Adaptive schedule: divide the rate by this when KL > 2 desired."""
    adaptive_lr_growth: float = 1.2
    """Adaptive schedule: multiply the rate by this when KL < desired / 2."""
    adaptive_lr_update_interval: int = 1
    """Adaptive schedule: adapt every this many mini-batches."""
    target_kl_stop: float = 0.0
    """Stop the update's epochs early when a read KL exceeds this; 0 disables."""
    metrics_interval: int = 8
    """Read metrics to the host (for target_kl_stop) every this many mini-batches."""
    finite_check_interval: int = 8
    """Check loss, gradients and parameters for NaN/Inf every this many mini-batches."""
    enable_compile: bool = True
    """Compile the mini-batch step (model and optimizer state) with mx.compile."""
    warmup_strict_iters: int = 0
    """First iterations that use the warm-up intervals below."""
    warmup_metrics_interval: int = 1
    """metrics_interval during warm-up."""
    warmup_finite_check_interval: int = 1
    """finite_check_interval during warm-up."""
    disable_finite_checks: bool = False
    """Skip the per-mini-batch checks; the end-of-update check always runs."""

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        positive_ints = (
            "num_learning_epochs",
            "num_mini_batches",
            "adaptive_lr_update_interval",
            "metrics_interval",
            "finite_check_interval",
            "warmup_metrics_interval",
            "warmup_finite_check_interval",
        )
        for name in positive_ints:
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, not '{self.schedule}'")
        if not 0.0 <= self.gamma <= 1.0 or not 0.0 <= self.lam <= 1.0:
            raise ValueError("gamma and lam must be in [0, 1]")
        if self.learning_rate <= 0.0 or self.clip_param <= 0.0:
            raise ValueError("learning_rate and clip_param must be positive")
        if not 0.0 < self.min_learning_rate <= self.max_learning_rate:
            raise ValueError("need 0 < min_learning_rate <= max_learning_rate")
        if self.schedule == "adaptive" and self.desired_kl <= 0.0:
            raise ValueError("desired_kl must be positive under the adaptive schedule")
        if self.log_ratio_clip <= 0.0:
            raise ValueError("log_ratio_clip must be positive (0 pins the ratio at 1)")
        if self.warmup_strict_iters < 0 or self.target_kl_stop < 0.0:
            raise ValueError("warmup_strict_iters and target_kl_stop must be >= 0")


class PPOTrainer:
    """PPO update logic for ``MLPActorCritic`` and ``RolloutBuffer``.

    One mini-batch step is a single function over the model, optimizer and
    schedule state: loss, gradients, metrics (from the same forward pass), KL-driven
    learning rate, gradient clipping and the Adam update. It is compiled when
    ``enable_compile`` is set. Finite checks read one flag; a failed check restores
    the model and optimizer to the last checked state (MLX arrays are immutable, so
    keeping that state costs references, not copies).
    """

    def __init__(self, model: MLPActorCritic, cfg: PPOConfig | None = None, seed: int = 0) -> None:
        cfg = cfg or PPOConfig()
        cfg.validate()
        self.model = model
        self.cfg = cfg
        self.optimizer = optim.Adam(learning_rate=float(cfg.learning_rate), bias_correction=True)
        self.optimizer.init(model.trainable_parameters())
        # The schedule state lives in arrays so the compiled step can update it.
        self.schedule_state = {"kl_ema": mx.array(0.0), "kl_seen": mx.array(False)}
        self._loss_and_grad = nn.value_and_grad(model, self._loss_fn)
        self.compile_error: str | None = None
        self._step = self._build_step()
        self._step_verified = self._step is self._train_step
        self.shuffle_key = mx.random.key(seed)

    @property
    def learning_rate(self) -> float:
        return float(self.optimizer.learning_rate.item())

    def _state(self) -> list[Any]:
        return [self.model.state, self.optimizer.state, self.schedule_state]

    def _build_step(self):
        if not self.cfg.enable_compile:
            return self._train_step
        state = self._state()
        try:
            return mx.compile(self._train_step, inputs=state, outputs=state)
        except Exception as error:  # noqa: BLE001 - any compile failure falls back to eager
            self._compile_failed(error)
            return self._train_step

    def _compile_failed(self, error: Exception) -> None:
        self.compile_error = f"{type(error).__name__}: {error}"
        _LOG.warning("mx.compile failed, PPO steps run uncompiled: %s", self.compile_error)

    def _loss_fn(
        self, model: MLPActorCritic, batch: dict[str, mx.array]
    ) -> tuple[mx.array, mx.array]:
        cfg = self.cfg
        advantages = batch["advantages"]
        if cfg.normalize_advantage_per_mini_batch:
            advantages = (advantages - mx.mean(advantages)) / (mx.std(advantages) + 1e-8)
        mean, std, log_std = model.distribution_params(batch["obs"])
        values = model.value(batch["obs"])
        log_probs = diag_gaussian_log_prob(batch["actions"], mean, log_std)
        entropy = mx.mean(diag_gaussian_entropy(log_std))
        log_ratio = mx.clip(
            log_probs - batch["old_log_probs"], -cfg.log_ratio_clip, cfg.log_ratio_clip
        )
        ratio = mx.exp(log_ratio)
        clipped_ratio = mx.clip(ratio, 1.0 - cfg.clip_param, 1.0 + cfg.clip_param)
        surrogate = -mx.mean(mx.minimum(ratio * advantages, clipped_ratio * advantages))
        returns, old_values = batch["returns"], batch["old_values"]
        if cfg.use_clipped_value_loss:
            clipped_values = old_values + mx.clip(
                values - old_values, -cfg.clip_param, cfg.clip_param
            )
            value_loss = mx.mean(
                mx.maximum((values - returns) ** 2, (clipped_values - returns) ** 2)
            )
        else:
            value_loss = mx.mean((returns - values) ** 2)
        loss = surrogate + cfg.value_loss_coef * value_loss - cfg.entropy_coef * entropy

        mean_d, std_d = mx.stop_gradient(mean), mx.stop_gradient(std)
        ratio_d, values_d = mx.stop_gradient(ratio), mx.stop_gradient(values)
        kl = mx.mean(diag_gaussian_kl(batch["old_mu"], batch["old_sigma"], mean_d, std_d))
        metrics = mx.stack(
            [
                mx.stop_gradient(surrogate),
                mx.stop_gradient(value_loss),
                mx.stop_gradient(entropy),
                kl,
                mx.mean((mx.abs(ratio_d - 1.0) > cfg.clip_param).astype(mx.float32)),
                mx.mean(ratio_d),
                mx.max(ratio_d),
                mx.mean(std_d),
                mx.std(advantages),
                1.0 - mx.var(returns - values_d) / (mx.var(returns) + 1e-8),
            ]
        )
        return loss, metrics

    def _adapt_learning_rate(self, kl: mx.array, adapt: mx.array) -> None:
        """rsl_rl's KL rule on an EMA of the KL, applied before this step's update."""
        cfg = self.cfg
        beta = min(max(cfg.adaptive_kl_beta, 0.0), 0.999)
        state = self.schedule_state
        ema = mx.where(state["kl_seen"], beta * state["kl_ema"] + (1.0 - beta) * kl, kl)
        state["kl_ema"], state["kl_seen"] = ema, mx.array(True)
        lr = self.optimizer.learning_rate
        lower = mx.maximum(cfg.min_learning_rate, lr / max(cfg.adaptive_lr_decay, 1.01))
        higher = mx.minimum(cfg.max_learning_rate, lr * max(cfg.adaptive_lr_growth, 1.0))
        new_lr = mx.where(
            ema > 2.0 * cfg.desired_kl,
            lower,
            mx.where((ema > 0.0) & (ema < 0.5 * cfg.desired_kl), higher, lr),
        )
        self.optimizer.learning_rate = mx.where(adapt, new_lr, lr).astype(lr.dtype)

    def _clip_grads(self, grads: Any) -> tuple[Any, mx.array]:
        leaves = [g for _, g in tree_flatten(grads)]
        norm = mx.sqrt(sum(mx.sum(g * g) for g in leaves))
        if self.cfg.max_grad_norm <= 0.0:
            return grads, norm
        coef = mx.minimum(1.0, self.cfg.max_grad_norm / (norm + 1e-6))
        return tree_map(lambda g: g * coef, grads), norm

    def _train_step(
        self, batch: dict[str, mx.array], adapt: mx.array
    ) -> tuple[mx.array, mx.array, mx.array]:
        (loss, metrics), grads = self._loss_and_grad(self.model, batch)
        if self.cfg.schedule == "adaptive":
            self._adapt_learning_rate(metrics[3], adapt)
        grads, grad_norm = self._clip_grads(grads)
        self.optimizer.update(self.model, grads)
        params_sum = sum(mx.sum(p) for _, p in tree_flatten(self.model.trainable_parameters()))
        # Status: 0 good, 1 loss non-finite, 2 gradients non-finite, 3 parameters non-finite.
        status = mx.where(
            ~mx.isfinite(loss),
            1,
            mx.where(~mx.isfinite(grad_norm), 2, mx.where(~mx.isfinite(params_sum), 3, 0)),
        )
        return loss, metrics, status

    def _run_step(self, batch: dict[str, mx.array], adapt: mx.array):
        if self._step_verified or self._step is self._train_step:
            return self._step(batch, adapt)
        snapshot = self._snapshot()
        try:
            outputs = self._step(batch, adapt)
            # MLX builds compiled kernels lazily: evaluate the first step here, so a JIT
            # failure (e.g. no C++ compiler) is caught, not raised by a later eval.
            mx.eval(outputs, self._state())
        except Exception as error:  # noqa: BLE001 - any compile failure falls back to eager
            self._compile_failed(error)
            self._restore(snapshot)
            self._step = self._train_step
            outputs = self._step(batch, adapt)
        self._step_verified = True
        return outputs

    def _snapshot(self) -> tuple[Any, Any, Any]:
        copy = tree_map(lambda x: x, self._state()[1:])
        return self.model.trainable_parameters(), copy[0], copy[1]

    def _restore(self, snapshot: tuple[Any, Any, Any]) -> None:
        params, opt_state, schedule_state = snapshot
        self.model.update(params)
        self.optimizer.state.update(tree_map(lambda x: x, opt_state))
        self.schedule_state.update(schedule_state)

    def _intervals(self, iteration: int) -> tuple[int, int]:
        cfg = self.cfg
        if 0 <= iteration < cfg.warmup_strict_iters:
            return cfg.warmup_metrics_interval, cfg.warmup_finite_check_interval
        return cfg.metrics_interval, cfg.finite_check_interval

    def update(self, buffer: RolloutBuffer, iteration: int = -1) -> dict[str, float]:
        """Run the epochs over ``buffer`` (returns and advantages already computed)."""
        cfg = self.cfg
        metrics_interval, check_interval = self._intervals(iteration)
        skipped = {1: 0, 2: 0, 3: 0}
        rolled_back = early_stopped = unchecked = 0
        metric_sum, applied = mx.zeros((len(METRIC_KEYS),)), 0
        pending_sum, worst = mx.zeros_like(metric_sum), mx.array(0)
        snapshot = self._snapshot()

        def check() -> None:
            """Keep the steps since the last check, or roll them all back."""
            nonlocal snapshot, rolled_back, unchecked, metric_sum, applied, pending_sum, worst
            code = int(worst.item())
            if code == 0:
                metric_sum, applied = metric_sum + pending_sum, applied + unchecked
                snapshot = self._snapshot()
            else:
                self._restore(snapshot)
                rolled_back += 1
                skipped[code] += unchecked
            pending_sum, worst, unchecked = mx.zeros_like(metric_sum), mx.array(0), 0

        self.shuffle_key, key = mx.random.split(self.shuffle_key)
        batches = buffer.mini_batch_generator(
            cfg.num_mini_batches, cfg.num_learning_epochs, key=key
        )
        for index, batch in enumerate(batches):
            adapt = mx.array(index % cfg.adaptive_lr_update_interval == 0)
            _, metrics, status = self._run_step(batch, adapt)
            # A bad step poisons every later one, so the worst status since the last
            # check decides whether those steps are kept.
            pending_sum, worst = pending_sum + metrics, mx.maximum(worst, status)
            unchecked += 1
            mx.eval(self._state(), pending_sum, worst)
            if not cfg.disable_finite_checks and (index + 1) % check_interval == 0:
                check()
            if cfg.target_kl_stop > 0.0 and (index + 1) % metrics_interval == 0:
                if float(metrics[3].item()) > cfg.target_kl_stop:
                    early_stopped += 1
                    break
        if unchecked:
            check()
        means = (metric_sum / max(applied, 1)).tolist()
        out = {key: float(v) for key, v in zip(METRIC_KEYS, means, strict=True)}
        out["learning_rate"] = self.learning_rate
        out["updates_applied"] = float(applied)
        out["skipped_nonfinite_loss"] = float(skipped[1])
        out["skipped_nonfinite_grads"] = float(skipped[2] + skipped[3])
        out["rolled_back_updates"] = float(rolled_back)
        out["skipped_nonfinite_metrics"] = 0.0
        out["early_stopped_kl"] = float(early_stopped)
        return out
