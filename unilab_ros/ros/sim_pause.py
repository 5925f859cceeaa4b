"""Optional simulator pause / resume around each PPO update (std_srvs services)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rclpy.client import Client
from rclpy.clock import Clock, ClockType
from rclpy.node import Node
from rclpy.task import Future
from std_srvs.srv import Empty, SetBool, Trigger

_TYPES = {"empty": Empty, "trigger": Trigger, "setbool": SetBool}
_WARN_PERIOD = 60.0
"""Seconds between repeats of one warning: a missing service would warn at every update."""


class SimPause:
    """Calls the configured services one at a time, asynchronously. The caller goes on when
    the service answers; an absent or silent service is a warning and the caller goes on
    without it."""

    def __init__(
        self, node: Node, pause: str, resume: str, service_type: str, timeout: float
    ) -> None:
        self._node = node
        self._type = _TYPES[service_type]
        self._pause = node.create_client(self._type, pause) if pause else None
        self._resume = node.create_client(self._type, resume) if resume else None
        self._timeout = timeout
        # One timer, started per call and cancelled when the call ends. Steady: under
        # use_sim_time a paused simulator stops the node clock, and the timeout must fire.
        self._timeout_timer = node.create_timer(
            timeout,
            self._timed_out,
            clock=Clock(clock_type=ClockType.STEADY_TIME),
            autostart=False,
        )
        self._waiting: tuple[Client, Future, Callable[[], None]] | None = None
        self.calls_failed = 0
        self.unanswered = False
        """Whether the last call was sent and got no answer within the timeout (a dead
        simulator whose service still looks ready); False when none was sent."""
        self.paused = False
        """Whether the simulator answered the last call, a pause (a SetBool or Trigger one
        with success): it takes no step until resumed."""

    @property
    def configured(self) -> list[str]:
        """The resolved names of the configured services."""
        return [self._node.resolve_service_name(client.srv_name)
                for client in (self._pause, self._resume) if client is not None]

    def missing(self) -> list[str]:
        """The resolved names of the configured services not discovered (yet): a relative
        name is under the node's namespace."""
        return [self._node.resolve_service_name(client.srv_name)
                for client in (self._pause, self._resume)
                if client is not None and not client.service_is_ready()]

    @property
    def can_resume(self) -> bool:
        """A resume service is configured."""
        return self._resume is not None

    @property
    def resume_ready(self) -> bool:
        """A resume service is configured and discovered."""
        return self._resume is not None and self._resume.service_is_ready()

    def pause(self, then: Callable[[], None]) -> None:
        """Request a pause; ``then()`` runs once it answered or timed out, or at once when
        no pause service is configured or available."""
        self._call(self._pause, True, then)

    def resume(self, then: Callable[[], None]) -> None:
        """Request a resume; ``then()`` runs as for ``pause``."""
        self._call(self._resume, False, then)

    def _call(self, client: Client | None, pause: bool, then: Callable[[], None]) -> None:
        self.unanswered = False
        self.paused = False
        future = self._request(client, pause) if client is not None else None
        if client is None or future is None:
            then()
            return
        self._waiting = (client, future, then)
        self._timeout_timer.reset()
        future.add_done_callback(self._answered)

    def _request(self, client: Client, pause: bool) -> Future | None:
        if not client.service_is_ready():
            self.calls_failed += 1
            self._node.get_logger().warning(
                f"simulator service {client.srv_name} is not available: going on without it",
                throttle_duration_sec=_WARN_PERIOD,
            )
            return None
        request: Any = self._type.Request()
        if self._type is SetBool:
            request.data = pause
        return client.call_async(request)

    def _answered(self, future: Future) -> None:
        try:
            self._finish(future)
        except Exception:
            # rclpy runs this as an executor task, and its EventsExecutor crashes (rclpy 9)
            # reporting a task's exception once the context is shut down, as a signal during
            # an update does; a node shutting down has nothing left to do.
            if self._node.context.ok():
                raise

    def _timed_out(self) -> None:
        if self._waiting is not None:
            self._finish(self._waiting[1])

    def _finish(self, future: Future) -> None:
        # The answer can be scheduled before the timeout fires and run after it: only the
        # first of the two ends the call.
        if self._waiting is None or self._waiting[1] is not future:
            return
        client, _, then = self._waiting
        self._waiting = None
        self._timeout_timer.cancel()
        if not future.done():
            client.remove_pending_request(future)
            self.calls_failed += 1
            self.unanswered = True
            self._node.get_logger().warning(
                f"simulator service {client.srv_name} did not answer within "
                f"{self._timeout}s: going on without it",
                throttle_duration_sec=_WARN_PERIOD,
            )
        elif client is self._pause and future.exception() is None:
            self.paused = bool(getattr(future.result(), "success", True))
        then()
