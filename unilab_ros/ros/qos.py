"""The QoS of the nodes' topics: reliability and depth by parameter, each publisher and
subscription open to rclpy's ``qos_overrides`` parameters, and a publisher whose QoS
cannot match a subscription named (it matches nothing, without a word on this side)."""

from __future__ import annotations

from rclpy.node import Node
from rclpy.qos import (
    DurabilityPolicy,
    QoSCompatibility,
    QoSProfile,
    ReliabilityPolicy,
    qos_check_compatible,
)
from rclpy.qos_overriding_options import QoSOverridingOptions

RELIABILITIES = {"reliable": ReliabilityPolicy.RELIABLE,
                 "best_effort": ReliabilityPolicy.BEST_EFFORT}
OVERRIDES_PREFIX = "qos_overrides."
"""Where rclpy declares a topic's QoS overrides: ``qos_overrides./<topic>.<publisher|
subscription>.<reliability|durability|history|depth>``."""


def topic_qos(depth: int, reliability: str) -> QoSProfile:
    """Keep-last ``depth``, ``reliability`` (reliable or best_effort), volatile."""
    return QoSProfile(depth=depth, reliability=RELIABILITIES[reliability],
                      durability=DurabilityPolicy.VOLATILE)


def overridable() -> QoSOverridingOptions:
    """Let ``qos_overrides.<topic>.*`` parameters change reliability, durability,
    history and depth of one publisher or subscription."""
    return QoSOverridingOptions.with_default_policies()


def incompatible_publishers(node: Node, topic: str, qos: QoSProfile) -> list[str]:
    """The publishers of ``topic`` whose QoS a subscription with ``qos`` cannot match
    (e.g. best effort, as many robot drivers publish, against reliable), with the reason."""
    found = []
    for info in node.get_publishers_info_by_topic(topic):
        compatibility, reason = qos_check_compatible(info.qos_profile, qos)
        if compatibility == QoSCompatibility.ERROR:
            why = reason.removeprefix("ERROR: ").rstrip("; ")
            found.append(f"{info.node_namespace.rstrip('/')}/{info.node_name} ({why})")
    return found
