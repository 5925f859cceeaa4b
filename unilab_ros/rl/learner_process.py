"""Learning while acting with the off-policy learner in a process of its own.

On a robot's computer the learner's gradient steps share the CPUs with the control loop,
the robot's driver (or simulator) and ROS; on a thread of the trainer they also share its
GIL, which the learner's Python between two MLX calls holds while the control thread waits
(``background_learner``). A process takes the GIL out and lets the operating system put
acting first: the learner runs at the lowest CPU priority (nice ``NICE``, and Linux's
SCHED_IDLE class) with one BLAS thread, so a control tick that wakes up preempts it.

The process holds a replica of the replay: every step the trainer records and every cut
is sent to it as it happens and recorded there by the same code, so both hold the same
rows and the same counters (env steps, gradient steps owed). It runs the owed gradient
steps and, whenever the trainer took the actor it sent last (and at most every
``ACTOR_PERIOD_S``), sends a numpy copy of the newest one with the metrics of the steps
since (one message in flight: acting never falls behind a queue of stale actors). The
trainer's process never computes for it, and its control thread never reads the pipe: a
receiver thread reads and unpickles (a 270 KB actor took ~0.4 ms, which acting on every
step would have waited for), and acting takes what arrived. With ``cpu`` it runs on one
CPU and the trainer on the others (``cpu_placement``).

Training checkpoints (interval, latest, best) are written by the process itself (``save``:
its learner state and replay, the trainer's counters), so the control loop never waits for
a gradient step or a disk (a best-policy save took 12-28 ms on the control thread here).
A bundle or another use of the model on the trainer's side needs the learner's state:
``sync`` asks for it and waits (one gradient step, then a few MB of networks and Adam
states), and the agent takes it; ``stop`` syncs first, after the queued writes. A trainer
that dies (SIGKILL included) closes its pipes: the learner reads end-of-file and exits. A
learner that fails says why (``error``); one that dies silently is noticed (``take``).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_map_with_path

from unilab_ros.rl.actions import ActionConfig
from unilab_ros.rl.agent import AgentConfig
from unilab_ros.rl.background_learner import STEPS_PER_CALL
from unilab_ros.rl.blas import set_blas_threads
from unilab_ros.rl.cpu_placement import lower_priority, pin_threads
from unilab_ros.rl.sac_agent import METRICS, SACAgent
from unilab_ros.rl.sac_checkpoint import save_sac_checkpoint
from unilab_ros.rl.sac_config import SACConfig

_LOG = logging.getLogger(__name__)

NICE = 19
"""The learner's CPU priority: the lowest, so acting, the robot's driver and ROS run first
whenever they are ready; the learner takes what they leave."""
IDLE_WAIT_S = 0.1
"""How long the learner waits for a message when no gradient step is owed (a message ends
the wait at once: this only spares an idle learner from waking the CPU 500 times a
second)."""
ACTOR_PERIOD_S = 0.1
"""The shortest time between two actors sent: each is ~270 KB for [256, 256] layers to
write, read and unpickle, work a control loop at 50 Hz would otherwise meet at every tick
(the policy lag grew from ~2 to ~6 gradient steps at 50 Hz; Sample Factory finds 20-30
harmless)."""
SaveFailed = Callable[[Path, str], None]
_ENDED = ("ended",)
"""What the receiver thread queues last: the learner's end of the pipe closed."""
SYNC_TIMEOUT_S = 60.0
"""The longest ``sync`` waits for the learner's state (a learner starved of CPU by other
work answers late; a checkpoint that waited this long fails and is counted)."""


@dataclass
class _Setup:
    """What the learner process starts from: the agent's sizes and learner state, and its
    replay as it stands (pickled whole: the process continues it)."""

    cfg: AgentConfig
    sac_cfg: SACConfig
    bounds: tuple[np.ndarray, np.ndarray]
    model: dict[str, np.ndarray]
    optimizers: list[dict[str, np.ndarray]]
    counters: dict[str, float]
    batch_rng: dict
    replay: Any
    env_steps: int
    nice: int
    cpu: int


def _shaped_like(flat: dict[str, np.ndarray], tree: Any) -> Any:
    """``flat``'s arrays (by ``tree_flatten``'s names) in ``tree``'s structure, whose empty
    branches (a critic without layer norms) a flat dict cannot carry."""
    return tree_map_with_path(lambda name, _: mx.array(flat[name]), tree)


