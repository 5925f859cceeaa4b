"""What the trainer tells its operator: the progress line, the status JSON, the
diagnostics, and the lines about dropped steps and silent robots."""

from __future__ import annotations

import math
import time
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.node import Node
from rclpy.subscription import Subscription

from unilab_ros.loop.decisions import StepDropped
from unilab_ros.loop.training_loop import TrainingLoop
from unilab_ros.rl.algorithm import update_summary
from unilab_ros.ros.qos import incompatible_publishers


class IterationReport:
    """The values logged per iteration (metrics.csv, /diagnostics) and the progress line."""

    def __init__(self, loop: TrainingLoop) -> None:
        self._loop = loop
        self._start = (time.perf_counter(), loop.agent.env_steps)
        self.last: dict[str, float] = {}
        """The latest iteration's values."""

    def values(self, metrics: dict[str, float]) -> dict[str, float]:
        """The iteration's values: progress, the update's metrics and every counter."""
        loop, agent = self._loop, self._loop.agent
        start, steps = self._start
        now = time.perf_counter()
        rate = (agent.env_steps - steps) / max(now - start, 1e-9)
        self._start = (now, agent.env_steps)
        self.last = {
            "env_steps": float(agent.env_steps),
            "mean_return": loop.stats.mean_return,
            "mean_length": loop.stats.mean_length,
            "episodes": float(loop.stats.episodes),
            "steps_per_s": rate,
            **metrics,
            **{k: float(v) for k, v in loop.step_counters.items()},
            **{k: float(v) for k, v in loop.counters.items()},
        }
        return self.last

    def line(self, metrics: dict[str, float]) -> str:
        """The progress line of the iteration ``values`` was last called for."""
        loop, agent, values = self._loop, self._loop.agent, self.last
        rejected = rejected_count(loop)
        # Before any episode ended there is no mean: say so rather than print nan.
        episode = (
            f"return {values['mean_return']:9.2f} | len {values['mean_length']:6.1f}"
            if loop.stats.episodes else "return       n/a | len    n/a"
        )
        return (
            f"iter {agent.iteration:5d} | steps {agent.env_steps:8d} | {episode} | "
            f"{values['steps_per_s']:7.0f} steps/s | update {metrics['update_time']:5.2f}s | "
            f"{update_summary(metrics)} | "
            f"dropped {loop.step_counters['steps_dropped']} rejected {rejected}"
        )


def rejected_count(loop: TrainingLoop) -> int:
    """Every message refused as bad input: the topic contract's (the loop's counters) and a
    spec robot's (its step source's), the same counters ``status`` reports."""
    return sum(value for counters in (loop.counters, loop.step_counters)
               for name, value in counters.items() if name.startswith("rejected"))


def diagnostics(
    values: dict[str, float], iteration: int, node_name: str, problems: int, failing: bool,
    stamp: Any,
) -> DiagnosticArray:
    """The iteration's values as one DiagnosticStatus: WARN with ``problems`` (dropped
    steps, rejected observations), ERROR when ``failing`` (saves or metrics writes)."""
    level = DiagnosticStatus.WARN if problems else DiagnosticStatus.OK
    if failing:
        level = DiagnosticStatus.ERROR
    status = DiagnosticStatus(
        level=level,
        name=f"{node_name}: training",
        message=f"iteration {iteration}",
        hardware_id=node_name,
        values=[KeyValue(key=k, value=f"{v:.6g}") for k, v in values.items()],
    )
    array = DiagnosticArray(status=[status])
    array.header.stamp = stamp
    return array


def status(loop: TrainingLoop, **node: Any) -> dict[str, Any]:
    """The ``~/status`` JSON: the loop's state and counters, and the node's own ``node``
    entries (service and write failures)."""
    agent = loop.agent
    return {
        "state": loop.phase.value,
        "iteration": agent.iteration,
        "env_steps": agent.env_steps,
        "buffer_steps": loop.stored_steps,
        "training": loop.cfg.training,
        "deterministic": loop.cfg.deterministic,
        # JSON has no NaN (strict parsers refuse it): no episode yet reads null.
        "mean_return": json_number(loop.stats.mean_return),
        **node,
        **loop.step_counters,
        **loop.counters,
        **({"stalled_robots": loop.stalled_robots} if loop.fleet else {}),
    }


def dropped_line(loop: TrainingLoop, dropped: StepDropped, service_timeout: float) -> str:
    """What a dropped step (a fleet's stalled robot) means, for the log."""
    step_timeout = loop.cfg.step_timeout
    if not loop.fleet:
        return (
            f"step not completed within step_timeout={step_timeout}s: dropped "
            f"({loop.step_counters['steps_dropped']} so far); the next observation "
            "starts a new segment"
        )
    why = (
        f"its simulator did not answer a pause within service_timeout={service_timeout}s"
        if dropped.pause_unanswered else f"no step within step_timeout={step_timeout}s"
    )
    return (
        f"robot {loop.robots[dropped.robot].name} stalled: {why}, its episodes cut; the "
        f"others go on ({loop.counters['robot_stalls']} stalls so far)"
    )


def json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def waiting_line(node: Node, subscriptions: list[Subscription[Any]], outputs: list[str]) -> str:
    """What the trainer waits on: each resolved topic (so a wrong namespace or remap shows)
    with its publisher count and any publisher whose QoS cannot match, and where the
    actions go."""
    topics = ", ".join(
        f"{sub.topic_name} ({node.count_publishers(sub.topic_name)} publishers"
        + "".join(f"; QoS incompatible, matches nothing: {other}" for other in
                  incompatible_publishers(node, sub.topic_name, sub.qos_profile))
        + ")"
        for sub in subscriptions
    )
    return (f"waiting for the first observation; subscribed to {topics}; actions go to "
            f"{', '.join(outputs)}")
