"""Soak: the trainer and the Gymnasium bridge run for N minutes; does memory creep?

    python bench/soak.py                 # 10 minutes, config/pendulum.yaml
    python bench/soak.py --minutes 3 --params-file config/inverted_pendulum.yaml

Both nodes run as their own processes on an isolated ROS 2 graph (as sim_train starts
them), training without an iteration limit. Every `--interval` seconds the resident set
size (RSS) of each is read from /proc. After the warm-up (the first `--warmup` share of
the run: MLX's kernel cache, allocator pools and the 100-episode windows fill then) the
growth is the least-squares slope of the summed RSS, in MB per hour. The trainer's
counters come from its metrics.csv. The last line is machine-readable:

    soak minutes=<m> rss_growth_mb_per_h=<x> dropped=<n> rejected=<n>
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from unilab_ros.config.paths import config_file
from unilab_ros.tools.sim_train import isolated_ros_env, node_command, stop
from unilab_ros.trainer.metrics_log import read_metrics

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from results_page import FLAG_HELP, cpu_model, recording  # noqa: E402  (bench: no package)


def rss_mb(pid: int) -> float:
    """Resident set size of a live process in MB (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def growth_mb_per_hour(times_s: list[float], rss: list[float]) -> float:
    """Least-squares slope of ``rss`` against time, in MB per hour."""
    if len(times_s) < 2:
        return float("nan")
    slope_per_s = np.polyfit(np.asarray(times_s), np.asarray(rss), 1)[0]
    return float(slope_per_s * 3600.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--params-file", type=Path, default=None)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--warmup", type=float, default=0.3, help="share of the run left out")
    parser.add_argument("--domain-id", type=int, default=None)
    parser.add_argument("--results-page", action="store_true", help=FLAG_HELP)
    args = parser.parse_args(argv)
    with recording("soak", args.results_page):
        return _bench(args)


def _bench(args: argparse.Namespace) -> int:
    """Run the bridge and the trainer for the soak's minutes, sampling their RSS."""
    params_file = args.params_file or config_file("pendulum.yaml")
    print(f"CPU: {cpu_model()}; {params_file.name}, {args.minutes:g} minutes", flush=True)

    with tempfile.TemporaryDirectory(prefix="unilab_soak_") as folder:
        output = Path(folder)
        env = isolated_ros_env(args.domain_id)
        overrides = {"checkpoint_dir": str(output), "max_iterations": "0",
                     "checkpoint_interval": "0", "tensorboard": "false"}
        with open(output / "bridge.log", "w") as bridge_log, \
                open(output / "trainer.log", "w") as trainer_log:
            bridge = subprocess.Popen(
                node_command("unilab_ros.sims.gym_env_node", params_file, {}), env=env,
                stdout=bridge_log, stderr=subprocess.STDOUT)
            trainer = subprocess.Popen(
                node_command("unilab_ros.trainer", params_file, overrides), env=env,
                stdout=trainer_log, stderr=subprocess.STDOUT)
            samples: list[tuple[float, float, float]] = []
            start = time.monotonic()
            try:
                while time.monotonic() - start < args.minutes * 60.0:
                    if trainer.poll() is not None or bridge.poll() is not None:
                        print("soak: a node exited early; see its log", flush=True)
                        break
                    samples.append((time.monotonic() - start, rss_mb(trainer.pid),
                                    rss_mb(bridge.pid)))
                    time.sleep(args.interval)
            finally:
                stop(trainer, timeout=60.0)
                stop(bridge)
        metrics = (read_metrics(output / "metrics.csv")
                   if (output / "metrics.csv").is_file() else {})

    minutes = samples[-1][0] / 60.0 if samples else 0.0
    kept = [s for s in samples if s[0] >= args.warmup * samples[-1][0]] if samples else []
    times = [s[0] for s in kept]
    growth = growth_mb_per_hour(times, [s[1] + s[2] for s in kept])
    trainer_growth = growth_mb_per_hour(times, [s[1] for s in kept])
    bridge_growth = growth_mb_per_hour(times, [s[2] for s in kept])
    last = {key: values[-1] for key, values in metrics.items()} if metrics else {}
    dropped = int(last.get("steps_dropped", 0))
    rejected = int(sum(value for key, value in last.items() if key.startswith("rejected_")))
    if samples:
        print(f"RSS trainer {samples[0][1]:.0f} -> {samples[-1][1]:.0f} MB "
              f"({trainer_growth:+.2f} MB/h after warm-up), bridge {samples[0][2]:.0f} -> "
              f"{samples[-1][2]:.0f} MB ({bridge_growth:+.2f} MB/h)")
    print(f"trainer: {int(last.get('iteration', 0))} iterations, "
          f"{int(last.get('env_steps', 0))} env steps, mean return "
          f"{last.get('mean_return', float('nan')):.1f}, dropped {dropped}, rejected {rejected}, "
          f"discarded during updates {int(last.get('discarded_during_update', 0))}")
    print(f"soak minutes={minutes:.1f} rss_growth_mb_per_h={growth:.2f} dropped={dropped} "
          f"rejected={rejected}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
