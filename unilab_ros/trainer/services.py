"""The trainer's services: save a checkpoint, export a bundle, switch training and
deterministic acting (the last two through their parameters, so both always agree)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rclpy.node import Node
from rclpy.parameter import Parameter
from std_srvs.srv import SetBool, Trigger

from unilab_ros.loop.training_loop import TrainingLoop
from unilab_ros.rl.bundle import BundleError
from unilab_ros.trainer.artifacts import RunArtifacts

MIN_WRITE_PERIOD = 1.0
"""Seconds between two files of one kind written on request (checkpoints, bundles): each
write stalls acting for tens of ms, so a flood of calls must not stall the robot."""


class TrainerServices:
    """Serves ``~/save_checkpoint``, ``~/export_bundle``, ``~/set_training`` and
    ``~/set_deterministic`` on ``node``; a write asked for within ``MIN_WRITE_PERIOD`` of
    the previous one of its kind is refused and counted (``save_requests_refused``)."""

    def __init__(
        self, node: Node, loop: TrainingLoop, artifacts: RunArtifacts,
        save: Callable[[str], Path | None], source: str,
    ) -> None:
        self._node = node
        self._loop = loop
        self._artifacts = artifacts
        self._save = save
        self._source = source
        self._last_write: dict[str, float] = {}
        node.create_service(Trigger, "~/save_checkpoint", self._srv_save)
        node.create_service(Trigger, "~/export_bundle", self._srv_export_bundle)
        node.create_service(SetBool, "~/set_training", self._srv_set_training)
        node.create_service(SetBool, "~/set_deterministic", self._srv_set_deterministic)

    def _refused(self, kind: str, response: Trigger.Response) -> bool:
        since = time.monotonic() - self._last_write.get(kind, -math.inf)
        if since >= MIN_WRITE_PERIOD:
            self._last_write[kind] = time.monotonic()
            return False
        self._loop.counters.add("save_requests_refused")
        response.success = False
        response.message = (
            f"wrote a {kind} {since:.2f} s ago; writing at most once every "
            f"{MIN_WRITE_PERIOD:g} s"
        )
        return True

    def _srv_save(self, _request: Trigger.Request, response: Trigger.Response) -> Any:
        if self._refused("checkpoint", response):
            return response
        path = self._save("service call")
        response.success = path is not None
        response.message = (
            str(path) if path is not None
            else f"saving failed: {self._artifacts.last_save_error}"
        )
        return response

    def _srv_export_bundle(self, _request: Trigger.Request, response: Trigger.Response) -> Any:
        """Write the current policy as a bundle next to the checkpoints."""
        if self._refused("bundle", response):
            return response
        try:
            path = self._artifacts.export_bundle(self._source)
        # MLX reports a full disk as RuntimeError, the filesystem the rest as OSError.
        except (BundleError, OSError, RuntimeError) as error:
            response.success = False
            response.message = f"export failed: {type(error).__name__}: {error}"
            return response
        self._node.get_logger().info(f"policy bundle written: {path}")
        response.success, response.message = True, str(path)
        return response

    def _srv_set_training(self, request: SetBool.Request, response: SetBool.Response) -> Any:
        return self._set_by_service("training", request.data, response)

    def _srv_set_deterministic(self, request: SetBool.Request, response: SetBool.Response) -> Any:
        return self._set_by_service("deterministic", request.data, response)

    def _set_by_service(self, name: str, value: bool, response: SetBool.Response) -> Any:
        """The services set the parameter, so both always agree (one path: the callbacks)."""
        result = self._node.set_parameters([Parameter(name, value=bool(value))])[0]
        response.success = result.successful
        response.message = f"{name}={getattr(self._loop.cfg, name)}" + (
            "" if result.successful else f": {result.reason}"
        )
        return response
