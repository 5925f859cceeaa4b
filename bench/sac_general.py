"""The general off-policy file through the topic contract on development tasks, beside
Stable-Baselines3's SAC in process.

    python bench/sac_general.py                    # 4 tasks x seeds 0-2 x 200k env steps
    python bench/sac_general.py --tasks inverted_double_pendulum --seeds 0 --steps 50000
    python bench/sac_general.py --jobs 1 --results-page

Per task, from ``config/continuous_control_sac.yaml`` with only the task's sizes, action
bounds and budget changed (``general_config.task_files``, as PPO's general-config bench
makes its copies):

- the time of one gradient step on this CPU, ours and SB3's, each measured alone (nothing
  else running) over 200 steps at the task's sizes after a warm-up;
- ours through ROS: ``sim_train`` (the Gymnasium bridge and the trainer as two processes on
  an isolated graph) per seed. The bridge's log lines give the mean return of the episodes
  that ended in each log period and the observation -> action latency (p50 / p99 over its
  last 1,000 answered steps); the trainer's metrics.csv the env steps per second;
- SB3's SAC in process on the same env id, budget and settings (``sac_learning.run_sb3_on``);
- PPO through ROS on the same task for ``--ppo-iterations`` (the general PPO file), in the
  same run, for its latency beside ours; PPO's return at 1M is the general-config page's
  (docs/results.md, ``PPO_AT_1M``).

``--jobs`` runs go at once (default 2 on this 2-core machine; the gradient-step timings
never have a neighbour, the runs' wall time, steps/s and latency do when jobs > 1, as the
output says). Each run's BLAS and PyTorch use ``--threads`` threads (default: the CPUs
shared among the jobs): two runs of two threads each on two cores left ours with an eighth
of the CPU beside SB3's (HalfCheetah, 64 gradient steps in 9-18 s). A run's figure is its
last-decile return: the mean return of the episodes that ended in the last tenth of its
budget. The last line:

    sac_general <task>_ours=<mean over seeds> <task>_sb3=<mean over seeds> ...
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from general_config import DEV_TASKS, ENV_IDS, task_files  # noqa: E402  (bench: no package)
from results_page import FLAG_HELP, cpu_model, recording  # noqa: E402
from sac_learning import run_sb3_on, threads_env  # noqa: E402

TASKS = ("halfcheetah", "ant", "inverted_double_pendulum", "reacher")
BUDGET = 200_000
PPO_AT_1M = {"halfcheetah": 5232.0, "ant": 2342.0, "inverted_double_pendulum": 8277.0,
             "reacher": -4.82}
"""The package's PPO with the general file, final return, mean over seeds 0-2 (1M for the
locomotion tasks, 300k for the others): docs/results.md, general_config, commit afb6187."""
TIMED_STEPS = 200
LOG_PERIOD_S = 2.0
BRIDGE_LINE = re.compile(r"(\d+) steps, \d+ episodes; mean return of the last (\d+): "
                         r"(-?[\d.]+)")
LATENCY = re.compile(r"observation -> action ([\d.]+) ms p50, ([\d.]+) ms p99")


def sac_section(params_file: Path) -> tuple[dict, dict]:
    """The trainer's parameters (of either learner's file) and its ``sac`` section."""
    import yaml

    params = yaml.safe_load(params_file.read_text())["/**/unilab_trainer"]["ros__parameters"]
    return params, dict(params.get("sac") or {})


def time_ours(params_file: Path) -> float:
    """Median seconds of one gradient step of ours at the file's sizes."""
    import unilab_ros.rl  # noqa: F401 - the BLAS before mlx
    from unilab_ros.rl.agent import AgentConfig
    from unilab_ros.rl.sac_agent import SACAgent
    from unilab_ros.rl.sac_config import SACConfig

    params, sac = sac_section(params_file)
    cfg = SACConfig(**{**sac, "learning_starts": 0})
    agent = SACAgent(AgentConfig(1, int(params["obs_dim"]), int(params["action_dim"])), cfg)
    rng = np.random.default_rng(0)
    for _ in range(2 * TIMED_STEPS):
        obs = rng.standard_normal((1, agent.obs_dim)).astype(np.float32)
        agent.record(obs, agent.act(obs), rng.standard_normal(1), np.zeros(1, np.uint8))
    agent.learn(20)  # compiles the step
    times = [agent.learn(1)["learn_time"] for _ in range(TIMED_STEPS)]
    return float(np.median(times))


