"""Learning while acting: the off-policy learner's gradient steps on a thread of their own.

The control loop acts with a numpy copy of the actor and records steps into replay with
numpy only, so it never waits for the learner: the learner thread runs the owed gradient
steps (the update-to-data ratio asks ``sac.utd_ratio`` per env step) one at a time and
swaps a fresh actor copy in after each call. Every MLX computation on the model happens
under the agent's ``model_lock`` (the learner holds it while it steps; a checkpoint or
bundle of the control thread takes it between two calls), since MLX evaluation from two
threads at once is not safe (ml-explore/mlx#2067). A thread, not a process: the replay,
the actor copy and the counters are shared without copies, and the learner releases the
GIL inside MLX's kernels.

What it reports per iteration (``take``): the mean losses of its steps, the gradient steps
run, the achieved update-to-data ratio (gradient steps per env step collected since the
last report), the policy lag (gradient steps the learner is ahead of the acting actor,
at most ``steps_per_call``), and the steps still owed (a backlog: the learner cannot keep
up with the robot at this ratio).
"""

from __future__ import annotations

import logging
import sys
import threading

import mlx.core as mx
import numpy as np

from unilab_ros.rl.sac_agent import METRICS, SACAgent

_LOG = logging.getLogger(__name__)

STEPS_PER_CALL = 1
"""Gradient steps between two actor swaps: the most the acting policy lags the learner, and
the longest the control thread can wait for the model lock (a checkpoint, a bundle)."""
SWITCH_INTERVAL_S = 0.0005
"""Python's thread switch interval while the learner runs: the control thread waits at most
this long for the GIL the learner's Python code holds (the default, 5 ms, showed as 6 ms of
command-interval jitter at 50 Hz)."""
IDLE_WAIT_S = 0.002
"""How long the thread sleeps when no step is owed."""


class BackgroundLearner:
    """Runs ``agent``'s owed gradient steps beside the control loop; see the module doc."""

    def __init__(self, agent: SACAgent, steps_per_call: int = STEPS_PER_CALL) -> None:
        self.agent = agent
        self.steps_per_call = steps_per_call
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._totals = np.zeros(len(METRICS))
        self._steps = 0
        self._time = 0.0
        self._env_steps_at_take = agent.env_steps
        self.error: BaseException | None = None
        """What stopped the thread, when something did (reported by ``take``)."""
        self._switch_interval: float | None = None
        """Python's switch interval before ``start``, put back by ``stop``."""
        self._thread = threading.Thread(target=self._run, name="sac-learner", daemon=True)

    def start(self) -> BackgroundLearner:
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval, SWITCH_INTERVAL_S))
        # Nothing lazy may be left of the main thread's stream for this thread to evaluate.
        with self.agent.model_lock:
            mx.eval(self.agent.learner.arrays())
        self.agent.background = self
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the current call; the agent learns in phases again."""
        self._stop.set()
        self._thread.join(timeout)
        self.agent.background = None
        if self._switch_interval is not None:
            sys.setswitchinterval(self._switch_interval)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            # MLX streams are per thread (0.31.2 on): this thread computes on its own.
            with mx.stream(mx.new_stream(mx.default_device())):
                self._learn_until_stopped()
        except Exception as error:  # noqa: BLE001 - reported, never a silent dead learner
            _LOG.error("the learner thread stopped: %s: %s", type(error).__name__, error)
            self.error = error

    def _learn_until_stopped(self) -> None:
        while not self._stop.is_set():
            if not self.agent.ready:
                self._stop.wait(IDLE_WAIT_S)
                continue
            metrics = self.agent.learn(self.steps_per_call)
            steps = int(metrics.get("gradient_steps", 0))
            with self._lock:
                if steps:
                    self._totals += steps * np.array([metrics[name] for name in METRICS])
                self._steps += steps
                self._time += metrics.get("learn_time", 0.0)

    def take(self) -> dict[str, float]:
        """The metrics since the last call (what one iteration's report shows)."""
        agent = self.agent
        with self._lock:
            totals, steps, seconds = self._totals, self._steps, self._time
            self._totals, self._steps, self._time = np.zeros(len(METRICS)), 0, 0.0
        env_steps = agent.env_steps - self._env_steps_at_take
        self._env_steps_at_take = agent.env_steps
        if self.error is not None:
            raise RuntimeError(f"the learner thread stopped: {self.error}") from self.error
        metrics = {name: float(v) for name, v in zip(METRICS, totals / max(steps, 1),
                                                     strict=True)}
        metrics.update(
            gradient_steps=float(steps), learn_time=seconds,
            utd_achieved=steps / env_steps if env_steps else 0.0,
            policy_lag=float(agent.learner.steps - agent.actor_steps),
            updates_owed=float(agent.updates_owed),
        )
        return metrics
