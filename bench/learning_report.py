"""The learning bench's report: one run's figures from its curve, the per-task table, the
summary's drops over seeds, and the curves figure.
"""

from __future__ import annotations

import math
from pathlib import Path

from learning_tasks import Task
from policy_checks import EVAL_EPISODES

OURS, ROS, SB3 = "in-process", "via ROS", "SB3"
HOLD_FROM = 100_000
"""pendulum_worst looks from here on: the target is >= -250 from 100k through the end."""


def summarize(task: Task, result: dict, marks: tuple[int, ...] | None = None) -> dict:
    """The table's figures from one curve."""
    curve = [(steps, value) for steps, value in result["curve"] if math.isfinite(value)]
    values = [value for _, value in curve]

    def at(mark: int) -> float:
        reached = [value for steps, value in curve if steps >= mark]
        return reached[0] if reached else math.nan

    solved_at = next((i for i, value in enumerate(values) if value >= task.threshold), None)
    worst_after = min(values[solved_at:]) if solved_at is not None else math.nan
    held = [value for steps, value in curve if steps >= HOLD_FROM]
    steps = result["curve"][-1][0] if result["curve"] else 0
    # JSON from the child turned the marks into strings.
    evaluations = {int(mark): value for mark, value in result.get("evaluations", {}).items()}
    return {
        "marks": {mark: at(mark) for mark in (marks or task.marks)},
        "evaluations": evaluations,
        "frozen": result.get("frozen"),
        "frozen_best": result.get("frozen_best"),
        "best_iteration": result.get("best_iteration"),
        "best": max(values, default=math.nan),
        "final": values[-1] if values else math.nan,
        "worst_after_threshold": worst_after,
        "worst_from_100k": min(held) if held else math.nan,
        "solved_at_steps": curve[solved_at][0] if solved_at is not None else None,
        "wall_s": result["wall_s"],
        "steps_per_s": steps / max(result["wall_s"], 1e-9),
        "kl_max": result["kl_max"],
    }


def print_table(task: Task, rows: dict[int, dict], title: str | None = None,
                marks: tuple[int, ...] | None = None) -> None:
    marks = marks or task.marks
    header = " ".join(f"{f'@{mark // 1000}k':>8}" for mark in marks)
    print(f"\n{title or task.name} (threshold {task.threshold:g}; rolling mean of 100 episodes)")
    print(f"{'seed':>4} {header} {'best':>8} {'final':>8} {'worst>th':>9} {'solved@':>8} "
          f"{'wall s':>7} {'steps/s':>8} {'kl max':>7}")
    for seed, row in sorted(rows.items()):
        if "error" in row:
            print(f"{seed:>4} failed: {row['error']}")
            continue
        values = " ".join(f"{row['marks'][mark]:8.1f}" for mark in marks)
        solved = f"{row['solved_at_steps'] // 1000}k" if row["solved_at_steps"] else "-"
        print(f"{seed:>4} {values} {row['best']:8.1f} {row['final']:8.1f} "
              f"{row['worst_after_threshold']:9.1f} {solved:>8} {row['wall_s']:7.0f} "
              f"{row['steps_per_s']:8.0f} {row['kl_max']:7.3f}")
    evaluated = {seed: row["evaluations"] for seed, row in sorted(rows.items())
                 if row.get("evaluations")}
    if evaluated:
        print(f"deterministic policy, mean of {EVAL_EPISODES} evaluation episodes")
        for seed, evaluations in evaluated.items():
            values = " ".join(f"{evaluations.get(mark, math.nan):8.1f}" for mark in marks)
            print(f"{seed:>4} {values}")
    frozen = {seed: row["frozen"] for seed, row in sorted(rows.items()) if row.get("frozen")}
    if frozen:
        print("final policy frozen (sampled actions, no update): rolling means of 100 over "
              "a stream of its episodes")
        for seed, spread in frozen.items():
            print(f"{seed:>4} {spread['min']:8.1f} .. {spread['max']:8.1f} over "
                  f"{spread['episodes']:.0f} episodes; largest drop from a best window "
                  f"{spread['drop']:.3f}")
    paired = {seed: row for seed, row in sorted(rows.items()) if row.get("frozen_best")}
    if paired:
        print("final and kept best policy (best.safetensors) over the same stream of "
              "episodes: mean returns, and (best - final) / |best|")
        for seed, row in paired.items():
            final, best = row["frozen"]["mean"], row["frozen_best"]["mean"]
            print(f"{seed:>4} final {final:9.1f}, best (iteration {row['best_iteration']}) "
                  f"{best:9.1f}: drop {relative_drop(best, final):.3f}")