def _load(agent: SACAgent, model: dict[str, np.ndarray],
          optimizers: list[dict[str, np.ndarray]], counters: dict[str, float]) -> None:
    agent.load_learner_state(
        _shaped_like(model, agent.model.parameters()),
        [_shaped_like(flat, o.state) for flat, o in zip(optimizers, agent.learner.optimizers,
                                                         strict=True)],
        counters)


class LearnerProcess:
    """Runs ``agent``'s gradient steps in a child process; see the module doc. It offers
    what ``BackgroundLearner`` does (``start``, ``stop``, ``take``, ``running``, ``error``)
    and what the agent calls while it is its ``remote`` (``send_step``, ``send_cut``,
    ``receive``, ``sync``)."""

    def __init__(self, agent: SACAgent, nice: int = NICE, cpu: int = -1) -> None:
        self.agent = agent
        self.nice = nice
        self.cpu = cpu
        """The CPU the process runs on, the trainer's process on the others (-1: none)."""
        self._trainer_cpus: set[int] = set()
        """The trainer's CPUs before it left ``cpu`` to the learner (restored at stop)."""
        self.error: BaseException | None = None
        self._context = mp.get_context("spawn")
        self._process: Any = None
        self._inbox: Connection | None = None
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._sender: threading.Thread | None = None
        self._received: queue.SimpleQueue = queue.SimpleQueue()
        """What the receiver thread read from the learner, ``_ENDED`` last."""
        self._receiver: threading.Thread | None = None
        self._want = self._context.RawValue("i", 1)
        """1 when the trainer took the last actor sent (the learner may send the next)."""
        self._state_reply: tuple | None = None
        self._totals = np.zeros(len(METRICS))
        self._steps = 0
        self._time = 0.0
        self._max_lag = 0.0
        self._owed = 0.0
        self._env_steps_at_take = agent.env_steps
        self._stopping = False
        self._saves: dict[str, SaveFailed | None] = {}
        """Who is told when the write of a path the process was asked to save fails."""

    def start(self) -> LearnerProcess:
        agent = self.agent
        with agent.model_lock:
            model, optimizers, counters = agent.learner_state()
        setup = _Setup(agent.cfg, agent.sac_cfg,
                       (agent.low, agent.low + 2 * agent.half_range), model, optimizers,
                       counters, agent.batch_rng_state(), agent.replay, agent.env_steps,
                       self.nice, self.cpu)
        to_learner_read, to_learner = self._context.Pipe(duplex=False)
        self._inbox, from_learner = self._context.Pipe(duplex=False)
        self._process = self._context.Process(
            target=_serve, args=(setup, to_learner_read, from_learner, self._want),
            name="sac-learner", daemon=True)
        self._process.start()
        # The child holds its ends; closed here, a dead child reads as end-of-file.
        to_learner_read.close()
        from_learner.close()
        self._sender = threading.Thread(target=self._send_all, args=(to_learner,),
                                        name="sac-learner-sender", daemon=True)
        self._sender.start()
        self._receiver = threading.Thread(target=self._receive_all, args=(self._inbox,),
                                          name="sac-learner-receiver", daemon=True)
        self._receiver.start()
        if self.cpu >= 0:
            self._trainer_cpus = os.sched_getaffinity(0)
            pin_threads(self._trainer_cpus - {self.cpu})
        self._owed = agent.updates_owed
        agent.background = self
        agent.remote = self
        return self

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def _send_all(self, connection: Connection) -> None:
        """The sender thread: a write to a full pipe blocks here, never the control loop."""
        try:
            while (message := self._outbox.get()) is not None:
                connection.send(message)
        except (OSError, ValueError) as error:
            self._fail(f"the learner process stopped reading ({error})")
        finally:
            connection.close()

    def _receive_all(self, connection: Connection) -> None:
        """The receiver thread: reading blocks here, and unpickling is done here."""
        try:
            while True:
                self._received.put(connection.recv())
        except (EOFError, OSError):
            self._received.put(_ENDED)

    def _fail(self, why: str) -> None:
        if self.error is None:
            _LOG.error("%s", why)
            self.error = RuntimeError(why)

    def send_step(self, obs: np.ndarray, actions: np.ndarray, rewards: Any,
                  dones: Any, envs: np.ndarray | None, next_obs: np.ndarray | None) -> None:
        """One recorded step (``SACAgent.record``'s arguments, copied: the caller may
        reuse its arrays before the sender thread writes them)."""
        self._outbox.put(("step", *(None if a is None else np.array(a) for a in (
            obs, actions, rewards, dones, envs, next_obs))))

    def send_cut(self, envs: np.ndarray) -> None:
        self._outbox.put(("cut", np.array(envs)))

    def receive(self) -> None:
        """Take what the learner sent (a newer actor, metrics, a failure); never waits."""
        while True:
            try:
                message = self._received.get_nowait()
            except queue.Empty:
                return
            self._handle(message)

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "ended":
            if not self._stopping:
                self._fail("the learner process ended")
        elif kind == "actor":
            _, actor, steps, totals, count, seconds, owed, nonfinite = message
            agent = self.agent
            self._max_lag = max(self._max_lag, float(steps - agent.actor_steps))
            agent._actor = actor
            agent.actor_steps = agent.learner.steps = steps
            agent.nonfinite_steps = nonfinite
            self._totals += totals
            self._steps += count
            self._time += seconds
            self._owed = owed
            # Taken: the learner may send the next one.
            self._want.value = 1
        elif kind == "state":
            self._state_reply = message[1:]
        elif kind == "saved":
            _, path, error = message
            failed = self._saves.pop(path, None)
            if error is not None:
                if failed is None:
                    _LOG.error("the learner process could not write %s: %s", path, error)
                else:
                    failed(Path(path), error)
        elif kind == "error":
            self._fail(f"the learner process failed: {message[1]}")

    def sync(self, timeout: float = SYNC_TIMEOUT_S) -> None:
        """Bring the learner's state into the agent (its model, Adam states, counters)."""
        if self.error is not None:
            raise RuntimeError(f"cannot sync with the learner: {self.error}")
        self._state_reply = None
        self._outbox.put(("state",))
        deadline = time.monotonic() + timeout
        while self._state_reply is None:
            if self.error is not None:
                raise RuntimeError(f"cannot sync with the learner: {self.error}")
            try:
                message = self._received.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                raise RuntimeError(
                    f"the learner process sent no state in {timeout:.0f} s") from None
            self._handle(message)
        model, optimizers, counters, batch_rng = self._state_reply
        agent = self.agent
        with agent.model_lock:
            _load(agent, model, optimizers, counters)
            agent.set_rng_states(agent.act_rng_state(), batch_rng)

    def save(self, path: Path, extra: dict[str, Any] | None, actions: ActionConfig | None,
             with_replay: bool, failed: SaveFailed | None = None) -> Path:
        """Have the learner process write a training checkpoint of its state (and replay)
        with this agent's counters: the control loop never waits for the write. The path
        it will have; a write that fails is reported to ``failed`` (path, error) when the
        answer arrives (``receive``), or logged."""
        self._saves[str(path)] = failed
        agent = self.agent
        self._outbox.put(("save", str(path), extra, actions, with_replay, agent.iteration,
                          agent.env_steps, agent.act_rng_state()))
        return path

    def take(self) -> dict[str, float]:
        """The metrics since the last call (what one iteration's report shows)."""
        self.receive()
        if self.error is None and self._process is not None and not self._process.is_alive():
            self._fail(f"the learner process exited (code {self._process.exitcode})")
        if self.error is not None:
            raise RuntimeError(f"the learner process stopped: {self.error}") from self.error
        agent = self.agent
        env_steps = agent.env_steps - self._env_steps_at_take
        self._env_steps_at_take = agent.env_steps
        steps = self._steps
        metrics = {name: float(v) for name, v in zip(METRICS, self._totals / max(steps, 1),
                                                     strict=True)}
        metrics.update(
            gradient_steps=float(steps), learn_time=self._time,
            utd_achieved=steps / env_steps if env_steps else 0.0,
            policy_lag=self._max_lag, updates_owed=float(self._owed),
        )
        self._totals, self._steps, self._time, self._max_lag = np.zeros(len(METRICS)), 0, 0.0, 0.0
        return metrics

    def stop(self, timeout: float = 10.0) -> None:
        """Sync the learner's state into the agent, then end the process; the agent learns
        in phases again."""
        if self.running and self.error is None:
            try:
                self.sync()
            except RuntimeError as error:
                _LOG.error("the learner's last steps are lost: %s", error)
        self._stopping = True
        self._outbox.put(("stop",))
        self._outbox.put(None)
        if self._sender is not None:
            self._sender.join(timeout)
        if self._process is not None:
            # Its queued checkpoint writes come before "stop": their answers are read here.
            deadline = time.monotonic() + timeout
            while self._process.is_alive() and time.monotonic() < deadline:
                self.receive()
                self._process.join(0.05)
            self.receive()
            if self._process.is_alive():
                self._process.terminate()
                self._process.join(timeout)
        if self._receiver is not None:
            # The process is gone: the receiver reads end-of-file and ends.
            self._receiver.join(timeout)
            self.receive()
        if self._inbox is not None:
            self._inbox.close()
        if self._trainer_cpus:
            pin_threads(self._trainer_cpus)
        self.agent.background = None
        self.agent.remote = None


