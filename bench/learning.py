"""Learning curves over tasks x seeds: does PPO learn, and does it hold what it learned?

    python bench/learning.py                          # every task, seeds 0-4 / 0-2
    python bench/learning.py --tasks pendulum --seeds 0 1 2 --steps 300000
    python bench/learning.py --quick                  # short budgets, a smoke run
    python bench/learning.py --no-ros --no-sb3 --png /tmp/curves.png
    python bench/learning.py --config continuous_control.yaml --tasks ant --no-ours \
        --no-ros --seeds 0                        # SB3 only, beside an earlier run of ours

Each (task, seed) trains in-process (no ROS) from the task's shipped params file, in
its own process (``--jobs`` at a time). The table gives, per task and seed, the
rolling mean return (last 100 episodes, as the trainer logs it) at fixed env-step
marks, the best and final rolling means, and the worst rolling mean after the task's
threshold was first reached (a collapse shows there), wall seconds and env steps/s.

Through ROS (``--ros``, the default for the tasks that list ``ros_seeds``: Pendulum,
seeds 0-2): the main job ``sim_train`` (bridge and trainer as two processes talking over
topics) trains ``--ros-steps`` env steps per seed; its metrics.csv gives the same table.
Stable-Baselines3 (``--sb3``, the default when it imports; ``make bench`` installs it):
SB3's PPO on the same task, budget and env count, with rl-baselines3-zoo's
hyperparameters where it has them (``sb3_zoo.py``). ``--png`` draws the median and the
min-max range over seeds of every curve, one panel per task. The last line is
machine-readable:

    learning pendulum_worst=<x> pendulum_at_100k_min=<x> ip_at_100k_min=<x> \
hc_at_1m_mean=<x> sb3_hc_at_1m_mean=<x> ip_eval_at_100k_min=<x> ip_eval_min_from_100k=<x>

pendulum_worst is the lowest rolling mean from 100k env steps to the end over every
pendulum run (in-process and ROS), pendulum_at_100k_min the lowest at 100k, and
ip_at_100k_min the same for InvertedPendulum; the hc figures average over seeds at 1M.
In-process runs also evaluate the deterministic policy (the action mean, as a deployment
acts) at each mark over EVAL_EPISODES fresh episodes, as rl-zoo reports its results:
a rolling mean of 100 InvertedPendulum episodes of 1,000 steps cannot read 1,000 before
100 x 1,000 env steps, whatever the policy. ip_eval_at_100k_min is the lowest evaluation
at 100k over seeds, ip_eval_min_from_100k the lowest from 100k to the end.
After training, the final policy is frozen and keeps acting as in training over a stream
of up to 400 episodes (``policy_checks.frozen_spread``): the range of its rolling means and
the largest drop from a best window to a later one are the noise floor of the late-drop
figure; frozen_drop_max in each summary line is the largest over seeds. The kept best
policy (what best.safetensors holds) then acts over the very same stream (the same
initial states and noise): paired_drop_max is the largest (best - final) / |best| of the
two mean returns over seeds, the late drop without the noise of comparing two windows.
nan: not measured (or a run failed, which is printed above).

The table, the summary lines and the figure come from ``learning_report.py``; the tasks
from ``learning_tasks.py`` (``--config``: ``general_config.py``'s development set).
``--results-page`` writes what the run printed into docs/results.md (``results_page.py``):
section ``learning``, or ``general_config:<config stem>`` with ``--config``.

Floating-point rounding differs between CPUs, so a claim holds over seeds or not at all.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from general_config import DEV_TASKS, task_files
from learning_report import (
    HOLD_FROM,
    OURS,
    ROS,
    SB3,
    column,
    frozen_drop,
    late_drop,
    lowest,
    mean,
    paired_drop,
    plot_curves,
    print_table,
    summarize,
)
from learning_tasks import TASKS, Task
from policy_checks import evaluate, frozen_spread
from results_page import FLAG_HELP, cpu_model, recording
from sb3_zoo import run_sb3, sb3_settings, sb3_status

ROOT = Path(__file__).resolve().parents[1]
ROS_STEPS = 150_000
"""Default budget through ROS: the issue's target for ROS seeds holds through 150k."""


