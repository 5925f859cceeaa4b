"""Bounded spinning for in-process rclpy tests."""

from __future__ import annotations

import time
from collections.abc import Callable

from rclpy.executors import Executor


def spin_until(executor: Executor, predicate: Callable[[], object], timeout: float) -> bool:
    """Spin ``executor`` until ``predicate()`` holds or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        executor.spin_once(timeout_sec=0.01)
    return bool(predicate())