def _serve(setup: _Setup, inbox: Connection, outbox: Connection, want: Any) -> None:
    """The learner process: continue the agent's learning from ``setup``, fed by ``inbox``."""
    # A terminal's Ctrl-C reaches the whole process group: the trainer ends this process
    # (after taking its state for the last checkpoint), not the signal.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    lower_priority(setup.nice, setup.cpu)
    set_blas_threads(1)
    sent: queue.SimpleQueue = queue.SimpleQueue()

    def send_all() -> None:
        try:
            while (message := sent.get()) is not None:
                outbox.send(message)
        except (OSError, ValueError):
            pass  # the trainer is gone; the main loop sees end-of-file

    sender = threading.Thread(target=send_all, name="sac-learner-sender", daemon=True)
    sender.start()
    try:
        _learn(setup, inbox, sent, want)
    except (EOFError, OSError):
        pass  # the trainer ended without a goodbye
    except Exception as error:  # noqa: BLE001 - sent to the trainer, which reports it
        sent.put(("error", f"{type(error).__name__}: {error}"))
    finally:
        sent.put(None)
        sender.join(10.0)
        outbox.close()


def _write(agent: SACAgent, path: str, extra: dict[str, Any] | None,
           actions: ActionConfig | None, with_replay: bool, iteration: int, env_steps: int,
           act_rng: dict) -> str | None:
    """A checkpoint of the trainer's session (its counters) with this process's learner
    state; None, or what refused the write."""
    agent.iteration, agent.env_steps = iteration, env_steps
    agent.set_rng_states(act_rng, agent.batch_rng_state())
    try:
        save_sac_checkpoint(path, agent, extra, actions, with_replay)
    # MLX reports a full disk as RuntimeError, the filesystem the rest as OSError.
    except (OSError, RuntimeError) as error:
        return f"{type(error).__name__}: {error}"
    return None


