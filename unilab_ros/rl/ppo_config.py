"""PPO's hyperparameters (ROS-free; declared as the trainer's ``ppo.*`` parameters)."""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("fixed", "adaptive", "linear")


@dataclass
class PPOConfig:
    """PPO hyperparameters (the fields and meanings of the earlier MLX trainer); how the
    update runs (compilation, NaN/Inf checks) is ``PPORuntimeConfig``."""

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
    """Adam learning rate (the initial one under the adaptive and linear schedules)."""
    use_clipped_value_loss: bool = True
    """Clip value predictions around the rollout's values, as rsl_rl does."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip; <= 0 disables it."""
    log_ratio_clip: float = 20.0
    """Clip on log(pi/pi_old) before the exp, against overflow."""
    schedule: str = "fixed"
    """"fixed"; "adaptive": rsl_rl's rule, on every mini-batch's KL before its step:
    rate / adaptive_lr_decay above 2 x desired_kl, x adaptive_lr_growth below half;
    "linear": each update's rate falls in a straight line from learning_rate to
    final_learning_rate_fraction x learning_rate (at least min_learning_rate) over
    schedule_iterations updates, then stays there (CleanRL's anneal_lr, with a floor). It
    follows the agent's iteration count, so a resumed run goes on down the same line, and
    a rate set while running holds until the next update."""
    schedule_iterations: int = 0
    """Linear schedule: updates the decay takes (e.g. the run's max_iterations); update k
    (from 0) steps with learning_rate + (floor - learning_rate) x min(k / this, 1)."""
    final_learning_rate_fraction: float = 0.0
    """Linear schedule: the floor as a fraction of learning_rate, in [0, 1] (0, as SB3's
    and CleanRL's linear schedules, ends at min_learning_rate)."""
    desired_kl: float = 0.01
    """Adaptive schedule: target KL per mini-batch."""
    min_learning_rate: float = 1e-5
    """Lowest learning rate: the adaptive schedule's floor, and the least a rate given at
    start or set while running may be."""
    max_learning_rate: float = 1e-2
    """Highest learning rate: the adaptive schedule's ceiling, and the most a rate given
    at start or set while running may be."""
    adaptive_lr_decay: float = 1.5
    """Adaptive schedule: divide the rate by this when KL > 2 desired (rsl_rl: 1.5)."""
    adaptive_lr_growth: float = 1.5
    """Adaptive schedule: multiply the rate by this when KL < desired / 2 (rsl_rl: 1.5)."""
    target_kl_stop: float = 0.0
    """Early stop (as Stable-Baselines3's target_kl, without its 1.5 factor): before each
    mini-batch's step, the exact KL from the acting policy to the current one (after every
    step applied so far) is measured on that mini-batch's samples; the first over this is
    not applied and ends the update's epochs. So the policy kept is the one whose KL
    passed the limit on the mini-batch that stopped the epochs; ``approx_kl_max`` counts
    applied steps only, so it stays at or under the limit, and ``early_stopped_kl`` says
    the stop fired. 0 disables."""
    normalize_advantage_per_mini_batch: bool = False
    """rsl_rl's flag: normalize advantages within each mini-batch, else once over the rollout."""
    advantage_std_floor: float = 0.1
    """Advantages are divided by max(std, this x the running mean of past rollouts' std):
    a rollout with almost no return spread is not blown up to unit std; 0 disables."""
    bounds_loss_coef: float = 1.0
    """Weight of the squared excess of the action mean beyond the action limits (in policy
    units), so the mean cannot run away where clipping hides the action; 0 disables."""
    anchor_coef: float = 0.0
    """Weight of the KL from the anchor policy (the policy fine-tuning started from, see
    ``PPOTrainer.set_anchor``) to the current one, so early updates on a robot cannot
    wander far from what worked in simulation; 0 disables."""

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        for name in ("num_learning_epochs", "num_mini_batches"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, not '{self.schedule}'")
        if not 0.0 <= self.gamma <= 1.0 or not 0.0 <= self.lam <= 1.0:
            raise ValueError("gamma and lam must be in [0, 1]")
        if self.clip_param <= 0.0:
            raise ValueError("clip_param must be positive")
        if not 0.0 < self.min_learning_rate <= self.max_learning_rate:
            raise ValueError("need 0 < min_learning_rate <= max_learning_rate")
        self.check_learning_rate(self.learning_rate)
        if self.schedule == "adaptive" and self.desired_kl <= 0.0:
            raise ValueError("desired_kl must be positive under the adaptive schedule")
        if self.schedule == "linear" and int(self.schedule_iterations) < 1:
            raise ValueError("schedule_iterations must be >= 1 under the linear schedule "
                             "(the updates the rate decays over)")
        if not 0.0 <= self.final_learning_rate_fraction <= 1.0:
            raise ValueError("final_learning_rate_fraction must be in [0, 1]")
        if self.log_ratio_clip <= 0.0:
            raise ValueError("log_ratio_clip must be positive (0 pins the ratio at 1)")
        if self.target_kl_stop < 0.0:
            raise ValueError("target_kl_stop must be >= 0")
        if self.advantage_std_floor < 0.0 or self.bounds_loss_coef < 0.0:
            raise ValueError("advantage_std_floor and bounds_loss_coef must be >= 0")
        if not self.anchor_coef >= 0.0:
            raise ValueError("anchor_coef must be >= 0")
        if self.adaptive_lr_decay <= 1.0 or self.adaptive_lr_growth < 1.0:
            raise ValueError("need adaptive_lr_decay > 1 and adaptive_lr_growth >= 1")

    def check_learning_rate(self, rate: float) -> None:
        """Raise ValueError unless ``rate`` lies in min_learning_rate .. max_learning_rate
        (a rate set while running is checked so too: one Adam step at 1e9 wrecks the
        weights for good)."""
        if not self.min_learning_rate <= rate <= self.max_learning_rate:
            raise ValueError(
                f"learning_rate {rate:g} lies outside min_learning_rate .. max_learning_rate "
                f"({self.min_learning_rate:g} .. {self.max_learning_rate:g})"
            )

    def linear_learning_rate(self, iteration: int) -> float:
        """The linear schedule's rate for update ``iteration`` (counted from 0)."""
        start = float(self.learning_rate)
        floor = max(self.min_learning_rate, self.final_learning_rate_fraction * start)
        progress = min(max(iteration, 0) / int(self.schedule_iterations), 1.0)
        # Weighted, so the line starts at exactly learning_rate and ends at exactly floor.
        return start * (1.0 - progress) + floor * progress
