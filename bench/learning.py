"""Learning curves over tasks x seeds: does PPO learn, and does it hold what it learned?

    python bench/learning.py                          # every task, seeds 0-4 / 0-2
    python bench/learning.py --tasks pendulum --seeds 0 1 2 --steps 300000
    python bench/learning.py --quick                  # short budgets, a smoke run

Each (task, seed) trains in-process (no ROS) from the task's shipped params file, in
its own process (``--jobs`` at a time). The table gives, per task and seed, the
rolling mean return (last 100 episodes, as the trainer logs it) at fixed env-step
marks, the best and final rolling means, and the worst rolling mean after the task's
threshold was first reached (a collapse shows there), wall seconds and env steps/s.
The last line is machine-readable:

    learning pendulum_worst=<x> pendulum_at_100k_min=<x> ip_at_100k_min=<x> ...

Floating-point rounding differs between CPUs, so a claim holds over seeds or not at all.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Task:
    """One benchmark task: a shipped params file, a budget and a success threshold."""

    name: str
    short: str
    params_file: str
    env_steps: int
    seeds: tuple[int, ...]
    threshold: float
    """Rolling mean return that counts as solved; the worst value after it is reported."""
    marks: tuple[int, ...]


TASKS = {
    task.name: task
    for task in (
        Task("pendulum", "pendulum", "pendulum.yaml", 500_000, (0, 1, 2, 3, 4), -200.0,
             (50_000, 100_000, 150_000, 300_000, 500_000)),
        Task("inverted_pendulum", "ip", "inverted_pendulum.yaml", 300_000, (0, 1, 2), 1000.0,
             (50_000, 100_000, 200_000, 300_000)),
        Task("halfcheetah", "hc", "halfcheetah.yaml", 1_000_000, (0, 1, 2), 1500.0,
             (250_000, 500_000, 1_000_000)),
    )
}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_one(params_file: Path, seed: int, env_steps: int) -> dict:
    """Train one seed in this process; the curve as (env_steps, rolling mean) pairs."""
    from unilab_ros.rl.best import BestPolicy
    from unilab_ros.rl.demo import train
    from unilab_ros.rl.setup_file import load_setup

    setup = load_setup(params_file)
    setup.agent.seed = seed
    per_iteration = setup.agent.num_envs * setup.agent.num_steps
    iterations = math.ceil(env_steps / per_iteration)
    curve: list[tuple[int, float]] = []
    kl_max: list[float] = []

    def record(agent, stats, metrics) -> None:
        curve.append((agent.env_steps, stats.mean_return))
        kl_max.append(metrics["approx_kl_max"])

    start = time.perf_counter()
    best = BestPolicy()
    train(setup, iterations, record, best)
    wall = time.perf_counter() - start
    return {"curve": curve, "wall_s": wall, "kl_max": max(kl_max, default=0.0),
            "best_iteration": best.iteration}


def _child(args: argparse.Namespace) -> None:
    result = run_one(Path(args.params_file), args.seed, args.steps)
    print(json.dumps(result))


def run_in_child(task: Task, seed: int, env_steps: int, config_dir: Path) -> dict:
    command = [sys.executable, __file__, "--child", "--params-file",
               str(config_dir / task.params_file), "--seed", str(seed), "--steps",
               str(env_steps)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{task.name} seed {seed} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(task: Task, result: dict) -> dict:
    """The table's figures from one curve."""
    curve = [(steps, value) for steps, value in result["curve"] if math.isfinite(value)]
    values = [value for _, value in curve]

    def at(mark: int) -> float:
        reached = [value for steps, value in curve if steps >= mark]
        return reached[0] if reached else math.nan

    solved_at = next((i for i, value in enumerate(values) if value >= task.threshold), None)
    worst_after = min(values[solved_at:]) if solved_at is not None else math.nan
    steps = result["curve"][-1][0] if result["curve"] else 0
    return {
        "marks": {mark: at(mark) for mark in task.marks},
        "best": max(values, default=math.nan),
        "final": values[-1] if values else math.nan,
        "worst_after_threshold": worst_after,
        "solved_at_steps": curve[solved_at][0] if solved_at is not None else None,
        "wall_s": result["wall_s"],
        "steps_per_s": steps / max(result["wall_s"], 1e-9),
        "kl_max": result["kl_max"],
    }


def print_table(task: Task, rows: dict[int, dict]) -> None:
    marks = " ".join(f"{f'@{mark // 1000}k':>8}" for mark in task.marks)
    print(f"\n{task.name} (threshold {task.threshold:g}; rolling mean of 100 episodes)")
    print(f"{'seed':>4} {marks} {'best':>8} {'final':>8} {'worst>th':>9} {'solved@':>8} "
          f"{'wall s':>7} {'steps/s':>8} {'kl max':>7}")
    for seed, row in sorted(rows.items()):
        values = " ".join(f"{row['marks'][mark]:8.1f}" for mark in task.marks)
        solved = f"{row['solved_at_steps'] // 1000}k" if row["solved_at_steps"] else "-"
        print(f"{seed:>4} {values} {row['best']:8.1f} {row['final']:8.1f} "
              f"{row['worst_after_threshold']:9.1f} {solved:>8} {row['wall_s']:7.0f} "
              f"{row['steps_per_s']:8.0f} {row['kl_max']:7.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--seeds", nargs="+", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="env steps per run")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel")
    parser.add_argument("--quick", action="store_true", help="a tenth of each budget")
    parser.add_argument("--config-dir", type=Path, default=ROOT / "config")
    parser.add_argument("--json", type=Path, default=None, help="write all results here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--params-file", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args)
        return 0

    print(f"CPU: {cpu_model()} ({platform.machine()}), Python {platform.python_version()}")
    jobs = []
    for name in args.tasks:
        task = TASKS[name]
        budget = args.steps or (task.env_steps // 10 if args.quick else task.env_steps)
        for seed in args.seeds if args.seeds is not None else task.seeds:
            jobs.append((task, seed, budget))
    with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        futures = [pool.submit(run_in_child, task, seed, budget, args.config_dir)
                   for task, seed, budget in jobs]
        results = [future.result() for future in futures]

    summary: dict[str, dict[int, dict]] = {}
    raw: dict[str, dict[int, dict]] = {}
    for (task, seed, _budget), result in zip(jobs, results, strict=True):
        summary.setdefault(task.name, {})[seed] = summarize(task, result)
        raw.setdefault(task.name, {})[seed] = result
    for name, rows in summary.items():
        print_table(TASKS[name], rows)
    if args.json is not None:
        args.json.write_text(json.dumps({"summary": summary, "raw": raw}, default=str))

    figures = []
    for name, rows in summary.items():
        task = TASKS[name]
        worst = min(row["worst_after_threshold"] for row in rows.values())
        figures.append(f"{task.short}_worst={worst:.1f}")
        first_mark = 100_000 if 100_000 in task.marks else task.marks[0]
        low = min(row["marks"][first_mark] for row in rows.values())
        figures.append(f"{task.short}_at_{first_mark // 1000}k_min={low:.1f}")
        final = [row["final"] for row in rows.values()]
        figures.append(f"{task.short}_final_mean={sum(final) / len(final):.1f}")
    print("\nlearning " + " ".join(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