@dataclass(frozen=True)
class Job:
    """One training run: a task and seed, trained one of the three ways."""

    task: Task
    kind: str
    seed: int
    env_steps: int
    domain_id: int = 0
    """ROS runs only: the ROS_DOMAIN_ID of this run's graph."""
    work_dir: Path = field(default_factory=Path)
    """The child's working directory (a temporary one: MuJoCo drops MUJOCO_LOG.TXT into
    it); a ROS run's sim_train output goes below it."""


def run_one(params_file: Path, seed: int, env_steps: int, marks: tuple[int, ...]) -> dict:
    """Train one seed in this process: the curve as (env_steps, rolling mean) pairs, and
    the deterministic policy's evaluation return at each of ``marks``."""
    from unilab_ros.config.training_setup import load_setup
    from unilab_ros.rl.best import BestPolicy
    from unilab_ros.tools.demo import train

    setup = load_setup(params_file)
    setup.agent.seed = seed
    per_iteration = setup.agent.num_envs * setup.agent.num_steps
    iterations = math.ceil(env_steps / per_iteration)
    curve: list[tuple[int, float]] = []
    kl_max: list[float] = []

    evaluations: dict[int, float] = {}
    pending = list(marks)

    def record(agent, stats, metrics) -> None:
        curve.append((agent.env_steps, stats.mean_return))
        kl_max.append(metrics["approx_kl_max"])
        if pending and agent.env_steps >= pending[0]:
            # Evaluation time is not training time: it stays out of the wall clock.
            paused = time.perf_counter()
            evaluations[pending.pop(0)] = evaluate(agent, setup, seed)
            nonlocal start
            start += time.perf_counter() - paused

    start = time.perf_counter()
    best = BestPolicy()
    agent, _ = train(setup, iterations, record, best)
    wall = time.perf_counter() - start
    frozen = frozen_spread(agent, setup, seed)
    frozen_best = None
    if best.parameters is not None:
        # The kept best policy over the very same stream (initial states and noise): the
        # late drop without the episode-to-episode noise of two different windows.
        agent.model.update(best.parameters)
        frozen_best = frozen_spread(agent, setup, seed)
    return {"curve": curve, "wall_s": wall, "kl_max": max(kl_max, default=0.0),
            "best_iteration": best.iteration, "evaluations": evaluations,
            "frozen": frozen, "frozen_best": frozen_best}


def _child(args: argparse.Namespace) -> None:
    if args.child == SB3:
        result = run_sb3(args.env_id, args.num_envs, args.max_episode_steps, args.seed,
                         args.steps)
    else:
        result = run_one(Path(args.params_file), args.seed, args.steps, tuple(args.marks))
    print(json.dumps(result))


def run_in_child(job: Job, config_dir: Path) -> dict:
    command = [sys.executable, __file__, "--child", OURS, "--params-file",
               str(config_dir / job.task.params_file), "--seed", str(job.seed), "--steps",
               str(job.env_steps), "--marks", *(str(mark) for mark in job.task.marks)]
    return _run_json_child(command, f"{job.task.name} seed {job.seed}", job.work_dir)


def task_env(task: Task, config_dir: Path) -> tuple[str, int, int]:
    """The task's env id, env count and time limit (0: the env's own), from its params."""
    from unilab_ros.config.training_setup import load_setup

    setup = load_setup(config_dir / task.params_file)
    return setup.env_id, setup.agent.num_envs, setup.max_episode_steps


