"""The off-policy learner on the spec robots in process, beside Stable-Baselines3's SAC.

    python bench/sac_learning.py                              # the three robots, seeds 0-2
    python bench/sac_learning.py --robots cartpole --seeds 0 --steps 20000
    python bench/sac_learning.py --no-sb3 --results-page

Each (robot, seed, learner) trains in its own child process, one at a time by default (the
figures include wall time and the time of one gradient step, which a neighbour would distort;
``--jobs 2`` runs two at once, each with ``--threads`` BLAS / PyTorch threads, for the long
quadruped budget: the returns do not depend on it, the speed figures are then shared), on
``sims.spec_env`` (the spec's observation, reward, terminations and action mapping on the
same MuJoCo world the robot node steps). Ours reads the shipped off-policy file
``config/robot_train/<robot>_sac.yaml`` (its ``sac`` section and seed; one env); SB3's SAC
gets the same network widths, batch, learning rate, discount, Polyak rate, buffer,
random warm-up, update-to-data ratio (``gradient_steps`` per env step), starting entropy
coefficient and target entropy (``ent_coef="auto_<init>"``, ``target_entropy``), so the two
differ in implementation only. PPO's figures on the same envs are the robot bench's
(``bench/robot_learning.py``, docs/results.md).

Per run: the mean return of the episodes that ended in each tenth of the budget (the last
tenth is the run's figure), the first env step from which every later episode of the
cart-pole lasted its full 1,000 steps, the reacher's final fingertip distance over the
last tenth's episodes, wall seconds, env steps per second and the median seconds of a
gradient step (ours: measured inside the learner; SB3: its whole train() call per step).
Training episodes act on sampled actions; the policy a user deploys acts on the mean. So
after its budget each run's final policy also acts deterministically (ours: the actor's
mean through tanh; SB3: ``predict(deterministic=True)``) for ``EVAL_EPISODES`` episodes on
a fresh env seeded apart from training: their mean return and the reacher's final distance.
The last line is machine-readable:

    sac_learning <robot>_ours_last=<mean over seeds> <robot>_sb3_last=<...> ...
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from results_page import FLAG_HELP, cpu_model, recording  # noqa: E402

BUDGETS = {"cartpole": 20_000, "reacher": 50_000, "quadruped": 200_000}
"""Issue 39's budgets: where the off-policy learner must have learned each robot."""
SOLVED_LENGTH = 1000
EVAL_EPISODES = 20
EVAL_SEED_OFFSET = 10_000
"""The evaluation env's seed is the run's plus this: episodes training never saw."""


def sac_settings(robot: str) -> dict:
    """The ``sac`` section and seed of the shipped off-policy file for ``robot``."""
    import yaml

    path = ROOT / "config" / "robot_train" / f"{robot}_sac.yaml"
    params = next(iter(yaml.safe_load(path.read_text()).values()))["ros__parameters"]
    return dict(params.get("sac") or {})


class EpisodeLog:
    """Episode ends of one run: (env step, return, length, final site distance)."""

    def __init__(self) -> None:
        self.episodes: list[tuple[int, float, int, float]] = []
        self._return, self._length, self.steps = 0.0, 0, 0

    def step(self, reward: float, ended: bool, info: dict) -> None:
        self.steps += 1
        self._return += reward
        self._length += 1
        if ended:
            terms = info.get("term_values") or {}
            distance = next((v for k, v in terms.items() if k.endswith("site_distance")),
                            float("nan"))
            self.episodes.append((self.steps, self._return, self._length, distance))
            self._return, self._length = 0.0, 0


def evaluate(env, policy, seed: int) -> dict:  # noqa: ANN001 - gym.Env, obs -> action
    """``EVAL_EPISODES`` episodes of ``policy`` (deterministic) on ``env``, seeded apart
    from training: the mean return and the mean final site distance (nan without one)."""
    log = EpisodeLog()
    obs, _ = env.reset(seed=seed + EVAL_SEED_OFFSET)
    while len(log.episodes) < EVAL_EPISODES:
        obs, reward, terminated, truncated, info = env.step(policy(obs))
        log.step(float(reward), terminated or truncated, info)
        if terminated or truncated:
            obs, _ = env.reset()
    returns = [ret for _, ret, _, _ in log.episodes]
    distances = [d for _, _, _, d in log.episodes if np.isfinite(d)]
    return {"return": float(np.mean(returns)),
            "distance_mm": 1000 * float(np.mean(distances)) if distances else float("nan")}