def _learn(setup: _Setup, inbox: Connection, sent: queue.SimpleQueue, want: Any) -> None:
    agent = SACAgent(setup.cfg, setup.sac_cfg, setup.bounds)
    agent.replay = setup.replay
    agent.env_steps = setup.env_steps
    _load(agent, setup.model, setup.optimizers, setup.counters)
    agent.set_rng_states(agent.act_rng_state(), setup.batch_rng)
    totals, count, seconds = np.zeros(len(METRICS)), 0, 0.0
    last_sent, sent_at = agent.learner.steps, -ACTOR_PERIOD_S
    lowered = False
    while True:
        wait = 0.0 if agent.ready else IDLE_WAIT_S
        while inbox.poll(wait):
            wait = 0.0
            message = inbox.recv()
            kind = message[0]
            if kind == "step":
                agent.record(*message[1:])
            elif kind == "cut":
                agent.cut(message[1])
            elif kind == "state":
                sent.put(("state", *agent.learner_state(), agent.batch_rng_state()))
            elif kind == "save":
                sent.put(("saved", message[1], _write(agent, *message[1:])))
            elif kind == "stop":
                return
        if agent.ready:
            metrics = agent.learn(STEPS_PER_CALL)
            steps = int(metrics.get("gradient_steps", 0))
            if steps:
                totals += steps * np.array([metrics[name] for name in METRICS])
            count += steps
            seconds += metrics.get("learn_time", 0.0)
            if not lowered:
                # MLX starts its threads with the first step: they learn at the same priority.
                lower_priority(setup.nice, setup.cpu)
                lowered = True
        if (want.value and agent.learner.steps > last_sent
                and time.monotonic() - sent_at >= ACTOR_PERIOD_S):
            want.value = 0
            last_sent, sent_at = agent.learner.steps, time.monotonic()
            sent.put(("actor", agent._actor, last_sent, totals, count, seconds,
                      agent.updates_owed, agent.nonfinite_steps))
            totals, count, seconds = np.zeros(len(METRICS)), 0, 0.0
