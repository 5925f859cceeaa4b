"""The executor the nodes spin: rclpy's EventsExecutor where it exists, else the default.

The EventsExecutor (rclpy Kilted on) runs callbacks one at a time in arrival order
and costs a fraction of the SingleThreadedExecutor's per-callback overhead, which
is most of an action's latency. Set UNILAB_EXECUTOR=single to use the classic one.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from rclpy.executors import Executor, SingleThreadedExecutor


def make_executor() -> tuple[Executor, bool]:
    """(executor, True when it delivers messages of all topics in arrival order)."""
    if os.environ.get("UNILAB_EXECUTOR", "events") != "single":
        try:
            from rclpy.experimental.events_executor import EventsExecutor
        except ImportError:
            pass
        else:
            return EventsExecutor(), True
    return SingleThreadedExecutor(), False


def spin(executor: Executor, done: Callable[[], bool] = lambda: False) -> None:
    """Spin until ``done()`` or shutdown. A loop of spin_once, because rclpy.spin() with
    rclpy 9's EventsExecutor busy-loops without serving callbacks."""
    while not done():
        executor.spin_once(timeout_sec=0.2)