def run_ours(robot: str, seed: int, steps: int) -> dict:
    import gymnasium as gym

    import unilab_ros.rl  # noqa: F401 - the BLAS before mlx
    from unilab_ros.rl.agent import AgentConfig
    from unilab_ros.rl.done_codes import from_gym_flags
    from unilab_ros.rl.sac_agent import SACAgent
    from unilab_ros.rl.sac_config import SACConfig

    env = gym.make(f"unilab_ros.sims.spec_env:UnilabRobot-{robot}-v0")
    cfg = SACConfig(**sac_settings(robot))
    space = env.action_space
    agent = SACAgent(AgentConfig(1, env.observation_space.shape[0], space.shape[0], seed=seed),
                     cfg, (space.low, space.high))
    log, step_times = EpisodeLog(), []
    obs, _ = env.reset(seed=seed)
    began = time.perf_counter()
    for _ in range(steps):
        action = agent.act(obs[None])
        next_obs, reward, terminated, truncated, info = env.step(action[0])
        agent.record(obs[None], action, np.array([reward]),
                     from_gym_flags(np.array([terminated]), np.array([truncated])))
        if agent.ready:
            metrics = agent.learn()
            if metrics.get("gradient_steps"):
                step_times.append(metrics["learn_time"] / metrics["gradient_steps"])
        log.step(float(reward), terminated or truncated, info)
        obs = env.reset()[0] if terminated or truncated else next_obs
    wall = time.perf_counter() - began
    return {"episodes": log.episodes, "wall": wall,
            "step_s": statistics.median(step_times) if step_times else float("nan"),
            "eval": evaluate(env, lambda o: agent.act(o[None], deterministic=True)[0], seed)}


def run_sb3(robot: str, seed: int, steps: int) -> dict:
    import gymnasium as gym

    import unilab_ros.sims.spec_env  # noqa: F401 - registers the envs

    return run_sb3_on(gym.make(f"unilab_ros.sims.spec_env:UnilabRobot-{robot}-v0"), seed,
                      steps, sac_settings(robot))


def run_sb3_on(env, seed: int, steps: int, cfg: dict,  # noqa: ANN001 - gym.Env
               evaluation: bool = True) -> dict:
    """Stable-Baselines3's SAC on ``env`` with the settings of our ``sac`` section ``cfg``
    (widths, batch, learning rate, discount, Polyak rate, buffer, random warm-up,
    update-to-data ratio as ``gradient_steps`` per env step, starting entropy coefficient
    and target entropy): its episodes, wall time, the median seconds of a gradient step (its
    whole train() call per step) and, with ``evaluation``, its final policy's deterministic
    episodes (``evaluate``)."""
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback

    log, train_times = EpisodeLog(), []

    class Record(BaseCallback):
        def _on_step(self) -> bool:
            info = self.locals["infos"][0]
            log.step(float(self.locals["rewards"][0]), bool(self.locals["dones"][0]), info)
            return True

    widths = cfg.get("actor_hidden_dims", [256, 256])
    model = SAC(
        "MlpPolicy", env, seed=seed, verbose=0, device="cpu",
        learning_rate=cfg.get("learning_rate", 3e-4), buffer_size=cfg.get("buffer_size", 10**6),
        learning_starts=cfg.get("learning_starts", 5000), batch_size=cfg.get("batch_size", 256),
        tau=cfg.get("tau", 0.005), gamma=cfg.get("gamma", 0.99), train_freq=1,
        gradient_steps=max(1, round(cfg.get("utd_ratio", 1.0))),
        ent_coef=f"auto_{cfg.get('init_entropy_coef', 1.0)}",
        target_entropy=-cfg.get("target_entropy_scale", 1.0) * env.action_space.shape[0],
        policy_kwargs={"net_arch": {"pi": widths,
                                    "qf": cfg.get("critic_hidden_dims", widths)}},
    )
    train = model.train

    def timed_train(*args, **kwargs):
        start = time.perf_counter()
        train(*args, **kwargs)
        train_times.append((time.perf_counter() - start) / max(1, kwargs.get(
            "gradient_steps", args[0] if args else 1)))

    model.train = timed_train
    began = time.perf_counter()
    model.learn(total_timesteps=steps, callback=Record())
    wall = time.perf_counter() - began
    return {"episodes": log.episodes, "wall": wall,
            "step_s": statistics.median(train_times) if train_times else float("nan"),
            "eval": evaluate(env, lambda o: model.predict(o, deterministic=True)[0], seed)
            if evaluation else None}


def summarize(robot: str, steps: int, result: dict) -> dict:
    episodes = result["episodes"]
    tenths = []
    for k in range(10):
        inside = [ret for at, ret, _, _ in episodes
                  if k * steps / 10 < at <= (k + 1) * steps / 10]
        tenths.append(float(np.mean(inside)) if inside else float("nan"))
    short = [at for at, _, length, _ in episodes if length < SOLVED_LENGTH]
    solved_from = (short[-1] if short else 0) if episodes and episodes[-1][2] >= SOLVED_LENGTH \
        else None
    last = [d for at, _, _, d in episodes if at > 0.9 * steps and np.isfinite(d)]
    return {"tenths": tenths, "last": tenths[-1], "solved_from": solved_from,
            "distance_mm": 1000 * float(np.mean(last)) if last else float("nan"),
            "wall": result["wall"], "steps_per_s": steps / result["wall"],
            "step_ms": 1000 * result["step_s"], "eval": result["eval"]}


