"""One log stream: the ROS-free modules' Python ``logging`` records go to a node's ROS
logger, so they reach the console in ROS's format, the ROS log files and ``/rosout``, and
``--log-level <node>:=debug`` (or ``warn``) applies to them too."""

from __future__ import annotations

import logging

import rclpy.logging

PACKAGE_LOGGER = "unilab_ros"


class RosLogHandler(logging.Handler):
    """Hands each record of the ``unilab_ros`` Python loggers to the ROS logger
    ``logger_name`` (a node's logger name publishes to ``/rosout``)."""

    def __init__(self, logger_name: str) -> None:
        super().__init__()
        self.logger_name = logger_name

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = f"{record.name.removeprefix(PACKAGE_LOGGER + '.')}: {record.getMessage()}"
            logger = rclpy.logging.get_logger(self.logger_name)
            # One call site per severity: rclpy ties a call site to the first one it saw.
            if record.levelno >= logging.CRITICAL:
                logger.fatal(text)
            elif record.levelno >= logging.ERROR:
                logger.error(text)
            elif record.levelno >= logging.WARNING:
                logger.warning(text)
            elif record.levelno >= logging.INFO:
                logger.info(text)
            else:
                logger.debug(text)
        except Exception:  # noqa: BLE001 - logging must never break the caller
            self.handleError(record)


def route_package_logs(logger_name: str) -> RosLogHandler:
    """Send the package's Python log records to the ROS logger ``logger_name``, at that
    logger's level (``--log-level``); returns the handler, whose ``logger_name`` the caller
    may point at the node's own logger once it exists."""
    package = logging.getLogger(PACKAGE_LOGGER)
    for handler in list(package.handlers):
        if isinstance(handler, RosLogHandler):
            package.removeHandler(handler)
    handler = RosLogHandler(logger_name)
    package.addHandler(handler)
    # Python's levels and rcutils' severities share their numbers (10 debug .. 50 fatal).
    package.setLevel(int(rclpy.logging.get_logger(logger_name).get_effective_level()))
    # Printed once, by ROS; not again by a root handler a host program set up.
    package.propagate = False
    return handler
