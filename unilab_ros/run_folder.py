"""The default output folder of a training run (ROS-free).

Two trainers started from one directory must never write the same files (two
metrics.csv headers interleaved, one run's ``latest.safetensors`` overwritten by the
other's), so each run gets ``<root>/<namespace or default>/<YYYYmmdd-HHMMSS>-<pid>/``,
and ``<root>/<namespace or default>/latest`` links to the newest one.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

DEFAULT_NAMESPACE_FOLDER = "default"
LATEST_LINK = "latest"


def namespace_folder(namespace: str) -> str:
    """A node namespace as one folder name: ``/robot1`` -> robot1, ``/a/b`` -> a_b."""
    name = namespace.strip("/").replace("/", "_")
    return name or DEFAULT_NAMESPACE_FOLDER


def new_run_folder(root: Path, namespace: str, pid: int | None = None,
                   now: float | None = None) -> Path:
    """Create this run's folder under ``root`` and point ``latest`` at it.

    The process id makes the name unique among runs started in the same second; the
    folder is created with ``exist_ok=False`` so a clash is an error, never shared files.
    """
    pid = os.getpid() if pid is None else pid
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    # Absolute: the log line naming it must be usable from any directory.
    parent = root.resolve() / namespace_folder(namespace)
    parent.mkdir(parents=True, exist_ok=True)
    folder = parent / f"{stamp}-{pid}"
    folder.mkdir()
    _link_atomically(parent / LATEST_LINK, folder.name)
    return folder


def _link_atomically(link: Path, target: str) -> None:
    """Point ``link`` at ``target`` (relative): a new link renamed over the old one, so a
    reader always finds either the previous run or this one."""
    temporary = link.with_name(f".{link.name}.{os.getpid()}")
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(target, target_is_directory=True)
    os.replace(temporary, link)
