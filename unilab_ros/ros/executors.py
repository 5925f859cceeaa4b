"""How the nodes spin: rclpy's EventsExecutor where it exists, else the default.

The EventsExecutor (rclpy Kilted on) runs callbacks one at a time in arrival order
and costs a fraction of the SingleThreadedExecutor's per-callback overhead, which
is most of an action's latency. Set UNILAB_EXECUTOR=single to use the classic one.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import rclpy
from rclpy.executors import Executor, ExternalShutdownException, SingleThreadedExecutor
from rclpy.impl.implementation_singleton import rclpy_implementation
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions

from unilab_ros.ros.middleware import apply_fastdds_profile
from unilab_ros.ros.python_logs import route_package_logs

RCLError = rclpy_implementation.RCLError


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
    while not done() and rclpy.ok():
        try:
            executor.spin_once(timeout_sec=0.2)
        except RCLError:
            # A signal can shut the context down between the check and the wait.
            if rclpy.ok():
                raise
            return


def run_node(
    name: str,
    build: Callable[[bool], Node],
    args: list[str] | None,
    config_errors: tuple[type[Exception], ...],
) -> None:
    """A node executable's main: init, build, spin, clean up; exit 2 on a config error.

    ``build`` gets whether the executor delivers messages in arrival order. A node
    with a ``finished`` attribute ends the spin when it turns true, and exits with its
    ``exit_code`` attribute, if any. On the way out
    (signal, shutdown or finish) ``destroy_node`` runs, where nodes save their work.
    """
    # Before rclpy.init: Fast DDS reads its profile when the first participant is made.
    apply_fastdds_profile()
    try:
        # rclpy's own handlers would raise KeyboardInterrupt inside whatever callback runs
        # (the executor logs that as a FATAL) and invalidate the context under it; the
        # handlers below stop the spin between callbacks instead.
        rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    except RCLError as error:
        # A missing or malformed --params-file (or other bad --ros-args) fails here, with
        # a message that ends in the C source locations of the parser.
        reason = str(error).split(", at /")[0].strip()
        print(f"[FATAL] [{name}]: cannot start: {reason}", file=sys.stderr, flush=True)
        sys.exit(2)
    node: Node | None = None
    code = 0
    stop_requested = False

    def request_stop(_signum: int, _frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    # While the node is built (a warm-up can take a minute) a signal interrupts at once.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)
    logs = route_package_logs(name)
    try:
        executor, arrival_ordered = make_executor()
        node = build(arrival_ordered)
        logs.logger_name = node.get_logger().name
        executor.add_node(node)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, request_stop)
        spin(executor, lambda: stop_requested or bool(getattr(node, "finished", False)))
        # A node that refused to run on says so with its exit code.
        code = int(getattr(node, "exit_code", 0))
    except config_errors as error:
        rclpy.logging.get_logger(name).fatal(f"cannot start: {error}")
        code = 2
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    sys.exit(code)


def while_ros_runs(method: Callable[..., None]) -> Callable[..., None]:
    """Skip a callback once ROS is shut down (a signal): the executor may still run
    queued ones, and their publishing would fail with an invalid context."""

    @functools.wraps(method)
    def guarded(self: Node, *args: Any) -> None:
        if self.context.ok():
            method(self, *args)

    return guarded
