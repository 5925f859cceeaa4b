"""Launch actions the package's launch files share (imported by them, needs ROS 2 launch).

- ``ends_the_launch``: when a node's process exits (the trainer finished
  ``max_iterations``, a node died), the whole launch shuts down with a line saying
  which and with what code, instead of running on without it.
- ``require_params_file``: a ``params_file`` that does not exist is an error, not a
  warning followed by a run on built-in defaults.
"""

from __future__ import annotations

from pathlib import Path

from launch.actions import EmitEvent, LogInfo, OpaqueFunction, RegisterEventHandler
from launch.event_handlers import OnProcessExit
from launch.events import Shutdown
from launch.launch_context import LaunchContext
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node


def ends_the_launch(node: Node, name: str) -> RegisterEventHandler:
    """Shut the launch down when ``node`` exits; log its name and exit code."""

    def on_exit(event, _context: LaunchContext) -> list:
        code = event.returncode
        how = "finished" if code == 0 else f"failed (exit code {code})"
        return [LogInfo(msg=f"{name} {how}: stopping the launch"),
                EmitEvent(event=Shutdown(reason=f"{name} {how}"))]

    return RegisterEventHandler(OnProcessExit(target_action=node, on_exit=on_exit))


def require_params_file() -> OpaqueFunction:
    """Fail the launch at once when the ``params_file`` argument names no file."""

    def check(context: LaunchContext) -> list:
        path = Path(LaunchConfiguration("params_file").perform(context))
        if not path.is_file():
            raise FileNotFoundError(f"params_file {path} does not exist")
        return []

    return OpaqueFunction(function=check)
