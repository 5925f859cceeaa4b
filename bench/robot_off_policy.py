"""Learning while acting through the free-running robot at a real robot's pace.

    python bench/robot_off_policy.py                        # cartpole, seeds 0-2, 10 min
    python bench/robot_off_policy.py --seeds 0 --minutes 3 --off-seconds 30
    python bench/robot_off_policy.py --minutes 9 --kill-after 300   # SIGKILL, restart
    python bench/robot_off_policy.py --alternate 0                   # learn without pauses

Per seed, two runs of the MuJoCo robot node at ``--real-time-factor`` (1: a real robot's
pace) beside the trainer with the shipped off-policy file
(``config/robot_train/<robot>_sac.yaml``), each on an isolated graph:

- learning off (``training: false``) for ``--off-seconds``: the control loop acting alone,
  the floor of its period jitter on this machine at this moment;
- learning on, ``learn_while_acting: true``, for ``--minutes`` of wall time: the learner in
  a process of its own at the lowest CPU priority (``--learner thread``: on a thread of the
  trainer), the robot never paused and never held for an update.

At the robot's command topic: the wall time of every command, so the p99 of |interval -
control period| (the robot's resets left out) is what a controller sees of the loop,
learning or not (the trainer's own period jitter is in sim time here, where ticks follow
/clock); from the trainer's ``~/status``: the achieved control rate, and at the end the
steps the loop dropped or took late; from metrics.csv, as each iteration lands: the mean return
and length of the latest episodes (the ``best_min_episodes`` window) against wall time,
the achieved update-to-data ratio and the policy lag. For the cart-pole, "balanced" is the
first wall time at which an episode ended 950 or more env steps after the one before it
(its time limit is 1,000; episode ends are known to the iteration, 50 steps).

``--kill-after S``: S seconds into the learning run the trainer is SIGKILLed (no goodbye,
no save) and started again in the same folder, the robot running on meanwhile: it resumes
from its latest checkpoint with the replay saved beside it, and the line after the curve
compares the mean return at the start, just before the kill and over the first iterations
the restarted trainer adds.

``--alternate S`` (the learner process only): from ``ALTERNATE_FROM_S`` into the learning
run, learning is switched off and on every S seconds (off: ``~/set_training false`` and the
learner process stopped with SIGSTOP; on: SIGCONT, ``~/set_training true``), and the p99
jitter is also reported over the windows of each kind: learning on against off in one run,
under the same load of the machine's neighbours, which moves a run's baseline by
milliseconds on a shared virtual machine (a 40 s acting-alone run measured 2.2 to 10.3 ms on
one morning). The first ``SETTLE_S`` of each window are left out. ``--alternate-off
learner`` stops the learner process only (the trainer records and sends every step, closes
its iterations): what the learner's computing costs the loop, apart from the trainer's own
work for it.

Prints the CPU model; the last line is ``robot_off_policy <robot> balanced_s_max=<x>
jitter_p99_on_ms=<median over seeds> jitter_p99_off_ms=<...>`` (the command intervals').
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

from rclpy.node import Node
from rclpy.subscription import MessageInfo
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import SetBool

from unilab_ros.rl.checkpoint import Checkpoint
from unilab_ros.tools.sim_train import isolated_ros_env, stop

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from results_page import FLAG_HELP, cpu_model, recording  # noqa: E402  (bench: no package)
from robot_learning import _start, listening, start_robot  # noqa: E402

BALANCED_LENGTH = 950.0
COMMAND_TOPIC = "/effort_controller/commands"
"""The cart-pole's command topic (its spec's ``actions.topic``)."""
PERIOD = 0.02
"""The cart-pole spec's control period (50 Hz)."""
WARM_UP_S = 10.0
"""Command intervals of the first seconds (start-up, the first episode's reset) left out."""
ALTERNATE_FROM_S = 40.0
"""When ``--alternate`` starts switching: past the cart-pole's random warm-up (1,000 steps)
and the learner's first, compiling step."""
SETTLE_S = 2.0
"""Seconds at the start of each alternation window left out (the switch itself)."""


