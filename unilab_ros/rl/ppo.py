"""PPO update (clipped surrogate, clipped value loss, adaptive learning rate) in MLX."""

from __future__ import annotations

import logging
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map

from unilab_ros.rl.buffer import MiniBatch, RolloutBuffer
from unilab_ros.rl.distributions import (
    diag_gaussian_entropy,
    diag_gaussian_kl,
    diag_gaussian_log_prob,
)
from unilab_ros.rl.model import MLPActorCritic
from unilab_ros.rl.ppo_config import PPOConfig
from unilab_ros.rl.ppo_runtime import PPORuntimeConfig

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
    "bounds_loss",
    "mean_out_of_bounds",
    "anchor_kl",
    "learning_rate",
)
"""Per-mini-batch metrics, averaged over the applied mini-batches of an update."""
_KL, _RATIO_MAX, _LR = METRIC_KEYS.index("approx_kl"), 6, METRIC_KEYS.index("learning_rate")

class PPOTrainer:
    """PPO update logic for ``MLPActorCritic`` and ``RolloutBuffer``.

    One mini-batch step is a single function over the model, optimizer and
    schedule state: loss, gradients, metrics (from the same forward pass), KL-driven
    learning rate, the KL early stop, gradient clipping and the Adam update. It is
    compiled when ``runtime.enable_compile`` is set. Finite checks read one flag; a failed
    check restores the model and optimizer to the last checked state (MLX arrays are
    immutable, so keeping that state costs references, not copies).

    The "old" log-probs, means, stds and values of the rollout are those the acting
    policy computed (see ``PPOAgent.update``), so the ratio and KL measure how far the
    update moved from the policy that collected the data, normalizer changes included.
    """

    def __init__(
        self,
        model: MLPActorCritic,
        cfg: PPOConfig | None = None,
        seed: int = 0,
        action_bounds: tuple[np.ndarray, np.ndarray] | None = None,
        runtime: PPORuntimeConfig | None = None,
    ) -> None:
        cfg = cfg or PPOConfig()
        cfg.validate()
        runtime = runtime or PPORuntimeConfig()
        runtime.validate()
        self.model = model
        self.cfg = cfg
        self.runtime = runtime
        self.optimizer = optim.Adam(learning_rate=float(cfg.learning_rate), bias_correction=True)
        self.optimizer.init(model.trainable_parameters())
        # Arrays, so the compiled step can update them and checkpoints keep them.
        self.schedule_state = {
            "stopped": mx.array(False),
            "adv_std_mean": mx.array(0.0),
            "rollouts_seen": mx.array(0.0),
        }
        low, high = action_bounds if action_bounds is not None else (-np.inf, np.inf)
        shape = (model.action_dim,)
        self._bounds = (
            mx.array(np.broadcast_to(np.asarray(low, np.float32), shape)),
            mx.array(np.broadcast_to(np.asarray(high, np.float32), shape)),
        )
        self._anchor: MLPActorCritic | None = None
        self._loss_and_grad = nn.value_and_grad(model, self._loss_fn)
        self.compile_error: str | None = None
        self._step = self._build_step()
        self._step_verified = self._step is self._train_step
        self.shuffle_key = mx.random.key(seed)

    @property
    def learning_rate(self) -> float:
        return float(self.optimizer.learning_rate.item())

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        self.optimizer.learning_rate = mx.array(float(value), mx.float32)

    def set_anchor(self, anchor: MLPActorCritic) -> None:
        """The policy ``anchor_coef`` holds the updates near (a frozen copy; it keeps its
        own observation normalizer, so it stays the policy training started from)."""
        anchor.freeze()
        self._anchor = anchor
        # The compiled step bakes the loss in: build it again with the anchor term.
        self._step = self._build_step()
        self._step_verified = self._step is self._train_step

    def _state(self) -> list[Any]:
        return [self.model.state, self.optimizer.state, self.schedule_state]

    def arrays(self) -> list[Any]:
        """Every MLX array the update reads or writes (the model's included): evaluated
        before another thread computes on them, since MLX streams are per thread."""
        anchor = [] if self._anchor is None else [self._anchor.state]
        return [*self._state(), self.shuffle_key, *anchor]

    def _build_step(self):
        if not self.runtime.enable_compile:
            return self._train_step
        state = self._state()
        # The anchor's arrays are read, never written: inputs only. Left out, its arrays
        # loaded from a file are inputs mx.compile has not captured, and it refuses.
        inputs = state if self._anchor is None else [*state, self._anchor.state]
        try:
            return mx.compile(self._train_step, inputs=inputs, outputs=state)
        except Exception as error:  # noqa: BLE001 - any compile failure falls back to eager
            self._compile_failed(error)
            return self._train_step

    def _compile_failed(self, error: Exception) -> None:
        self.compile_error = f"{type(error).__name__}: {error}"
        _LOG.warning("mx.compile failed, PPO steps run uncompiled: %s", self.compile_error)

    def _loss_fn(
        self,
        model: MLPActorCritic,
        batch: MiniBatch,
        adv_std_floor: mx.array,
        actor_weight: mx.array,
    ) -> tuple[mx.array, mx.array]:
        cfg = self.cfg
        advantages = batch.advantages
        if cfg.normalize_advantage_per_mini_batch:
            advantages = normalize_advantages(advantages, adv_std_floor)
        mean, std, log_std = model.distribution_params(batch.obs)
        values = model.value(batch.obs)
        log_probs = diag_gaussian_log_prob(batch.actions, mean, log_std)
        entropy = mx.mean(diag_gaussian_entropy(log_std))
        log_ratio = mx.clip(
            log_probs - batch.old_log_probs, -cfg.log_ratio_clip, cfg.log_ratio_clip
        )
        ratio = mx.exp(log_ratio)
        clipped_ratio = mx.clip(ratio, 1.0 - cfg.clip_param, 1.0 + cfg.clip_param)
        surrogate = -mx.mean(mx.minimum(ratio * advantages, clipped_ratio * advantages))
        returns, old_values = batch.returns, batch.old_values
        if cfg.use_clipped_value_loss:
            clipped_values = old_values + mx.clip(
                values - old_values, -cfg.clip_param, cfg.clip_param
            )
            value_loss = mx.mean(
                mx.maximum((values - returns) ** 2, (clipped_values - returns) ** 2)
            )
        else:
            value_loss = mx.mean((returns - values) ** 2)
        low, high = self._bounds
        excess = mx.maximum(mean - high, 0.0) + mx.maximum(low - mean, 0.0)
        bounds_loss = mx.mean(mx.sum(excess * excess, axis=-1))
        actor_loss = surrogate - cfg.entropy_coef * entropy
        if cfg.bounds_loss_coef > 0.0:
            actor_loss = actor_loss + cfg.bounds_loss_coef * bounds_loss
        anchor_kl = mx.array(0.0)
        if cfg.anchor_coef > 0.0 and self._anchor is not None:
            anchor_mean, anchor_std, _ = self._anchor.distribution_params(batch.obs)
            anchor_kl = mx.mean(diag_gaussian_kl(
                mx.stop_gradient(anchor_mean), mx.stop_gradient(anchor_std), mean, std))
            actor_loss = actor_loss + cfg.anchor_coef * anchor_kl
        # 0 during a critic warm-up: the actor's terms then give no gradient (x 1 is exact,
        # so learning is unchanged otherwise).
        loss = actor_weight * actor_loss + cfg.value_loss_coef * value_loss

        mean_d, std_d = mx.stop_gradient(mean), mx.stop_gradient(std)
        ratio_d, values_d = mx.stop_gradient(ratio), mx.stop_gradient(values)
        kl = mx.mean(diag_gaussian_kl(batch.old_mean, batch.old_std, mean_d, std_d))
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
                mx.stop_gradient(bounds_loss),
                mx.mean(((mean_d > high) | (mean_d < low)).astype(mx.float32)),
                mx.stop_gradient(anchor_kl),
                mx.array(0.0),
            ]
        )
        return loss, metrics

    def _adapt_learning_rate(self, kl: mx.array, actor_weight: mx.array) -> None:
        """rsl_rl's rule on this mini-batch's KL, applied before its update; not while the
        actor is held (its KL stays ~0 and would drive the rate to its maximum)."""
        cfg = self.cfg
        lr = self.optimizer.learning_rate
        lower = mx.maximum(cfg.min_learning_rate, lr / cfg.adaptive_lr_decay)
        higher = mx.minimum(cfg.max_learning_rate, lr * cfg.adaptive_lr_growth)
        new_lr = mx.where(
            kl > 2.0 * cfg.desired_kl,
            lower,
            mx.where((kl > 0.0) & (kl < 0.5 * cfg.desired_kl), higher, lr),
        )
        new_lr = mx.where(actor_weight > 0.0, new_lr, lr)
        self.optimizer.learning_rate = new_lr.astype(lr.dtype)

    def _clip_grads(self, grads: Any) -> tuple[Any, mx.array]:
        leaves = [g for _, g in tree_flatten(grads)]
        norm = mx.sqrt(sum(mx.sum(g * g) for g in leaves))
        if self.cfg.max_grad_norm <= 0.0:
            return grads, norm
        coef = mx.minimum(1.0, self.cfg.max_grad_norm / (norm + 1e-6))
        return tree_map(lambda g: g * coef, grads), norm

    def _train_step(
        self, batch: MiniBatch, adv_std_floor: mx.array, actor_weight: mx.array
    ) -> tuple[mx.array, mx.array, mx.array]:
        cfg = self.cfg
        (loss, metrics), grads = self._loss_and_grad(
            self.model, batch, adv_std_floor, actor_weight
        )
        state = self.schedule_state
        stopped = state["stopped"]
        if cfg.schedule == "adaptive":
            self._adapt_learning_rate(metrics[_KL], actor_weight)
        if cfg.target_kl_stop > 0.0:
            stopped = stopped | (metrics[_KL] > cfg.target_kl_stop)
            params = self.model.trainable_parameters()
            moments = {k: v for k, v in self.optimizer.state.items() if k != "learning_rate"}
            moments = tree_map(lambda x: x, moments)  # Adam refills its nested dicts in place
        grads, grad_norm = self._clip_grads(grads)
        self.optimizer.update(self.model, grads)
        if cfg.target_kl_stop > 0.0:
            # A stopped step (and every later one of this update) leaves the model and
            # Adam's moments as they were; the rate keeps what the schedule decided.
            def keep(new: mx.array, old: mx.array) -> mx.array:
                return mx.where(stopped, old, new)

            self.model.update(tree_map(keep, self.model.trainable_parameters(), params))
            self.optimizer.state.update(
                tree_map(keep, {k: self.optimizer.state[k] for k in moments}, moments)
            )
        state["stopped"] = stopped
        lr = self.optimizer.learning_rate.astype(mx.float32).reshape(1)
        metrics = mx.concatenate([metrics[:_LR], lr])
        params_sum = sum(mx.sum(p) for _, p in tree_flatten(self.model.trainable_parameters()))
        # Status: 0 good, 1 loss non-finite, 2 gradients non-finite, 3 parameters non-finite,
        # 4 not applied (the KL early stop).
        status = mx.where(
            ~mx.isfinite(loss),
            1,
            mx.where(~mx.isfinite(grad_norm), 2, mx.where(~mx.isfinite(params_sum), 3, 0)),
        )
        return loss, metrics, mx.where(stopped, 4, status)

    def _run_step(self, batch: MiniBatch, adv_std_floor: mx.array, actor_weight: mx.array):
        if self._step_verified or self._step is self._train_step:
            return self._step(batch, adv_std_floor, actor_weight)
        snapshot = self._snapshot()
        try:
            outputs = self._step(batch, adv_std_floor, actor_weight)
            # MLX builds compiled kernels lazily: evaluate the first step here, so a JIT
            # failure (e.g. no C++ compiler) is caught, not raised by a later eval.
            mx.eval(outputs, self._state())
        except Exception as error:  # noqa: BLE001 - any compile failure falls back to eager
            self._compile_failed(error)
            self._restore(snapshot)
            self._step = self._train_step
            outputs = self._step(batch, adv_std_floor, actor_weight)
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

    def _advantage_std_floor(self, advantages: np.ndarray) -> float:
        """The floor for this rollout's advantage std; folds its std into the running mean."""
        state = self.schedule_state
        seen = float(state["rollouts_seen"].item())
        past_mean = float(state["adv_std_mean"].item())
        floor = self.cfg.advantage_std_floor * past_mean
        std = float(np.std(advantages))
        if np.isfinite(std):
            # A plain mean over the first rollouts, then an exponential one over ~20.
            weight = 1.0 / min(seen + 1.0, 20.0)
            mean = (1.0 - weight) * past_mean + weight * std
            state["adv_std_mean"] = mx.array(mean, mx.float32)
            state["rollouts_seen"] = mx.array(seen + 1.0, mx.float32)
        return floor

    def update(
        self, buffer: RolloutBuffer, iteration: int = -1, train_actor: bool = True
    ) -> dict[str, float]:
        """Run the epochs over ``buffer`` (returns and raw advantages already computed);
        with ``train_actor`` false only the critic learns (a fine-tuning warm-up)."""
        cfg = self.cfg
        check_interval = self.runtime.check_interval(iteration)
        skipped = {1: 0, 2: 0, 3: 0}
        rolled_back = early_stopped = 0
        width = len(METRIC_KEYS)
        metric_sum, applied = mx.zeros((width,)), 0
        metric_max, metric_min = mx.full((width,), -np.inf), mx.full((width,), np.inf)
        # Per-step outputs since the last check, reduced once there: at small sizes a
        # step is overhead-bound, and a handful of extra ops per step showed in the bench.
        pending_metrics: list[mx.array] = []
        pending_status: list[mx.array] = []
        self.schedule_state["stopped"] = mx.array(False)
        snapshot = self._snapshot()

        def check() -> None:
            """Keep the steps since the last check, or roll them all back."""
            nonlocal snapshot, rolled_back, metric_sum, applied, metric_max, metric_min
            metrics, status = mx.stack(pending_metrics), mx.stack(pending_status)
            # A stopped step is not applied: its metrics do not count.
            kept = (status != 4)[:, None]
            # A bad step poisons every later one, so the worst status since the last
            # check decides whether those steps are kept.
            code = int(mx.max(mx.where(status != 4, status, 0)).item())
            if code == 0:
                metric_sum = metric_sum + mx.sum(mx.where(kept, metrics, 0.0), axis=0)
                metric_max = mx.maximum(metric_max, mx.max(mx.where(kept, metrics, -np.inf), 0))
                metric_min = mx.minimum(metric_min, mx.min(mx.where(kept, metrics, np.inf), 0))
                applied += int(mx.sum(kept).item())
                snapshot = self._snapshot()
            else:
                self._restore(snapshot)
                rolled_back += 1
                skipped[code] += len(pending_status)
            pending_metrics.clear()
            pending_status.clear()

        floor = self._advantage_std_floor(buffer.advantages)
        if not cfg.normalize_advantage_per_mini_batch:
            buffer.advantages = np.asarray(
                normalize_advantages(mx.array(buffer.advantages), mx.array(floor, mx.float32))
            )
        self.shuffle_key, key = mx.random.split(self.shuffle_key)
        batches = buffer.mini_batch_generator(
            cfg.num_mini_batches, cfg.num_learning_epochs, key=key
        )
        floor_array = mx.array(floor, mx.float32)
        actor_weight = mx.array(1.0 if train_actor else 0.0, mx.float32)
        for index, batch in enumerate(batches):
            _, metrics, status = self._run_step(batch, floor_array, actor_weight)
            pending_metrics.append(metrics)
            pending_status.append(status)
            mx.eval(self._state(), metrics, status)
            if not self.runtime.disable_finite_checks and (index + 1) % check_interval == 0:
                check()
            # Every step is evaluated already, so reading the flag costs no extra sync.
            if cfg.target_kl_stop > 0.0 and bool(self.schedule_state["stopped"].item()):
                early_stopped = 1
                break
        if pending_status:
            check()
        means = (metric_sum / max(applied, 1)).tolist()
        out = {key: float(v) for key, v in zip(METRIC_KEYS, means, strict=True)}
        maxima, minima = metric_max.tolist(), metric_min.tolist()
        out["approx_kl_max"] = maxima[_KL] if applied else 0.0
        out["ratio_max"] = maxima[_RATIO_MAX] if applied else 0.0
        out["learning_rate_min"] = minima[_LR] if applied else self.learning_rate
        out["learning_rate_max"] = maxima[_LR] if applied else self.learning_rate
        out["learning_rate"] = self.learning_rate
        out["adv_std_floor"] = floor
        out["updates_applied"] = float(applied)
        out["skipped_nonfinite_loss"] = float(skipped[1])
        out["skipped_nonfinite_grads"] = float(skipped[2] + skipped[3])
        out["rolled_back_updates"] = float(rolled_back)
        out["early_stopped_kl"] = float(early_stopped)
        return out


def normalize_advantages(advantages: mx.array, std_floor: mx.array) -> mx.array:
    """Zero mean, divided by the std or by ``std_floor`` when the std is smaller."""
    centered = advantages - mx.mean(advantages)
    return centered / (mx.maximum(mx.std(advantages), std_floor) + 1e-8)
