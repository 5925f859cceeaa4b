"""Drive a training loop in process against a Gymnasium sim at a robot's pace."""

from __future__ import annotations

import time
from collections.abc import Callable

from unilab_ros.loop.decisions import BeginUpdate, IterationDone, PublishAction
from unilab_ros.loop.training_loop import TrainingLoop
from unilab_ros.sims.gym_vector import GymVectorSim


def run_paced(loop: TrainingLoop, sim: GymVectorSim, seconds: float, pace: float,
              gate: Callable[[], bool] | None = None,
              orders: list[list[str]] | None = None) -> tuple[list[dict], int]:
    """Step ``sim`` as ``loop`` decides, sleeping ``pace`` seconds before each step (the
    time a learner beside acting gets between two), and longer while ``gate`` says no,
    until the loop stops acting or ``seconds`` pass; the metrics of each IterationDone,
    and the BeginUpdates seen. ``orders`` gets each decision list's type names."""
    reports, paused, stamp = [], 0, 0
    decisions = loop.on_observation(0, sim.reset(), stamp, 0.0, 0.0)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if orders is not None:
            orders.append([type(d).__name__ for d in decisions])
        paused += sum(isinstance(d, BeginUpdate) for d in decisions)
        reports += [d.metrics for d in decisions if isinstance(d, IterationDone)]
        actions = [d for d in decisions if isinstance(d, PublishAction)]
        if not actions:
            break
        time.sleep(pace)
        while gate is not None and not gate() and time.monotonic() < deadline:
            time.sleep(pace)
        step = sim.step(actions[0].command)
        stamp += 1
        loop.on_reward(0, step.reward, stamp, 0.0)
        loop.on_done(0, step.done, stamp, 0.0)
        decisions = loop.on_observation(0, step.observation, stamp, 0.0, 0.0)
    return reports, paused
