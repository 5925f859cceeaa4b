"""Learning-curve figure from the metrics CSV columns."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from unilab_ros.rl.files import write_atomically  # noqa: E402


def plot_learning_curve(
    metrics: dict[str, list[float]],
    path: Path,
    title: str = "",
    best: tuple[int, float] | None = None,
) -> Path:
    """Mean episode return and update time against env steps, as a PNG; ``best``
    (iteration, mean return) marks the kept best policy.

    Written atomically: a disk that refuses it (OSError) leaves the previous figure, or
    none, never an empty or partial PNG."""
    fig, (ax_return, ax_time) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    steps = metrics["env_steps"]
    ax_return.plot(steps, metrics["mean_return"], color="tab:blue")
    if best is not None and best[0] in metrics["iteration"]:
        at = steps[metrics["iteration"].index(best[0])]
        ax_return.plot([at], [best[1]], marker="*", markersize=14, color="tab:red",
                       linestyle="none", label=f"best {best[1]:.1f} (iteration {best[0]})")
        ax_return.legend(loc="lower right")
    ax_return.set_ylabel("mean episode return")
    ax_return.grid(alpha=0.3)
    ax_return.set_title(title or "learning curve")
    ax_time.plot(steps, metrics["update_time"], color="tab:orange")
    ax_time.set_ylabel("update time (s)")
    ax_time.set_xlabel("env steps")
    ax_time.grid(alpha=0.3)
    fig.tight_layout()
    try:
        return write_atomically(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
    finally:
        plt.close(fig)