def learner_processes(trainer_pid: int) -> list[int]:
    """The trainer's learner process (``learner_process: true``), by its spawn command."""
    pids = []
    for task in Path(f"/proc/{trainer_pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            command = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"spawn_main" in command:
                pids.append(int(child))
    return pids


class _Alternation:
    """Switches learning off and on every ``period`` seconds; ``windows`` holds each
    window's (start, end, learning) in monotonic time."""

    def __init__(self, node: Node, trainer_pid: int, period: float, start: float,
                 recording: bool) -> None:
        self._client = node.create_client(SetBool, "/unilab_trainer/set_training")
        self._recording = recording
        self._trainer_pid = trainer_pid
        self._period = period
        self._start = start
        self.windows: list[list] = []

    def tick(self, now: float) -> None:
        if now < self._start or (self.windows and now - self.windows[-1][0] < self._period):
            return
        learning = not self.windows[-1][2] if self.windows else False
        if self.windows:
            self.windows[-1][1] = now
        self.windows.append([now, now, learning])
        learners = learner_processes(self._trainer_pid)
        if not learners:
            raise RuntimeError("--alternate needs the learner process (--learner process)")
        request = SetBool.Request(data=learning)
        if learning:
            for pid in learners:
                os.kill(pid, signal.SIGCONT)
        if not self._recording:
            self._client.call_async(request)
        if not learning:
            for pid in learners:
                os.kill(pid, signal.SIGSTOP)

    def close(self, now: float) -> None:
        """End the last window; a stopped learner runs again (the trainer is stopped next)."""
        if self.windows:
            self.windows[-1][1] = now
        for pid in learner_processes(self._trainer_pid):
            os.kill(pid, signal.SIGCONT)


class _StatusReader(Node):
    """Keeps every ~/status of the trainer it hears, and the time each command reached this
    process (what a robot's controller sees of the control loop's period) as the middleware
    stamped its reception, in ``time.monotonic``'s terms: this process's own work (reading
    metrics.csv) delays the callback, never the stamp."""

    def __init__(self) -> None:
        super().__init__("robot_off_policy_bench")
        self.samples: list[dict] = []
        self.command_times: list[float] = []
        self._to_monotonic = time.monotonic() - time.time()
        self.create_subscription(String, "/unilab_trainer/status", self._on_status, 10)
        self.create_subscription(Float64MultiArray, COMMAND_TOPIC, self._on_command, 100)

    def _on_status(self, msg: String) -> None:
        self.samples.append(json.loads(msg.data))

    def _on_command(self, _msg: Float64MultiArray, info: MessageInfo) -> None:
        self.command_times.append(info["received_timestamp"] * 1e-9 + self._to_monotonic)


def _robot_status(sample: dict) -> dict:
    robots = sample.get("robots") or {}
    return next(iter(robots.values()), {})


def run(robot: str, seed: int, seconds: float, rtf: float, out: Path, domain: int,
        learning: bool, kill_after: float = 0.0, learner_process: bool = False,
        alternate: float = 0.0, alternate_recording: bool = False,
        learner_cpu: int = -1) -> dict:
    """One run of ``seconds``; the status samples and metrics rows with their wall times.
    ``kill_after`` (> 0): SIGKILL the trainer then, and start it again in the same folder
    (it resumes from its latest checkpoint and replay); the robot runs on meanwhile.
    ``alternate`` (> 0): switch learning off and on every that many seconds (with
    ``alternate_recording``, the learner only)."""
    env = isolated_ros_env(domain)
    out.mkdir(parents=True, exist_ok=True)
    sim = start_robot(robot, rtf, seed, env, out / "robot.log")
    if learner_cpu >= 0:
        # The robot's driver beside the trainer, off the learner's CPU (its threads inherit;
        # the acting-alone run is placed alike).
        os.sched_setaffinity(sim.pid, os.sched_getaffinity(0) - {learner_cpu})
    overrides = {"seed": str(seed), "checkpoint_dir": str(out), "tensorboard": "false",
                 "max_iterations": "0", "learn_while_acting": "true",
                 "training": "true" if learning else "false",
                 "learner_process": "true" if learner_process else "false",
                 "learner_cpu": str(learner_cpu if learner_process else -1)}
    params = ROOT / "config" / "robot_train" / f"{robot}_sac.yaml"
    trainer = _start("unilab_ros.trainer", params, overrides, env, out / "trainer.log")
    began = time.monotonic()
    rows: list[tuple[float, dict]] = []
    restart: dict = {}
    windows: list[list] = []
    try:
        with listening(env, _StatusReader) as (reader, executor):
            switch = (_Alternation(reader, trainer.pid, alternate, began + ALTERNATE_FROM_S,
                                   alternate_recording) if alternate else None)
            windows = switch.windows if switch else []
            read_at = began
            while time.monotonic() - began < seconds and trainer.poll() is None:
                executor.spin_once(timeout_sec=0.5)
                if switch:
                    switch.tick(time.monotonic())
                if time.monotonic() - read_at < 1.0:
                    continue
                read_at = time.monotonic()
                rows = _new_rows(out / "metrics.csv", rows, read_at - began)
                if kill_after and not restart and time.monotonic() - began > kill_after:
                    trainer.kill()
                    trainer.wait()
                    restart = {"wall": time.monotonic() - began,
                               "iteration": int(rows[-1][1]["iteration"]) if rows else 0,
                               "checkpoint": Checkpoint(out / "latest.safetensors").iteration}
                    trainer = _start("unilab_ros.trainer", params, overrides, env,
                                     out / "trainer_restarted.log")
            if switch:
                switch.close(time.monotonic())
    finally:
        stop(trainer)
        stop(sim)
    return {"samples": reader.samples, "rows": rows, "restart": restart,
            "intervals": command_intervals(reader.command_times, began + WARM_UP_S),
            "windows": {kind: [gap for start, end, learning in windows if learning == kind
                               for gap in command_intervals(
                                   [t for t in reader.command_times if t < end],
                                   start + SETTLE_S)]
                        for kind in (True, False)}}


def command_intervals(times: list[float], after: float) -> list[float]:
    """Wall seconds between consecutive commands past ``after``; the robot's reset between
    two episodes (no command while it resets) is no interval of the control loop."""
    kept = [t for t in times if t >= after]
    gaps = [b - a for a, b in zip(kept, kept[1:], strict=False)]
    return [gap for gap in gaps if gap < 0.2]


def interval_jitter_p99(intervals: list[float], period: float) -> float:
    """p99 of |interval - period| in ms."""
    if len(intervals) < 100:
        return float("nan")
    deviations = sorted(abs(gap - period) * 1e3 for gap in intervals)
    return deviations[int(0.99 * (len(deviations) - 1))]


def _new_rows(path: Path, rows: list[tuple[float, dict]], wall: float
              ) -> list[tuple[float, dict]]:
    """``rows`` and the iterations past the last of them. A restarted trainer cuts the rows
    past its checkpoint and learns those iterations again: the first run's rows stand."""
    if not path.is_file():
        return rows
    with path.open() as handle:
        found = list(csv.DictReader(handle))
    last = int(rows[-1][1]["iteration"]) if rows else 0
    return rows + [(wall, row) for row in found if int(row["iteration"]) > last]


def balanced_at(rows: list[tuple[float, dict]]) -> float | None:
    """The wall time of the first episode end at least BALANCED_LENGTH env steps after the
    one before it (one env: a cart-pole held up to its time limit). Episode ends are known
    to the iteration (num_steps env steps); the logged mean length is over the last 100
    episodes and lags far behind."""
    previous_end = None
    for (_, before), (wall, row) in zip(rows, rows[1:], strict=False):
        if float(row["episodes"]) <= float(before["episodes"]):
            continue
        end = float(row["env_steps"])
        if previous_end is not None and end - previous_end >= BALANCED_LENGTH:
            return wall
        previous_end = end
    return None


def summarize(robot: str, seed: int, on: dict, off: dict) -> dict:
    last = _robot_status(on["samples"][-1]) if on["samples"] else {}
    rate = last.get("control_rate") or {}
    balanced = balanced_at(on["rows"])
    learned = [row for _, row in on["rows"] if float(row.get("gradient_steps") or 0) > 0]

    def mean_of(key: str) -> float:
        values = [float(row[key]) for row in learned if row.get(key) not in (None, "")]
        return statistics.mean(values) if values else float("nan")

    return {
        "seed": seed, "balanced_s": balanced,
        "jitter_on": interval_jitter_p99(on["intervals"], PERIOD),
        "jitter_off": interval_jitter_p99(off["intervals"], PERIOD),
        "commands": len(on["intervals"]),
        "rate": rate, "dropped": last.get("steps_dropped"), "late": last.get("late_steps"),
        "shortfalls": last.get("rate_shortfalls"),
        "utd": mean_of("utd_achieved"), "lag": mean_of("policy_lag"),
        "owed": float(learned[-1]["updates_owed"]) if learned else float("nan"),
        "curve": [(round(wall), row.get("env_steps"), row.get("mean_return"),
                   row.get("mean_length")) for wall, row in on["rows"]][::10],
        "restart": restarted(on),
        "alternated": {("on" if kind else "off"): (interval_jitter_p99(gaps, PERIOD), len(gaps))
                       for kind, gaps in on["windows"].items() if gaps},
    }


def restarted(on: dict) -> str:
    """What the kill and restart did to the curve: the mean return at the start, just
    before the kill, and over the first iterations the restarted trainer added."""
    restart = on.get("restart")
    if not restart:
        return ""
    rows = [(wall, row) for wall, row in on["rows"] if row.get("mean_return") not in ("", None)]
    before = [float(row["mean_return"]) for wall, row in rows if wall <= restart["wall"]]
    after = [(wall, float(row["mean_return"])) for wall, row in rows
             if wall > restart["wall"]][:5]
    if not before or not after:
        return f"killed at {restart['wall']:.0f} s; too few iterations around it to compare"
    return (f"SIGKILL at {restart['wall']:.0f} s (iteration {restart['iteration']}, latest "
            f"checkpoint {restart['checkpoint']}); mean return at the start {before[0]:.2f}, "
            f"before the kill {before[-1]:.2f}; the restarted trainer learns again from its "
            f"checkpoint, and its first iterations past the killed one's last (from "
            f"{after[0][0] - restart['wall']:.0f} s after the kill) "
            + " ".join(f"{value:.2f}" for _, value in after))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--robot", default="cartpole")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--off-seconds", type=float, default=60.0)
    parser.add_argument("--real-time-factor", type=float, default=1.0)
    parser.add_argument("--kill-after", type=float, default=0.0,
                        help="SIGKILL the learning trainer after this many seconds and "
                             "start it again in its folder (0: never)")
    parser.add_argument("--learner", choices=("process", "thread"), default="process",
                        help="where the learner runs beside acting (learner_process)")
    parser.add_argument("--alternate", type=float, default=None,
                        help="switch learning off and on every this many seconds of the "
                             "learning run (the learner process only; 0: never; default 20 "
                             "with the process and no --kill-after)")
    parser.add_argument("--alternate-off", choices=("learning", "learner"), default="learning",
                        help="what --alternate switches off: learning (training false, the "
                             "learner stopped) or the learner process only")
    parser.add_argument("--learner-cpu", type=int, default=-1,
                        help="learner_cpu: the learner process on this CPU, the trainer and "
                             "the robot on the others (-1: anywhere)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/robot_off_policy"))
    parser.add_argument("--results-page", action="store_true", help=FLAG_HELP)
    args = parser.parse_args()
    if args.alternate is None:
        args.alternate = 20.0 if args.learner == "process" and not args.kill_after else 0.0
    if args.alternate and (args.learner != "process" or args.kill_after):
        parser.error("--alternate needs --learner process and no --kill-after")
    # The thread's runs and the process's alternating runs keep the sections they were
    # recorded under; a run that learns throughout (the balance time, the restart) has its own.
    suffix = ("_learner_process" + ("_pinned" if args.learner_cpu >= 0 else "")
              + ("" if args.alternate else "_throughout")
              if args.learner == "process" else "")
    with recording(f"robot_off_policy:{args.robot}{suffix}", args.results_page):
        _bench(args)


