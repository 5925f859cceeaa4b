"""How the PPO update runs (compilation, NaN/Inf checks), apart from what it computes.

``PPOConfig`` is the algorithm; these knobs change how fast and how defensively the same
update runs, so they are not saved with a checkpoint. The nodes declare them under the
same ``ppo.`` prefix as the algorithm's fields, so a params file names both alike.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PPORuntimeConfig:
    """How the PPO update runs on this machine."""

    enable_compile: bool = True
    """Compile the mini-batch step (model and optimizer state) with mx.compile."""
    finite_check_interval: int = 8
    """Check loss, gradients and parameters for NaN/Inf every this many mini-batches."""
    warmup_strict_iters: int = 0
    """First iterations that use the warm-up intervals below."""
    warmup_finite_check_interval: int = 1
    """finite_check_interval during warm-up."""
    disable_finite_checks: bool = False
    """Skip the per-mini-batch checks; the end-of-update check always runs."""

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        for name in ("finite_check_interval", "warmup_finite_check_interval"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.warmup_strict_iters < 0:
            raise ValueError("warmup_strict_iters must be >= 0")

    def check_interval(self, iteration: int) -> int:
        """Mini-batches between finite checks in the update of ``iteration``."""
        if 0 <= iteration < self.warmup_strict_iters:
            return self.warmup_finite_check_interval
        return self.finite_check_interval