def child(args: argparse.Namespace) -> None:
    run = run_ours if args.child == "ours" else run_sb3
    print(json.dumps(summarize(args.robot, args.steps, run(args.robot, args.seed, args.steps))))


def threads_env(threads: int | None) -> dict[str, str] | None:
    """The environment of a run whose BLAS (OpenBLAS, for MLX) and PyTorch (OpenMP) use
    ``threads`` threads; None keeps the libraries' own choice (every CPU)."""
    if threads is None:
        return None
    count = str(threads)
    return {**os.environ, "OPENBLAS_NUM_THREADS": count, "OMP_NUM_THREADS": count,
            "MKL_NUM_THREADS": count}


def run_in_child(learner: str, robot: str, seed: int, steps: int,
                 threads: int | None = None) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", learner, "--robot", robot,
                           "--seed", str(seed), "--steps", str(steps)],
                          capture_output=True, text=True, cwd=ROOT, env=threads_env(threads))
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"{learner} {robot} seed {seed}: {tail[0]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--robots", nargs="+", default=list(BUDGETS), choices=list(BUDGETS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, help="env steps per run (default: the budgets)")
    parser.add_argument("--no-sb3", action="store_true", help="ours only")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once")
    parser.add_argument("--threads", type=int,
                        help="BLAS / PyTorch threads per run (default: the libraries' "
                        "own with one job, CPUs / jobs with more)")
    parser.add_argument("--results-page", action="store_true", help=FLAG_HELP)
    parser.add_argument("--child", choices=("ours", "sb3"), help=argparse.SUPPRESS)
    parser.add_argument("--robot", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    # One section per robot set: a run of one robot does not replace another's figures.
    key = "sac_learning" + ("" if args.robots == list(BUDGETS) else ":" + ",".join(args.robots))
    with recording(key, args.results_page):
        _bench(args)


def _bench(args: argparse.Namespace) -> None:
    learners = ["ours"] + ([] if args.no_sb3 else ["sb3"])
    threads = args.threads or (None if args.jobs == 1 else
                                max(1, (os.cpu_count() or 1) // args.jobs))
    runs = "one run" if args.jobs == 1 else f"{args.jobs} runs"
    shared = "" if args.jobs == 1 else " (wall time, steps/s and gradient steps shared)"
    with_threads = f" with {threads} BLAS / PyTorch thread(s)" if threads else ""
    print(f"CPU: {cpu_model()}; {runs} at a time, each in its own process{with_threads}{shared}")
    with ThreadPoolExecutor(args.jobs) as pool:
        jobs = {(robot, learner, seed): pool.submit(
                    run_in_child, learner, robot, seed, args.steps or BUDGETS[robot], threads)
                for robot in args.robots for learner in learners for seed in args.seeds}
        _report(args, learners, jobs)


def _report(args: argparse.Namespace, learners: list[str], jobs: dict) -> None:
    summary: list[str] = []
    for robot in args.robots:
        steps = args.steps or BUDGETS[robot]
        reacher = robot == "reacher"
        print(f"\n{robot}, {steps} env steps; mean return per tenth of the budget")
        for learner in learners:
            lasts, evals = [], []
            for seed in args.seeds:
                try:
                    row = jobs[(robot, learner, seed)].result()
                except RuntimeError as error:
                    print(f"  {learner:4} seed {seed}: failed: {error}")
                    continue
                lasts.append(row["last"])
                evals.append(row["eval"])
                extra = (f" solved from {row['solved_from']}" if robot == "cartpole" else
                         f" final distance {row['distance_mm']:.1f} mm" if reacher else "")
                evaluated = (f"deterministic: return {row['eval']['return']:.2f}"
                             + (f", final distance {row['eval']['distance_mm']:.1f} mm"
                                if reacher else ""))
                print(f"  {learner:4} seed {seed}: "
                      + " ".join(f"{v:7.2f}" for v in row["tenths"])
                      + f" | last {row['last']:.2f}{extra}; {evaluated}; {row['wall']:.0f} s, "
                      f"{row['steps_per_s']:.0f} steps/s, gradient step {row['step_ms']:.1f} ms")
            if lasts:
                eval_return = np.mean([e["return"] for e in evals])
                print(f"  {learner:4} last tenth over seeds: mean {np.mean(lasts):.2f} "
                      f"(min {min(lasts):.2f}, max {max(lasts):.2f}); deterministic return "
                      f"mean {eval_return:.2f}"
                      + (f", final distance mean "
                         f"{np.mean([e['distance_mm'] for e in evals]):.1f} mm"
                         if reacher else ""))
                summary.append(f"{robot}_{learner}_last={np.mean(lasts):.2f}")
                summary.append(f"{robot}_{learner}_eval={eval_return:.2f}")
    print("sac_learning " + " ".join(summary))


if __name__ == "__main__":
    main()
