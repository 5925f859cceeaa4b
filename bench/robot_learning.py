"""Learning through standard messages: the MuJoCo robot free-running on sim time, the
trainer reading its robot spec, seeds 0-2, and the deployed policy on a fresh robot.

    python bench/robot_learning.py                         # cartpole, seeds 0 1 2
    python bench/robot_learning.py --robot reacher --iterations 200 --seeds 0
    python bench/robot_learning.py --robot cartpole --seeds 0 --no-in-process --reuse \
        --out /tmp/robot_learning_cartpole         # deploy a finished training again
    python bench/robot_learning.py --learn-while-acting --no-in-process   # PPO beside acting

Each seed starts ``mujoco_robot_node`` (``config/robots/<robot>.yaml`` at
``--real-time-factor``) and ``trainer_node`` (``config/robot_train/<robot>.yaml``) as two
processes on an isolated graph (localhost discovery, a domain id of the run's own) and
waits for the trainer's ``max_iterations``. Its metrics.csv gives the episode return
(and length) against env steps and wall time at the marks, the best and the final mean.
Then the best policy is deployed: ``policy_node`` with the trained bundle on a fresh robot
process at ``--deploy-real-time-factor`` (1, a real robot's pace, by default: a faster
factor multiplies the wall latency measured in control periods), which reports the return
of every episode it runs (``~/status``), so the deployed mean return over
``--deploy-episodes`` compares with the training's best, and
with the same policy replayed in process on the same episodes (the robot seeded as the
deploy robot): that second gap is the deploy path's own, without the training's exploring
actions or its other episodes in the way.

In process (``--in-process``, the default): the same trainer file on the same seed, its
robot the in-process ``sims.spec_env`` (the spec's RobotSteps on the same MujocoWorld, each
step waiting for the policy: no latency, no stale data), for the same iterations: what the
settings learn without ROS, beside what they learn through it. Its best policy is then
replayed in process on the deploy robot's episodes (``--deploy-episodes``), with the
distance left at each episode's end for a spec with a ``site_distance`` term (the reacher).

Prints the CPU model; the last line is ``robot_learning <robot> final_min=<x> ...``
(through ROS; ``inproc_final_min`` in process).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import rclpy
import yaml
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from std_msgs.msg import String

from unilab_ros.tools.sim_train import die_with_parent, isolated_ros_env, node_command, stop

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from results_page import FLAG_HELP, cpu_model, recording  # noqa: E402  (bench: no package)

DEPLOY_ROBOT_SEED = 12345
"""The deploy robot's seed (its episodes' initial states and targets), apart from
training's."""
MARKS = (25_000, 50_000, 100_000, 150_000, 200_000, 400_000, 1_000_000)


def _start(module: str, params: Path, overrides: dict[str, str], env: dict[str, str],
           log: Path) -> subprocess.Popen:
    return subprocess.Popen(node_command(module, params, overrides), env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT,
                            preexec_fn=die_with_parent())


def start_robot(robot: str, rtf: float, seed: int, env: dict[str, str],
                log: Path) -> subprocess.Popen:
    """The shipped MuJoCo robot node ``robot``, free-running at ``rtf``."""
    return _start("unilab_ros.sims.mujoco_robot_node", ROOT / "config" / "robots" /
                  f"{robot}.yaml", {"real_time_factor": str(rtf), "seed": str(seed)}, env, log)


BESIDE_ACTING = {"learn_while_acting": "true", "update_trigger": "rollout_full",
                 "pause_service": "''", "resume_service": "''"}
"""The trainer's overrides of ``--learn-while-acting``: the update beside acting, no pause
service (the robot never stops), no wait for an episode's end."""