def run_sb3_in_child(job: Job, config_dir: Path) -> dict:
    # The child gets the env from us: it then imports torch and SB3 but not MLX.
    env_id, num_envs, max_episode_steps = task_env(job.task, config_dir)
    command = [sys.executable, __file__, "--child", SB3, "--env-id", env_id, "--num-envs",
               str(num_envs), "--max-episode-steps", str(max_episode_steps), "--seed",
               str(job.seed), "--steps", str(job.env_steps)]
    return _run_json_child(command, f"{job.task.name} SB3 seed {job.seed}", job.work_dir)


def _run_json_child(command: list[str], what: str, cwd: Path) -> dict:
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=cwd)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_ros(job: Job, config_dir: Path) -> dict:
    """Train one seed through ROS: sim_train (bridge + trainer, two processes) in a child
    process on its own domain; the curve from the run's metrics.csv."""
    from unilab_ros.config.training_setup import load_setup
    from unilab_ros.trainer.metrics_log import read_metrics

    params_file = config_dir / job.task.params_file
    setup = load_setup(params_file)
    iterations = math.ceil(job.env_steps / (setup.agent.num_envs * setup.agent.num_steps))
    output = job.work_dir / f"{job.task.name}_ros_seed{job.seed}"
    output.mkdir(parents=True, exist_ok=True)
    # sim_train gives up after --timeout; ~300 steps/s is a tenth of its usual rate here.
    timeout = max(900.0, job.env_steps / 300)
    command = [sys.executable, "-m", "unilab_ros.tools.sim_train",
               "--params-file", str(params_file),
               "--iterations", str(iterations), "--output", str(output), "--seed", str(job.seed),
               "--domain-id", str(job.domain_id), "--timeout", f"{timeout:.0f}"]
    log = output / "sim_train.log"
    # Wall time includes starting both nodes and ROS discovery, as a user's run does.
    start = time.perf_counter()
    with open(log, "w") as handle:
        done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, check=False,
                              cwd=job.work_dir)
    wall = time.perf_counter() - start
    metrics_csv = output / "metrics.csv"
    if done.returncode != 0 or not metrics_csv.is_file():
        tail = log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{job.task.name} via ROS seed {job.seed} failed "
                           f"(exit {done.returncode}):\n{tail}")
    metrics = read_metrics(metrics_csv)
    curve = [(int(steps), value)
             for steps, value in zip(metrics["env_steps"], metrics["mean_return"], strict=True)]
    kl = [value for value in metrics.get("approx_kl_max", []) if math.isfinite(value)]
    return {"curve": curve, "wall_s": wall, "kl_max": max(kl, default=math.nan),
            "best_iteration": None}


