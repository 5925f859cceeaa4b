"""Optional simulator pause / resume around each PPO update (std_srvs services)."""

from __future__ import annotations

from rclpy.node import Node
from rclpy.task import Future
from std_srvs.srv import Empty, SetBool, Trigger

_TYPES = {"empty": Empty, "trigger": Trigger, "setbool": SetBool}


class SimPause:
    """Calls the configured services asynchronously; an absent service is a warning."""

    def __init__(self, node: Node, pause: str, resume: str, service_type: str) -> None:
        self._node = node
        self._type = _TYPES[service_type]
        self._pause = node.create_client(self._type, pause) if pause else None
        self._resume = node.create_client(self._type, resume) if resume else None
        self.calls_failed = 0

    def pause(self) -> Future | None:
        """Request a pause; returns the future to wait on, or None when not configured."""
        return self._call(self._pause, True)

    def resume(self) -> None:
        self._call(self._resume, False)

    def _call(self, client, pause: bool) -> Future | None:
        if client is None:
            return None
        if not client.service_is_ready():
            self.calls_failed += 1
            self._node.get_logger().warning(
                f"simulator service {client.srv_name} is not available: updating without "
                "pausing the simulator",
                throttle_duration_sec=60.0,
            )
            return None
        request = self._type.Request()
        if self._type is SetBool:
            request.data = pause
        return client.call_async(request)
