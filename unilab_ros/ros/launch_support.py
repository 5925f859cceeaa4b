"""Launch actions the package's launch files share (imported by them, needs ROS 2 launch).

- ``ends_the_launch``: when a node's process exits (the trainer finished
  ``max_iterations``, a node died), the whole launch shuts down with a line saying
  which and with what code, instead of running on without it; a non-zero code makes
  ``ros2 launch`` exit non-zero too, so scripts and CI see the failure.
- ``require_params_file``: a ``params_file`` that does not exist is an error, not a
  warning followed by a run on built-in defaults.
"""

from __future__ import annotations

from pathlib import Path

from launch.actions import EmitEvent, LogInfo, OpaqueFunction, RegisterEventHandler
from launch.event import Event
from launch.event_handler import EventHandler
from launch.event_handlers import OnProcessExit
from launch.events import Shutdown
from launch.launch_context import LaunchContext
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node


class NodeFailed(Event):
    """A node of the launch exited with a non-zero code."""

    name = "unilab_ros.events.NodeFailed"

    def __init__(self, reason: str) -> None:
        self.reason = reason


class LaunchFailed(RuntimeError):
    """Raised in the launch so that ``ros2 launch`` exits 1: launch 3.x has no other way
    for an event handler to set the return code."""


def ends_the_launch(node: Node, name: str) -> RegisterEventHandler:
    """Shut the launch down when ``node`` exits; log its name and exit code, and fail the
    launch when that code is not 0."""

    def on_exit(event, context: LaunchContext) -> list:
        code = event.returncode
        # While the launch stops, a node ended by a signal got it from the launch (Ctrl-C
        # reaches it twice, the second one after rclpy gave its handler back).
        stopped = context.is_shutdown and code < 0
        how = ("finished" if code == 0 else f"stopped by signal {-code}" if stopped
               else f"failed (exit code {code})")
        if context.is_shutdown:
            # A second Shutdown would run every on-shutdown handler again: launch_ros's
            # then raises "Cannot shutdown a ROS adapter that is not running" (rc 1).
            actions = [LogInfo(msg=f"{name} {how}")]
        else:
            actions = [LogInfo(msg=f"{name} {how}: stopping the launch"),
                       EmitEvent(event=Shutdown(reason=f"{name} {how}"))]
        if code != 0 and not stopped:
            # Raised on an event of its own, not here: an exception in this handler would
            # skip the process's own exit handlers, and the launch would wait for ever.
            actions += [RegisterEventHandler(_fails_the_launch()),
                        EmitEvent(event=NodeFailed(f"{name} {how}"))]
        return actions

    return RegisterEventHandler(OnProcessExit(target_action=node, on_exit=on_exit))


def _fails_the_launch() -> EventHandler:
    def fail(context: LaunchContext) -> None:
        raise LaunchFailed(context.locals.event.reason)

    return EventHandler(matcher=lambda event: isinstance(event, NodeFailed),
                        entities=OpaqueFunction(function=fail), handle_once=True)


def require_params_file() -> OpaqueFunction:
    """Fail the launch at once when the ``params_file`` argument names no file."""

    def check(context: LaunchContext) -> list:
        path = Path(LaunchConfiguration("params_file").perform(context))
        if not path.is_file():
            raise FileNotFoundError(f"params_file {path} does not exist")
        return []

    return OpaqueFunction(function=check)
