"""ROS parameters <-> config dataclasses: the dataclasses are the one source of defaults.

Every field is declared as a parameter (``prefix.field``) with its default, its type
fixed by that default, and its attribute docstring as the description, so
``ros2 param describe`` documents it. YAML files and launch arguments only override.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any, TypeVar

from rcl_interfaces.msg import ParameterDescriptor
from rclpy.exceptions import (
    InvalidParameterTypeException,
    ParameterException,
    ParameterUninitializedException,
)
from rclpy.node import Node
from rclpy.parameter import Parameter

from unilab_ros.config.parameter_files import field_docs, unknown_message

Config = TypeVar("Config")


class ConfigError(ValueError):
    """A parameter value the node cannot start with; the message is one line."""


def _name(prefix: str, field_name: str) -> str:
    return f"{prefix}.{field_name}" if prefix else field_name


def declare_config(
    node: Node, config: Any, prefix: str = "", live: Collection[str] = ()
) -> None:
    """Declare one parameter per field of ``config`` with its value as the default.

    Fields named in ``live`` (full parameter names) may change while the node runs; the
    node applies them in its on-set callback. Every other one is read once at start and
    declared read-only, so ``ros2 param set`` refuses it instead of answering
    "successful" for a value the node would ignore.
    """
    docs = field_docs(type(config))
    for field in dataclasses.fields(config):
        name = _name(prefix, field.name)
        default = getattr(config, field.name)
        read_only = name not in live
        when = "read at start" if read_only else "may be set while running"
        descriptor = ParameterDescriptor(
            description=f"{docs.get(field.name, '')} ({when})".lstrip(),
            read_only=read_only,
        )
        try:
            if default == []:
                _declare_empty_list(node, name, descriptor)
            else:
                node.declare_parameter(name, default, descriptor)
        except InvalidParameterTypeException as error:
            raise ConfigError(
                f"parameter '{name}' must be {_type_name(default)} like its default "
                f"{default!r} (floats need a decimal point): {error}"
            ) from None
        except ParameterException as error:
            raise ConfigError(f"parameter '{name}': {error}") from None


def _declare_empty_list(node: Node, name: str, descriptor: ParameterDescriptor) -> None:
    """Declare a string-list parameter whose default is empty, with that empty value.

    rclpy would type an empty list as bytes, refusing the strings given later; declared
    by type alone it would hold no value, and ``ros2 param get``/``dump`` would call it
    "not set". So it is declared writable by type, given its empty value unless a value
    was given, and only then made read-only as asked.
    """
    writable = ParameterDescriptor(description=descriptor.description)
    declared = node.declare_parameter(name, Parameter.Type.STRING_ARRAY, writable)
    if declared.type_ == Parameter.Type.NOT_SET:
        node.set_parameters([Parameter(name, Parameter.Type.STRING_ARRAY, [])])
    descriptor.type = Parameter.Type.STRING_ARRAY.value
    node.set_descriptor(name, descriptor)


QOS_OVERRIDES = "qos_overrides."
"""rclpy declares these when a topic is created, after the node read its own."""


def report_config(node: Node, config: Any, prefix: str = "") -> None:
    """Make the (read-only) parameters of ``config``'s fields report these values: the
    ones in force, when they came from elsewhere (a policy file), so ``ros2 param get``
    never says one thing while the node does another."""
    for field in dataclasses.fields(config):
        name = _name(prefix, field.name)
        value = getattr(config, field.name)
        current = node.get_parameter(name)
        if _plain(current.value) == value:
            continue
        # rclpy has no public way to change a read-only parameter, not even for its own
        # node (set_descriptor refuses too): its store, of the same type as declared.
        node._parameters[name] = Parameter(name, current.type_, value)


def unknown_parameters(node: Node, qos_overrides: bool = False) -> list[str]:
    """Names given to the node (params file, ``-p``) that it does not declare: its own,
    or with ``qos_overrides`` those of its topics' QoS overrides (once its topics exist).

    rclpy keeps such overrides aside without a word, so a misspelled name would
    silently leave its default in place; the nodes warn with this list.
    """
    return sorted(name for name in given_parameters(node)
                  if name.startswith(QOS_OVERRIDES) == qos_overrides
                  and not node.has_parameter(name))


def given_parameters(node: Node) -> set[str]:
    """Names the node was given a value for (params file, ``-p``), declared or not."""
    # rclpy's own bookkeeping: there is no public accessor for the overrides.
    return set(getattr(node, "_parameter_overrides", {}))


def warn_unknown_parameters(node: Node, qos_overrides: bool = False) -> None:
    unknown = unknown_parameters(node, qos_overrides)
    if unknown:
        node.get_logger().warning(
            unknown_message(unknown, "`ros2 param list` shows the declared ones"))


def read_config(node: Node, cls: type[Config], prefix: str = "") -> Config:
    """Build ``cls`` from the declared parameters and run its ``validate()``, if any."""
    values = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        name = _name(prefix, field.name)
        try:
            values[field.name] = _plain(node.get_parameter(name).value)
        except ParameterUninitializedException:
            if getattr(cls(), field.name) == []:
                # Declared typed but unset: the empty default stands.
                continue
            # e.g. `-p name:=[]`: an empty list has no element type, so rclpy keeps none.
            raise ConfigError(
                f"parameter '{name}' has no value (an empty list cannot be typed: give at "
                "least one element)"
            ) from None
    config = cls(**values)
    validate = getattr(config, "validate", None)
    if validate is not None:
        try:
            validate()
        except ValueError as error:
            where = f"{prefix}." if prefix else ""
            raise ConfigError(f"bad parameter value ({where}*): {error}") from None
    return config


def _plain(value: Any) -> Any:
    """Arrays come back from rclpy as array.array: give the dataclass plain lists."""
    return list(value) if hasattr(value, "tolist") or isinstance(value, tuple) else value


_TYPE_NAMES = {bool: "bool", int: "integer", float: "float", str: "string"}


def _type_name(value: Any) -> str:
    if isinstance(value, list):
        inner = _TYPE_NAMES.get(type(value[0]), "value") if value else "value"
        return f"a list of {inner}s"
    name = _TYPE_NAMES.get(type(value), type(value).__name__)
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"