def run_job(job: Job, config_dir: Path) -> dict:
    """A job's result, or {"error": ...}: one failed run must not discard the others."""
    try:
        if job.kind == ROS:
            return run_ros(job, config_dir)
        if job.kind == SB3:
            return run_sb3_in_child(job, config_dir)
        return run_in_child(job, config_dir)
    except Exception as error:  # reported on stderr and as "failed" in the table
        print(f"\n{error}", file=sys.stderr, flush=True)
        return {"error": str(error).splitlines()[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=None,
                        help=f"tasks (default: all); shipped configs: {', '.join(TASKS)}; "
                             "with --config: the development set's")
    parser.add_argument("--config", type=Path, default=None,
                        help="train the development set (general_config.DEV_TASKS) from this "
                             "one params file, only the sizes changed (a name: config/<name>)")
    parser.add_argument("--seeds", nargs="+", type=int, default=None,
                        help="seeds of every part (default: each task's, ROS: its ros_seeds)")
    parser.add_argument("--sb3-seeds", nargs="+", type=int, default=None,
                        help="SB3's seeds, when fewer than ours fit the time (default: ours)")
    parser.add_argument("--steps", type=int, default=None, help="env steps per run")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel")
    parser.add_argument("--quick", action="store_true", help="a tenth of each budget")
    parser.add_argument("--ours", action=argparse.BooleanOptionalAction, default=True,
                        help="train ours in process (--no-ours: only the ROS and SB3 parts, "
                             "say SB3 for a run of ours already measured)")
    parser.add_argument("--ros", action=argparse.BooleanOptionalAction, default=True,
                        help="also train through ROS (sim_train), tasks with ros_seeds")
    parser.add_argument("--ros-steps", type=int, default=None,
                        help=f"env steps per ROS run (default {ROS_STEPS}; the "
                             "development set: each task's budget)")
    parser.add_argument("--sb3", action=argparse.BooleanOptionalAction, default=None,
                        help="also train Stable-Baselines3 PPO (default: when it imports)")
    parser.add_argument("--png", type=lambda text: Path(text) if text else None,
                        default=ROOT / "bench" / "learning.png",
                        help="the curves figure (default bench/learning.png; '': none)")
    parser.add_argument("--config-dir", type=Path, default=ROOT / "config")
    parser.add_argument("--json", type=Path, default=None, help="write all results here")
    parser.add_argument("--results-page", action="store_true", help=FLAG_HELP)
    parser.add_argument("--child", choices=[OURS, SB3], help=argparse.SUPPRESS)
    parser.add_argument("--params-file", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--env-id", help=argparse.SUPPRESS)
    parser.add_argument("--num-envs", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--max-episode-steps", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--marks", nargs="*", type=int, default=[], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args)
        return 0
    # The development set's section is its own: a run of the shipped task configs must not
    # replace it, nor it theirs.
    key = "learning" if args.config is None else f"general_config:{args.config.stem}"
    with recording(key, args.results_page):
        return _bench(args, parser)


def _bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Train every job, then print the tables, the summary lines and the last line."""
    print(f"CPU: {cpu_model()} ({platform.machine()}), Python {platform.python_version()}")
    sb3_ok, sb3_note = sb3_status()
    run_sb3_part = sb3_ok and args.sb3 is not False
    if args.sb3 is not False and not sb3_ok:
        print(f"SB3: skipped ({sb3_note})")
    jobs: list[Job] = []
    sb3_sources: dict[str, str] = {}
    config_dir = args.config_dir.resolve()  # the children run in a temporary directory
    tasks = TASKS
    if args.config is not None:
        tasks = DEV_TASKS
    names = args.tasks or list(tasks)
    unknown = sorted(set(names) - set(tasks))
    if unknown:
        parser.error(f"unknown tasks {unknown}: choose from {', '.join(tasks)}")

    def budget_of(task: Task) -> int:
        return args.steps or (task.env_steps // 10 if args.quick else task.env_steps)

    with tempfile.TemporaryDirectory(prefix="unilab_learning_") as tmp:
        if args.config is not None:
            general = args.config if args.config.is_file() else ROOT / "config" / args.config
            print(f"general config: {general}")
            config_dir = task_files(general, Path(tmp) / "config",
                                    {name: budget_of(tasks[name]) for name in names})
        for name in names:
            task = tasks[name]
            budget = budget_of(task)
            seeds = args.seeds if args.seeds is not None else task.seeds
            jobs += [Job(task, OURS, seed, budget) for seed in seeds if args.ours]
            if args.ros and task.ros_seeds:
                ros_seeds = args.seeds if args.seeds is not None else task.ros_seeds
                ros_budget = args.ros_steps or (
                    budget if task.ros_full_budget
                    else ROS_STEPS // 10 if args.quick else ROS_STEPS)
                jobs += [Job(task, ROS, seed, ros_budget) for seed in ros_seeds]
            if run_sb3_part:
                sb3_seeds = args.sb3_seeds if args.sb3_seeds is not None else seeds
                jobs += [Job(task, SB3, seed, budget) for seed in sb3_seeds]
                env_id, num_envs, _ = task_env(task, config_dir)
                sb3_sources[name] = sb3_settings(env_id, num_envs)[2]
        # Domain ids distinct per ROS run (1..100, repeating only 100 runs apart), offset
        # by our pid so that two benches or a demo beside this one rarely share a graph.
        domain_ids = iter(range(os.getpid(), os.getpid() + len(jobs)))
        jobs = [replace(job, work_dir=Path(tmp),
                        domain_id=1 + next(domain_ids) % 100 if job.kind == ROS else 0)
                for job in jobs]
        with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
            futures = [pool.submit(run_job, job, config_dir) for job in jobs]
            results = [future.result() for future in futures]

    summary: dict[str, dict[str, dict[int, dict]]] = {OURS: {}, ROS: {}, SB3: {}}
    raw: dict[str, dict[str, dict[int, dict]]] = {OURS: {}, ROS: {}, SB3: {}}
    marks: dict[tuple[str, str], tuple[int, ...]] = {}
    for job, result in zip(jobs, results, strict=True):
        # The ROS budget is not the task's: its table stops at the marks it reaches.
        marks[job.kind, job.task.name] = (
            tuple(m for m in job.task.marks if m <= job.env_steps) or job.task.marks
            if job.kind == ROS else job.task.marks)
        row = result if "error" in result else summarize(job.task, result,
                                                         marks[job.kind, job.task.name])
        summary[job.kind].setdefault(job.task.name, {})[job.seed] = row
        raw[job.kind].setdefault(job.task.name, {})[job.seed] = result
    for kind, by_task in summary.items():
        for name, rows in by_task.items():
            title = {OURS: name, ROS: f"{name} via ROS",
                     SB3: f"{name} SB3 {sb3_note} ({sb3_sources.get(name)})"}[kind]
            print_table(tasks[name], rows, title, marks[kind, name])
    if args.json is not None:
        args.json.write_text(json.dumps({"summary": summary, "raw": raw}, default=str))

    print()
    for kind, by_task in summary.items():
        for name, rows in by_task.items():
            task = tasks[name]
            first_mark = 100_000 if 100_000 in task.marks else task.marks[0]
            print(f"summary {task.short} {kind}: "
                  f"worst>th={lowest(column(rows, 'worst_after_threshold')):.1f} "
                  f"at_{first_mark // 1000}k_min={lowest(column(rows, first_mark)):.1f} "
                  f"final_mean={mean(column(rows, 'final')):.1f} "
                  f"late_drop_max={late_drop(rows):.3f} "
                  f"frozen_drop_max={frozen_drop(rows):.3f} "
                  f"paired_drop_max={paired_drop(rows):.3f}")

    if any(raw[kind] for kind in raw) and args.png:
        print(f"curves: {plot_curves(args.png, raw, tasks)}")

    pendulum = [summary[kind].get("pendulum", {}) for kind in (OURS, ROS)]
    pendulum_worst = lowest([v for rows in pendulum for v in column(rows, "worst_from_100k")])
    pendulum_low = lowest([v for rows in pendulum for v in column(rows, 100_000)])
    ip_rows = summary[OURS].get("inverted_pendulum", {})
    ip_low = lowest(column(ip_rows, 100_000))
    ip_evals = [row.get("evaluations", {}) if "error" not in row else {}
                for row in ip_rows.values()]
    ip_eval_low = lowest([evals.get(100_000, math.nan) for evals in ip_evals])
    ip_eval_held = lowest([value for evals in ip_evals for mark, value in evals.items()
                           if mark >= HOLD_FROM] or [math.nan] * bool(ip_evals))
    hc = mean(column(summary[OURS].get("halfcheetah", {}), 1_000_000))
    sb3_hc = mean(column(summary[SB3].get("halfcheetah", {}), 1_000_000))
    print(f"learning pendulum_worst={pendulum_worst:.1f} pendulum_at_100k_min={pendulum_low:.1f} "
          f"ip_at_100k_min={ip_low:.1f} hc_at_1m_mean={hc:.1f} sb3_hc_at_1m_mean={sb3_hc:.1f} "
          f"ip_eval_at_100k_min={ip_eval_low:.1f} ip_eval_min_from_100k={ip_eval_held:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
