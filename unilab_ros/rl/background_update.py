"""PPO beside acting: the update on rollout k runs on a thread while rollout k+1 is collected.

The control loop hands the full rollout over (``PPOAgent.take_rollout``) and keeps acting
with a numpy copy of the actor pinned as it was (``PolicySampler.pin``): the update
replaces the model's arrays as it goes, and the acting policy must be one policy whose
mean and std each stored step keeps (PPO's "old" outputs, so the ratio of the next
update is taken against the policy that acted, as the issue of asynchronous PPO asks).
When the update is done the loop unpins and acts with the new actor. So the steps of
rollout k+1 collected while update k ran are one update behind the policy that learns
from them (``policy_lag``, in updates); the rest none.

One thread, not a process: the rollout and the model are shared without copies, and the
update releases the GIL inside MLX's kernels. It computes on an MLX stream of its own and
holds the agent's ``model_lock`` throughout; the control thread does no MLX work on the
model meanwhile (it acts in numpy; a checkpoint waits for the lock).
"""

from __future__ import annotations

import logging
import threading

import mlx.core as mx
import numpy as np

from unilab_ros.rl.agent import PPOAgent
from unilab_ros.rl.buffer import RolloutBuffer

_LOG = logging.getLogger(__name__)


class BackgroundUpdate:
    """One PPO update at a time on a thread of its own; see the module docstring."""

    def __init__(self, agent: PPOAgent) -> None:
        agent.sampler.check_pinnable()
        self.agent = agent
        self._thread: threading.Thread | None = None
        self._metrics: dict[str, float] | None = None
        self._error: BaseException | None = None

    @property
    def running(self) -> bool:
        """An update was started and its result not yet taken."""
        return self._thread is not None

    @property
    def done(self) -> bool:
        """The running update finished (``take`` has its result)."""
        return self._thread is not None and not self._thread.is_alive()

    def start(self, bootstrap_obs: np.ndarray) -> None:
        """Update on the agent's full rollout (the observations after each lane's last step:
        ``bootstrap_obs``) while the next one is collected."""
        if self._thread is not None:
            raise RuntimeError("an update is already running beside acting")
        agent = self.agent
        # Nothing lazy of this thread's stream may be left for the update's to evaluate.
        mx.eval(agent.trainer.arrays())
        agent.sampler.pin()
        buffer = agent.take_rollout()
        self._metrics, self._error = None, None
        self._thread = threading.Thread(
            target=self._run, args=(buffer, bootstrap_obs.copy()), name="ppo-update",
            daemon=True)
        self._thread.start()

    def _run(self, buffer: RolloutBuffer, bootstrap_obs: np.ndarray) -> None:
        try:
            # MLX streams are per thread (0.31.2 on): the update computes on its own.
            with self.agent.model_lock, mx.stream(mx.new_stream(mx.default_device())):
                metrics = self.agent.update(bootstrap_obs, buffer)
                # Nothing lazy of this stream left for the control thread (the actor copy,
                # checkpoints) or the next update's thread to evaluate.
                mx.eval(self.agent.trainer.arrays())
            self._metrics = metrics
        except Exception as error:  # noqa: BLE001 - reported by take, never a silent stop
            _LOG.error("the update beside acting failed: %s: %s", type(error).__name__, error)
            self._error = error

    def take(self) -> dict[str, float]:
        """The finished update's metrics; acting goes on with the new actor."""
        if not self.done:
            raise RuntimeError("no finished update to take")
        self._thread = None
        self.agent.sampler.unpin()
        if self._error is not None or self._metrics is None:
            raise RuntimeError(f"the update beside acting failed: {self._error}") from self._error
        return self._metrics

    def stop(self, timeout: float = 60.0) -> None:
        """Wait for a running update (its result is dropped: the run ends)."""
        if self._thread is not None:
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self._thread = None
                self.agent.sampler.unpin()