def time_sb3(env_id: str, params_file: Path) -> float:
    """Median seconds of one gradient step of SB3's SAC with the file's settings."""
    import gymnasium as gym
    from stable_baselines3 import SAC

    _, sac = sac_section(params_file)
    widths = sac.get("actor_hidden_dims", [256, 256])
    model = SAC("MlpPolicy", gym.make(env_id), seed=0, verbose=0, device="cpu",
                batch_size=sac.get("batch_size", 256), learning_starts=2 * TIMED_STEPS,
                policy_kwargs={"net_arch": {"pi": widths,
                                            "qf": sac.get("critic_hidden_dims", widths)}})
    model.learn(total_timesteps=2 * TIMED_STEPS)  # fills replay; no gradient step yet
    model.train(gradient_steps=20, batch_size=model.batch_size)
    times = []
    for _ in range(TIMED_STEPS):
        start = time.perf_counter()
        model.train(gradient_steps=1, batch_size=model.batch_size)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def sb3_run(env_id: str, params_file: Path, seed: int, steps: int) -> dict:
    import gymnasium as gym

    _, sac = sac_section(params_file)
    result = run_sb3_on(gym.make(env_id), seed, steps, sac, evaluation=False)
    ends = [(at, ret) for at, ret, _, _ in result["episodes"]]
    return {"ends": ends, "wall": result["wall"]}


def child(args: argparse.Namespace) -> None:
    params_file = Path(args.params_file)
    if args.child == "time-ours":
        result: dict = {"step_s": time_ours(params_file)}
    elif args.child == "time-sb3":
        result = {"step_s": time_sb3(args.env_id, params_file)}
    else:
        result = sb3_run(args.env_id, params_file, args.seed, args.steps)
    print(json.dumps(result))


def in_child(kind: str, params_file: Path, env_id: str = "", seed: int = 0,
             steps: int = 0, threads: int | None = None) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", kind, "--params-file",
                           str(params_file), "--env-id", env_id, "--seed", str(seed),
                           "--steps", str(steps)], capture_output=True, text=True,
                          check=False, cwd=tempfile.gettempdir(), env=threads_env(threads))
    if done.returncode != 0:
        raise RuntimeError(f"{kind} {env_id} seed {seed}: {done.stderr[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def ros_run(params_file: Path, seed: int, steps: int, out: Path, domain: int,
            threads: int) -> dict:
    """One run of sim_train; the episode means of the bridge's log lines (env steps at the
    line, episodes, mean), the last latency figures and the trainer's env steps/s."""
    from unilab_ros.trainer.metrics_log import read_metrics

    params, _ = sac_section(params_file)
    num_envs = int(params["num_envs"])
    iterations = math.ceil(steps / (num_envs * int(params["num_steps"])))
    out.mkdir(parents=True, exist_ok=True)
    log = out / "sim_train.log"
    began = time.perf_counter()
    with log.open("w") as handle:
        done = subprocess.run(
            [sys.executable, "-m", "unilab_ros.tools.sim_train", "--params-file",
             str(params_file), "--iterations", str(iterations), "--output", str(out / "run"),
             "--seed", str(seed), "--domain-id", str(domain), "--timeout", "14400"],
            stdout=handle, stderr=subprocess.STDOUT, check=False, cwd=out,
            env=threads_env(threads))
    wall = time.perf_counter() - began
    metrics = out / "run" / "metrics.csv"
    if done.returncode != 0 or not metrics.is_file():
        raise RuntimeError(f"{params_file.name} seed {seed} through ROS failed "
                           f"(exit {done.returncode}): {log.read_text()[-1500:]}")
    text = log.read_text(errors="replace")
    ends = [(int(match[1]) * num_envs, float(match[3]), int(match[2]))
            for match in BRIDGE_LINE.finditer(text)]
    latencies = LATENCY.findall(text)
    latency = (tuple(float(v) for v in latencies[-1]) if latencies
               else (math.nan, math.nan))
    rates = read_metrics(metrics).get("steps_per_s", [])
    return {"ends": ends, "wall": wall, "latency": latency,
            "steps_per_s": float(np.median(rates[1:] or rates)) if rates else math.nan}