def lowest(values: list[float]) -> float:
    """The minimum, or nan when there is nothing or a run did not measure it: a missing
    seed must not make a target look met."""
    if not values or any(math.isnan(value) for value in values):
        return math.nan
    return min(values)


def largest(values: list[float]) -> float:
    """The maximum, or nan when there is nothing or a run did not measure it."""
    if not values or any(math.isnan(value) for value in values):
        return math.nan
    return max(values)


def relative_drop(best: float, final: float) -> float:
    """(best - final) / |best|: 0 when final is at best, > 0 when it lost some."""
    return (best - final) / max(abs(best), 1e-9)


def late_drop(rows: dict[int, dict]) -> float:
    """The largest share of its best rolling mean a seed's final one lost (0: it ended at
    its best; the no-late-drop target is at most 0.1); nan for a failed run."""
    return largest([relative_drop(row["best"], row["final"]) if "error" not in row
                    else math.nan for row in rows.values()])


def frozen_drop(rows: dict[int, dict]) -> float:
    """The largest late drop a frozen final policy showed over the seeds (nan: not
    measured): the noise floor ``late_drop`` is read against."""
    return largest([row["frozen"]["drop"] if row.get("frozen") else math.nan
                    for row in rows.values()])


def paired_drop(rows: dict[int, dict]) -> float:
    """The largest drop over seeds from the kept best policy's mean return to the final
    one's, both over the same frozen stream (nan: not measured)."""
    return largest([relative_drop(row["frozen_best"]["mean"], row["frozen"]["mean"])
                    if row.get("frozen_best") else math.nan for row in rows.values()])


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def column(rows: dict[int, dict], pick: str | int) -> list[float]:
    """One figure of every seed (a mark when ``pick`` is an int); nan for a failed run."""
    if isinstance(pick, int):
        return [row["marks"].get(pick, math.nan) if "error" not in row else math.nan
                for row in rows.values()]
    return [row.get(pick, math.nan) for row in rows.values()]


def plot_curves(path: Path, raw: dict[str, dict[str, dict[int, dict]]],
                tasks: dict[str, Task]) -> Path:
    """One panel per task: median and min-max range over seeds of each way's curve, the
    seeds interpolated onto a common env-step grid (where every seed has a value)."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [name for name in tasks if any(name in by_task for by_task in raw.values())]
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4.5), squeeze=False)
    colors = {OURS: "tab:blue", ROS: "tab:green", SB3: "tab:orange"}
    for ax, name in zip(axes[0], names, strict=True):
        task = tasks[name]
        for kind, by_task in raw.items():
            curves = [np.array([(s, v) for s, v in result["curve"] if math.isfinite(v)])
                      for result in by_task.get(name, {}).values() if "error" not in result]
            curves = [curve for curve in curves if len(curve) >= 2]
            if not curves:
                continue
            grid = np.linspace(max(c[0, 0] for c in curves), min(c[-1, 0] for c in curves), 200)
            ys = np.stack([np.interp(grid, c[:, 0], c[:, 1]) for c in curves])
            ax.fill_between(grid, ys.min(axis=0), ys.max(axis=0), color=colors[kind], alpha=0.2)
            ax.plot(grid, np.median(ys, axis=0), color=colors[kind],
                    label=f"{kind}, median and range of {len(curves)} seeds")
        ax.axhline(task.threshold, color="gray", linestyle="--", linewidth=1,
                   label=f"threshold {task.threshold:g}")
        ax.set_title(name)
        ax.set_xlabel("env steps")
        ax.set_ylabel("mean return (last 100 episodes)")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