def train(robot: str, seed: int, iterations: int, rtf: float, out: Path,
          domain: int, overrides: dict[str, str] | None = None) -> dict:
    """One training run (``overrides``: the trainer's, beside the bench's own); its metrics
    rows and wall time."""
    env = isolated_ros_env(domain)
    out.mkdir(parents=True, exist_ok=True)
    sim = start_robot(robot, rtf, seed, env, out / "robot.log")
    began = time.monotonic()
    trainer = _start("unilab_ros.trainer", ROOT / "config" / "robot_train" / f"{robot}.yaml",
                     {"seed": str(seed), "max_iterations": str(iterations),
                      "checkpoint_dir": str(out), "tensorboard": "false",
                      **(overrides or {})}, env, out / "trainer.log")
    try:
        trainer.wait()
    finally:
        stop(trainer)
        stop(sim)
    wall = time.monotonic() - began
    (out / "wall_s.txt").write_text(f"{wall:.1f}\n")
    with (out / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    if trainer.returncode != 0 or not rows:
        tail = (out / "trainer.log").read_text()[-2000:]
        raise RuntimeError(f"{robot} seed {seed}: trainer rc {trainer.returncode}\n{tail}")
    return {"rows": rows, "wall": wall}


def train_in_process(robot: str, seed: int, iterations: int, out: Path) -> dict:
    """The same training in process (``sims.spec_env``): rows as metrics.csv's, and the
    best policy (the last one if no best was kept) exported to ``out``."""
    from unilab_ros.rl.best import BestPolicy
    from unilab_ros.rl.checkpoint import export_policy
    from unilab_ros.sims.spec_env import spec_training_setup
    from unilab_ros.tools import demo

    setup = spec_training_setup(ROOT / "config" / "robot_train" / f"{robot}.yaml", robot,
                                seed)
    rows: list[dict] = []

    def record(agent, stats, _metrics) -> None:
        rows.append({"env_steps": agent.iteration * setup.agent.num_steps,
                     "mean_return": stats.mean_return if stats.episodes else "",
                     "mean_length": stats.mean_length if stats.episodes else "",
                     "steps_dropped": 0, "stale_cuts": 0})

    began = time.monotonic()
    best = BestPolicy()
    agent, _ = demo.train(setup, iterations, record, best)
    wall = time.monotonic() - began
    if best.parameters is not None:
        agent.model.update(best.parameters)
    out.mkdir(parents=True, exist_ok=True)
    policy = export_policy(out / f"in_process_seed{seed}.safetensors", agent, setup.actions)
    return {"rows": rows, "wall": wall, "policy": policy}


def _summary(rows: list[dict]) -> tuple[str, float, float]:
    """The marks, best and final mean return of a run's rows."""
    marks = "  ".join(f"{m // 1000}k {_at(rows, m, 'mean_return'):.2f}" for m in MARKS
                      if m <= _steps(rows[-1]))
    returns = [float(r["mean_return"]) for r in rows if r["mean_return"] != ""]
    return marks, max(returns), returns[-1]


def finished(run: Path, iterations: int) -> dict | None:
    """A training already in ``run`` with all its iterations (wall time from its file, else
    from the trainer log's first and last stamps), or None."""
    if not (run / "metrics.csv").is_file():
        return None
    with (run / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    if len(rows) < iterations:
        return None
    if (run / "wall_s.txt").is_file():
        wall = float((run / "wall_s.txt").read_text())
    else:
        stamps = [float(line.split("] [", 2)[1].strip("[]")) for line in
                  (run / "trainer.log").read_text().splitlines() if line.startswith("[")]
        wall = stamps[-1] - stamps[0]
    return {"rows": rows, "wall": wall}


@contextlib.contextmanager
def listening(env: dict[str, str], make: Callable[[], Node]
              ) -> Iterator[tuple[Node, SingleThreadedExecutor]]:
    """rclpy in this process on ``env``'s graph and the node ``make`` builds, in an
    executor; rclpy is shut down and the process's environment restored on the way out."""
    saved = {k: os.environ.get(k) for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE")}
    os.environ.update({k: env[k] for k in saved})
    rclpy.init()
    node = make()
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    try:
        yield node, executor
    finally:
        node.destroy_node()
        rclpy.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class _Operator(Node):
    """Reads the policy node's ~/status."""

    def __init__(self) -> None:
        super().__init__("robot_learning_bench")
        self.status: dict = {}
        self.create_subscription(String, "/unilab_policy/status", self._on_status, 10)

    def _on_status(self, msg: String) -> None:
        self.status = json.loads(msg.data)


# Integers in the deploy node's status that are a state, not a count of events.
NOT_COUNTERS = frozenset({"episode_step"})


def deploy(robot: str, policy: Path, episodes: int, rtf: float, out: Path, domain: int,
           timeout: float) -> dict[str, list]:
    """The deployed policy's episode returns on a fresh robot process (the robot reset
    after each episode, as in training), and each episode's last reward-term values."""
    env = isolated_ros_env(domain)
    sim = start_robot(robot, rtf, DEPLOY_ROBOT_SEED, env, out / "deploy_robot.log")
    params = out / "deploy.yaml"
    params.write_text(yaml.safe_dump({"/**/unilab_policy": {"ros__parameters": {
        "checkpoint": str(policy), "use_sim_time": True, "reset_between_episodes": True,
        "start_state": "active"}}}))
    node = _start("unilab_ros.deploy.policy_node", params, {}, env, out / "deploy_policy.log")
    deadline = time.monotonic() + timeout
    status: dict = {}
    try:
        with listening(env, _Operator) as (operator, executor):
            while time.monotonic() < deadline:
                executor.spin_once(timeout_sec=0.5)
                status = operator.status.get("robot", {})
                if len(status.get("episode_returns", [])) >= episodes:
                    break
            if operator.status.get("state") != "active":
                raise RuntimeError(
                    f"policy_node did not activate: see {out / 'deploy_policy.log'}")
    finally:
        stop(node)
        stop(sim)
    # Kept beside the run: a deployed return off its replay is read against these counts.
    (out / "deploy_status.json").write_text(json.dumps(status, indent=1))
    return {"returns": status.get("episode_returns", [])[:episodes],
            "final_terms": status.get("episode_final_terms", [])[:episodes],
            "counters": {key: value for key, value in status.items()
                         if isinstance(value, int) and not isinstance(value, bool)
                         and key not in NOT_COUNTERS}}


def replay_in_process(robot: str, policy: Path, episodes: int
                      ) -> tuple[list[float], list[dict[str, float]]]:
    """The deterministic policy's returns in process (``sims.spec_env``) on the deployment's
    episodes, and each episode's last reward-term values: the world seeded as the deploy
    robot and reset before each episode, as ``policy_node`` resets it
    (``reset_between_episodes``)."""
    from unilab_ros.rl.actions import ActionMapper
    from unilab_ros.rl.bundle import read_policy
    from unilab_ros.rl.policy import PolicySampler
    from unilab_ros.sims.spec_env import RobotSpecEnv

    bundle = read_policy(policy)
    model = bundle.model()
    sampler = PolicySampler(model, bundle.seed)
    mapper = ActionMapper(bundle.actions, 1, model.action_dim)
    env = RobotSpecEnv(robot=robot)
    env.reset(seed=DEPLOY_ROBOT_SEED)
    returns, final_terms = [], []
    for _ in range(episodes):
        obs, _ = env.reset()
        total, ended = 0.0, False
        while not ended:
            obs, reward, terminated, truncated, info = env.step(
                mapper(sampler(obs[None], True))[0])
            total += reward
            ended = terminated or truncated
        returns.append(total)
        final_terms.append(info["term_values"])
    return returns, final_terms


def site_distances(final_terms: list[dict[str, float]]) -> list[float]:
    """The distance left at each episode's end (m), of a spec with a site_distance term."""
    return [value for terms in final_terms for key, value in terms.items()
            if key.endswith("site_distance")]


def print_distances(what: str, distances: list[float]) -> None:
    if distances:
        print(f"{what} final site distance {1000 * min(distances):.1f} .. "
              f"{1000 * max(distances):.1f} mm (mean "
              f"{1000 * sum(distances) / len(distances):.1f} mm)")


def _beside_acting(rows: list[dict]) -> str:
    """What the update beside acting cost, where it ran: the mean policy lag (share of a
    rollout acted on by the policy before the update) and the steps not stored."""
    if "policy_lag" not in rows[-1]:
        return ""
    lag = sum(float(r["policy_lag"]) for r in rows) / len(rows)
    return (f" | policy lag {lag:.3f} (max {max(float(r['policy_lag']) for r in rows):.3f})"
            f" | steps behind the update {rows[-1]['steps_behind_update']}")


def _at(rows: list[dict], mark: int, key: str) -> float:
    below = [float(r[key]) for r in rows if _steps(r) <= mark and r[key] != ""]
    return below[-1] if below and _steps(rows[-1]) >= mark else math.nan


def _steps(row: dict) -> int:
    return int(float(row["env_steps"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--robot", default="cartpole")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=0,
                        help="PPO iterations (0: the robot_train file's max_iterations)")
    parser.add_argument("--real-time-factor", type=float, default=4.0)
    parser.add_argument("--deploy-episodes", type=int, default=5)
    parser.add_argument("--deploy-real-time-factor", type=float, default=1.0,
                        help="the deploy robot's pace (1: a real robot's)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--reuse", action="store_true",
                        help="take a seed's finished training from --out instead of training")
    parser.add_argument("--in-process", action=argparse.BooleanOptionalAction, default=True,
                        help="also train each seed in process (sims.spec_env)")
    parser.add_argument("--ros", action=argparse.BooleanOptionalAction, default=True,
                        help="train (and deploy) through ROS")
    parser.add_argument("--learn-while-acting", action="store_true",
                        help="through ROS, PPO's update beside acting with no pause service")
    parser.add_argument("--results-page", action="store_true", help=FLAG_HELP)
    args = parser.parse_args()
    # One section per robot and mode: a reacher run must not replace the cart-pole's.
    mode = "_beside_acting" if args.learn_while_acting else ""
    with recording(f"robot_learning:{args.robot}{mode}", args.results_page):
        _bench(args)


def _bench(args: argparse.Namespace) -> None:
    """Train (and deploy) each seed the ways asked for, printing a line per step."""
    out = args.out or Path(tempfile.mkdtemp(prefix=f"robot_learning_{args.robot}_"))
    print(f"cpu: {cpu_model()}; robot {args.robot}, real_time_factor "
          f"{args.real_time_factor} (deploy {args.deploy_real_time_factor}), output {out}")
    finals, deployed, inproc_finals, inproc_distances = [], [], [], []
    iterations = args.iterations or _file_iterations(args.robot)
    for seed in args.seeds:
        if args.in_process:
            result = train_in_process(args.robot, seed, iterations, out)
            marks, best, final = _summary(result["rows"])
            inproc_finals.append(final)
            print(f"seed {seed} in process: {_steps(result['rows'][-1])} env steps in "
                  f"{result['wall']:.0f} s | mean return at {marks} | best {best:.2f} final "
                  f"{final:.2f} | final length {float(result['rows'][-1]['mean_length']):.0f}")
            replay, terms = replay_in_process(args.robot, result["policy"],
                                              args.deploy_episodes)
            print(f"seed {seed} in process: its best policy, deterministic, on the deploy "
                  f"robot's {len(replay)} episodes: mean return {sum(replay) / len(replay):.2f}")
            distances = site_distances(terms)
            print_distances(f"seed {seed} in process:", distances)
            inproc_distances += distances
        if not args.ros:
            continue
        run = out / f"seed{seed}"
        result = (finished(run, iterations) if args.reuse else None) or train(
            args.robot, seed, iterations, args.real_time_factor, run, 60 + seed,
            BESIDE_ACTING if args.learn_while_acting else None)
        rows = result["rows"]
        marks, best, final = _summary(rows)
        finals.append(final)
        print(f"seed {seed}: {_steps(rows[-1])} env steps in {result['wall']:.0f} s "
              f"({_steps(rows[-1]) / result['wall']:.0f} steps/s) | mean return "
              f"at {marks} | best {best:.2f} final {final:.2f} | final length "
              f"{float(rows[-1]['mean_length']):.0f} | dropped "
              f"{rows[-1]['steps_dropped']} stale {rows[-1]['stale_cuts']}"
              + _beside_acting(rows))
        # The best policy needs 100 finished episodes; a shorter run deploys its last one.
        policy = run / "best.safetensors"
        policy = policy if policy.is_file() else run / "latest.safetensors"
        deployed_run = deploy(args.robot, policy, args.deploy_episodes,
                              args.deploy_real_time_factor, run, 80 + seed, timeout=900.0)
        episodes = deployed_run["returns"]
        mean = sum(episodes) / len(episodes) if episodes else math.nan
        print_distances(f"seed {seed}: deployed", site_distances(deployed_run["final_terms"]))
        replay, _ = replay_in_process(args.robot, policy, len(episodes))
        replayed = sum(replay) / len(replay) if replay else math.nan
        deployed.append((mean, best, replayed))
        print(f"seed {seed}: deployed {policy.name} on a fresh robot: {len(episodes)} "
              f"episodes, mean return {mean:.2f} (training best {best:.2f}, "
              f"{100 * (mean - best) / abs(best):+.1f}%; the same episodes in process "
              f"{replayed:.2f}, {100 * (mean - replayed) / abs(replayed):+.1f}%)")
        print(f"seed {seed}: deploy counters " + " ".join(
            f"{key} {value}" for key, value in sorted(deployed_run["counters"].items())))
    worst = max(abs(m - b) / abs(b) for m, b, _ in deployed) if deployed else math.nan
    worst_replay = (max(abs(m - r) / abs(r) for m, _, r in deployed) if deployed
                    else math.nan)
    figures = {"final_min": min(finals, default=math.nan),
               "final_mean": sum(finals) / len(finals) if finals else math.nan,
               "deploy_gap_max": worst,
               "deploy_replay_gap_max": worst_replay,
               "inproc_final_min": min(inproc_finals, default=math.nan),
               "inproc_final_mean": (sum(inproc_finals) / len(inproc_finals)
                                     if inproc_finals else math.nan),
               "inproc_distance_mean_mm": (1000 * sum(inproc_distances) / len(inproc_distances)
                                           if inproc_distances else math.nan)}
    print(f"robot_learning {args.robot} "
          + " ".join(f"{key}={value:.3f}" for key, value in figures.items()))


def _file_iterations(robot: str) -> int:
    data = yaml.safe_load((ROOT / "config" / "robot_train" / f"{robot}.yaml").read_text())
    return int(next(iter(data.values()))["ros__parameters"]["max_iterations"])


if __name__ == "__main__":
    main()
