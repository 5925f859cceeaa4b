"""The one reader of parameter files' keys, ROS-free: the nodes (through ``ros.params``)
and the in-process runs (``training_setup``) fill the same config dataclasses from the
same YAML files, take their descriptions from the same attribute docstrings, and report a
key that names no field in the same words, so a misspelled key never silently leaves its
default in place on either path.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
from collections.abc import Iterable
from typing import Any, TypeVar

Config = TypeVar("Config")


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a dataclass, by field name."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, following in zip(body, body[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def node_parameters(document: dict[str, Any] | None, node: str) -> dict[str, Any]:
    """The ``ros__parameters`` of the entry whose key ends with ``node``, as a params file
    keys it (``/**/node``, ``/ns/node``, ``node``)."""
    for key, entry in (document or {}).items():
        if str(key).rstrip("/").split("/")[-1] == node and isinstance(entry, dict):
            return dict(entry.get("ros__parameters") or {})
    return {}


def build(cls: type[Config], values: dict[str, Any]) -> Config:
    """``cls`` from the keys of ``values`` that name its fields (the caller reports the
    others with ``unknown_keys``)."""
    names = field_names(cls)
    return cls(**{k: v for k, v in values.items() if k in names})


def field_names(*classes: type) -> set[str]:
    return {f.name for cls in classes for f in dataclasses.fields(cls)}


def unknown_keys(values: dict[str, Any], known: Iterable[str], prefix: str = "") -> list[str]:
    """The keys of ``values`` (named ``prefix.key``) that are not ``known``."""
    known = set(known)
    return sorted(f"{prefix}.{key}" if prefix else str(key)
                  for key in values if key not in known)


def unknown_message(names: Iterable[str], hint: str) -> str:
    """The one line both paths log for keys that name no parameter."""
    return f"unknown parameter(s) ignored: {', '.join(names)} (misspelled? {hint})"