def last_decile(ends: list[tuple], steps: int) -> float:
    """Mean return of the episodes that ended in the last tenth of ``steps``: ours come in
    groups (a log line's episodes and their mean), SB3's one by one."""
    inside = [(end[1], end[2] if len(end) > 2 else 1) for end in ends if end[0] > 0.9 * steps]
    total = sum(count for _, count in inside)
    return sum(mean * count for mean, count in inside) / total if total else math.nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(DEV_TASKS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=BUDGET, help="env steps per run")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once")
    parser.add_argument("--threads", type=int, default=None,
                        help="BLAS / PyTorch threads per run (default: CPUs / jobs)")
    parser.add_argument("--ppo-iterations", type=int, default=10,
                        help="PPO's run through ROS for its latency (0: none)")
    parser.add_argument("--no-sb3", action="store_true", help="ours only")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--results-page", action="store_true", help=FLAG_HELP)
    parser.add_argument("--child", choices=("time-ours", "time-sb3", "sb3"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--params-file", help=argparse.SUPPRESS)
    parser.add_argument("--env-id", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    key = "sac_general" + ("" if args.tasks == list(TASKS) else ":" + ",".join(args.tasks))
    with recording(key, args.results_page):
        _bench(args)


def _bench(args: argparse.Namespace) -> None:
    out = args.out or Path(tempfile.mkdtemp(prefix="sac_general_"))
    sac_files = task_files(ROOT / "config" / "continuous_control_sac.yaml", out / "sac",
                           {task: args.steps for task in args.tasks})
    ppo_files = task_files(ROOT / "config" / "continuous_control.yaml", out / "ppo", {})
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    print(f"CPU: {cpu_model()}; {args.jobs} run(s) at a time, {threads} BLAS / PyTorch "
          f"thread(s) each; {args.steps} env steps per run; output {out}")
    files = {task: sac_files / DEV_TASKS[task].params_file for task in args.tasks}
    for folder in (sac_files, ppo_files):
        for task in args.tasks:
            _log_often(folder / DEV_TASKS[task].params_file)
    for task in args.tasks:
        ours = in_child("time-ours", files[task])["step_s"]
        sb3 = (math.nan if args.no_sb3 else
               in_child("time-sb3", files[task], ENV_IDS[task])["step_s"])
        print(f"{task}: one gradient step, measured alone: ours {1e3 * ours:.2f} ms, "
              f"SB3 {1e3 * sb3:.2f} ms")
    jobs: dict[tuple[str, str, int], object] = {}
    with ThreadPoolExecutor(args.jobs) as pool:
        for t, task in enumerate(args.tasks):
            for seed in args.seeds:
                jobs[(task, "ours", seed)] = pool.submit(
                    ros_run, files[task], seed, args.steps, out / f"{task}_ours_{seed}",
                    20 + 10 * t + seed, threads)
                if not args.no_sb3:
                    jobs[(task, "sb3", seed)] = pool.submit(
                        in_child, "sb3", files[task], ENV_IDS[task], seed, args.steps,
                        threads)
            if args.ppo_iterations:
                ppo_file = ppo_files / DEV_TASKS[task].params_file
                params, _ = sac_section(ppo_file)
                ppo_steps = args.ppo_iterations * int(params["num_envs"]) * int(
                    params["num_steps"])
                jobs[(task, "ppo", 0)] = pool.submit(
                    ros_run, ppo_file, 0, ppo_steps, out / f"{task}_ppo_0", 25 + 10 * t,
                    threads)
    _report(args, {key: _result(future) for key, future in jobs.items()})


def _log_often(params_file: Path) -> None:
    """The bridge logs its episodes' returns and its latency every LOG_PERIOD_S: the
    last decile of a run gets many lines, and a short PPO run at least one."""
    import yaml

    document = yaml.safe_load(params_file.read_text())
    document["/**/gym_env"]["ros__parameters"]["log_period"] = LOG_PERIOD_S
    params_file.write_text(yaml.safe_dump(document))


def _result(future) -> dict:  # noqa: ANN001 - a Future
    try:
        return future.result()
    except RuntimeError as error:
        return {"error": str(error).splitlines()[0]}


def _report(args: argparse.Namespace, results: dict) -> None:
    summary = []
    for task in args.tasks:
        print(f"\n{task} ({ENV_IDS[task]}), {args.steps} env steps; last-decile return; "
              f"PPO's general file at its full budget: {PPO_AT_1M[task]:.2f}")
        for learner in ("ours", "sb3"):
            lasts = []
            for seed in args.seeds:
                result = results.get((task, learner, seed))
                if result is None:
                    continue
                if "error" in result:
                    print(f"  {learner:4} seed {seed}: failed: {result['error']}")
                    continue
                last = last_decile(result["ends"], args.steps)
                lasts.append(last)
                ros = (f", {result['steps_per_s']:.0f} env steps/s through ROS, observation "
                       f"-> action {result['latency'][0]:.2f} ms p50 / "
                       f"{result['latency'][1]:.2f} ms p99" if learner == "ours" else "")
                print(f"  {learner:4} seed {seed}: {last:9.2f} in {result['wall']:.0f} s{ros}")
            if lasts:
                print(f"  {learner:4} mean over seeds {np.mean(lasts):.2f} "
                      f"(min {min(lasts):.2f}, max {max(lasts):.2f})")
                summary.append(f"{task}_{learner}={np.mean(lasts):.2f}")
        ppo = results.get((task, "ppo", 0))
        if ppo is not None and "error" not in ppo:
            print(f"  ppo  observation -> action {ppo['latency'][0]:.2f} ms p50 / "
                  f"{ppo['latency'][1]:.2f} ms p99 through ROS ({args.ppo_iterations} "
                  f"updates, the general PPO file)")
    print("sac_general " + " ".join(summary))


if __name__ == "__main__":
    main()
