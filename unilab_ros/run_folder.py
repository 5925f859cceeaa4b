"""The default output folder of a training run (ROS-free).

Two trainers started from one directory must never write the same files (two
metrics.csv headers interleaved, one run's ``latest.safetensors`` overwritten by the
other's), so each run gets ``<root>/<group>/<YYYYmmdd-HHMMSS>-<pid>/``, and
``<root>/<group>/latest`` links to the newest one. The group is the trainer's namespace
(``default`` for none), or the task for ``sim_train``.

A run that stops before writing anything (a bad parameter, a missing file) must not
hide the previous run behind ``latest``: create the folder with ``link_latest=False``
and call ``point_latest`` once it holds a checkpoint or a metrics row.
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
                   now: float | None = None, link_latest: bool = True) -> Path:
    """Create this run's folder under ``root`` (in the group ``namespace_folder(namespace)``)
    and, with ``link_latest``, point ``latest`` at it.

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
    if link_latest:
        point_latest(folder)
    return folder


def point_latest(folder: Path) -> None:
    """Point the ``latest`` link beside ``folder`` (a folder ``new_run_folder`` made) at it."""
    _link_atomically(folder.parent / LATEST_LINK, folder.name)


def _link_atomically(link: Path, target: str) -> None:
    """Point ``link`` at ``target`` (relative): a new link renamed over the old one, so a
    reader always finds either the previous run or this one."""
    temporary = link.with_name(f".{link.name}.{os.getpid()}")
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(target, target_is_directory=True)
    os.replace(temporary, link)