def _bench(args: argparse.Namespace) -> None:
    print(f"CPU: {cpu_model()}; {args.robot} at real_time_factor {args.real_time_factor}, "
          f"learning while acting (the learner in a {args.learner}"
          + (f", on CPU {args.learner_cpu}, the trainer and robot on the others"
             if args.learner_cpu >= 0 else "")
          + f") for {args.minutes:g} min "
          f"per seed, acting alone for {args.off_seconds:g} s")
    results = []
    for seed in args.seeds:
        base = args.out / f"seed{seed}"
        off = run(args.robot, seed, args.off_seconds, args.real_time_factor, base / "off",
                  60 + seed, learning=False)
        on = run(args.robot, seed, 60 * args.minutes, args.real_time_factor, base / "on",
                 70 + seed, learning=True, kill_after=args.kill_after,
                 learner_process=args.learner == "process", alternate=args.alternate,
                 alternate_recording=args.alternate_off == "learner",
                 learner_cpu=args.learner_cpu)
        row = summarize(args.robot, seed, on, off)
        results.append(row)
        balanced = "not within the run" if row["balanced_s"] is None else \
            f"{row['balanced_s']:.0f} s"
        print(f"seed {seed}: balanced at {balanced}; command interval jitter p99 (wall "
              f"clock, at the robot's topic) {row['jitter_on']:.3f} ms learning, "
              f"{row['jitter_off']:.3f} ms acting alone; "
              f"control rate {row['rate'].get('achieved_hz')} of "
              f"{row['rate'].get('expected_hz')} Hz; steps dropped {row['dropped']}, late "
              f"{row['late']}, rate shortfalls {row['shortfalls']}; achieved utd "
              f"{row['utd']:.2f}, policy lag {row['lag']:.1f} gradient steps, owed at the "
              f"end {row['owed']:.0f}")
        print("  (wall s, env steps, mean return, mean length) every 10th iteration: "
              + " ".join(str(point) for point in row["curve"]))
        if row["restart"]:
            print(f"  {row['restart']}")
        if row["alternated"]:
            on_p99, on_n = row["alternated"].get("on", (float("nan"), 0))
            off_p99, off_n = row["alternated"].get("off", (float("nan"), 0))
            print(f"  alternating every {args.alternate:g} s from {ALTERNATE_FROM_S:g} s: "
                  f"p99 jitter {on_p99:.3f} ms learning ({on_n} intervals), {off_p99:.3f} ms "
                  f"learning off ({off_n} intervals: "
                  + ("learner stopped, trainer recording)" if args.alternate_off == "learner"
                     else "not recording, learner stopped)"))
    times = [r["balanced_s"] for r in results]
    worst = max(times) if times and None not in times else float("nan")
    print(f"robot_off_policy {args.robot} balanced_s_max={worst:.0f} "
          f"jitter_p99_on_ms={statistics.median(r['jitter_on'] for r in results):.3f} "
          f"jitter_p99_off_ms={statistics.median(r['jitter_off'] for r in results):.3f}")


if __name__ == "__main__":
    main()
