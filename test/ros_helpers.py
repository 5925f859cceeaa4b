"""Bounded spinning for in-process rclpy tests."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from rclpy.executors import Executor


def spin_until(executor: Executor, predicate: Callable[[], object], timeout: float) -> bool:
    """Spin ``executor`` until ``predicate()`` holds or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        executor.spin_once(timeout_sec=0.01)
    return bool(predicate())


@contextlib.contextmanager
def bridge_in_a_thread(context, **params) -> Iterator:
    """A Gymnasium bridge (``GymEnvNode`` with ``params``) spinning on a thread of its own,
    and an executor for the nodes under test; both shut down on the way out."""
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.parameter import Parameter

    from unilab_ros.sims.gym_env_node import GymEnvNode

    bridge = GymEnvNode(context=context, parameter_overrides=[
        Parameter(name, value=value) for name, value in params.items()])
    bridge_executor = SingleThreadedExecutor(context=context)
    bridge_executor.add_node(bridge)
    thread = threading.Thread(target=bridge_executor.spin, daemon=True)
    thread.start()
    executor = SingleThreadedExecutor(context=context)
    try:
        yield bridge, executor
    finally:
        executor.shutdown()
        bridge_executor.shutdown()
        thread.join(timeout=5.0)
        bridge.destroy_node()
