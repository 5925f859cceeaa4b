"""The default output folder of a training run (ROS-free).

Two trainers started from one directory must never write the same files (two
metrics.csv headers interleaved, one run's ``latest.safetensors`` overwritten by the
other's), so each run gets ``<root>/<group>/<YYYYmmdd-HHMMSS>-<pid>/``, and
``<root>/<group>/latest`` links to the newest one. The group is the trainer's namespace
(``default`` for none), or the task for ``sim_train``.

A run that stops before writing anything (a bad parameter, a missing file) must not
hide the previous run behind ``latest``: create the folder with ``link_latest=False``
and call ``point_latest`` once it holds a checkpoint or a metrics row.

A folder given by name (``checkpoint_dir``, ``sim_train --output``) may hold an earlier
run; ``restart_plan`` decides what a new start there does: continue it, or refuse with
one line, never train over it from iteration 0.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from unilab_ros.rl.checkpoint import Checkpoint, CheckpointError
from unilab_ros.trainer.metrics_log import read_metrics

DEFAULT_NAMESPACE_FOLDER = "default"
LATEST_LINK = "latest"
LATEST_CHECKPOINT = "latest.safetensors"
BEST_CHECKPOINT = "best.safetensors"


class RunFolderError(ValueError):
    """A start that would overwrite the run its folder holds: one line, naming the folder
    and the parameters that choose."""


@dataclass(frozen=True)
class RestartPlan:
    """What a start in a named folder does."""

    resume_from: str
    """The training checkpoint to continue ("" for a fresh start)."""
    note: str = ""
    """A line for the operator when the folder held a run ("" otherwise)."""


def run_files(folder: Path) -> list[str]:
    """What of a training run ``folder`` holds: its checkpoints and a metrics.csv with
    rows (empty for a new or empty folder)."""
    if not folder.is_dir():
        return []
    held = sorted(path.name for path in folder.glob("*.safetensors")
                  if path.name in (LATEST_CHECKPOINT, BEST_CHECKPOINT)
                  or path.name.startswith("checkpoint_"))
    metrics = folder / "metrics.csv"
    try:
        rows = read_metrics(metrics).get("iteration", []) if metrics.is_file() else []
    except (OSError, UnicodeDecodeError):
        rows = [0.0]  # unreadable, but there: a run wrote it
    if rows:
        held.append(f"metrics.csv to iteration {int(max(rows))}")
    return held


def restart_plan(
    folder: Path, resume_from: str = "", init_from: str = "", max_iterations: int = 0
) -> RestartPlan:
    """What a start writing into ``folder`` does, given the ``resume_from``,
    ``finetune.init_from`` and ``max_iterations`` parameters:

    - a folder with no run in it: as asked;
    - ``resume_from`` given: the run goes on from that checkpoint (the caller removes
      metrics rows past its iteration; a better stored best is kept);
    - else ``latest.safetensors`` there: resumed from it (refused when that run already
      reached ``max_iterations``);
    - else (killed before its first checkpoint, or a fine-tuning start): refused.

    Raises RunFolderError with the line (for a latest that cannot be read, its reason).
    """
    held = run_files(folder)
    if not held:
        return RestartPlan(resume_from)
    what = f"checkpoint_dir {folder} holds a run ({', '.join(held)})"
    fresh = ("give another checkpoint_dir (none: a new run folder under runs_root), or "
             "remove this one")
    if init_from:
        raise RunFolderError(f"{what}: finetune.init_from starts a new run; {fresh}")
    if resume_from:
        return RestartPlan(resume_from, f"{what}: it goes on from {resume_from}")
    latest = folder / LATEST_CHECKPOINT
    if latest.is_file():
        try:
            iteration = Checkpoint(latest).iteration
        except CheckpointError as error:
            raise RunFolderError(f"{what}, but it cannot be resumed ({error}): give "
                                 f"resume_from:=<one of its checkpoints>, or {fresh}") from None
        if max_iterations and iteration >= max_iterations:
            raise RunFolderError(
                f"{what}, finished at iteration {iteration} of max_iterations "
                f"{max_iterations}: raise max_iterations to go on with it, or {fresh}")
        return RestartPlan(str(latest), f"{what}: resuming it from {latest} (iteration "
                                        f"{iteration})")
    best = folder / BEST_CHECKPOINT
    from_best = f"resume_from:={best} to go on from its best policy, or " if best.is_file() \
        else ""
    raise RunFolderError(f"{what} but no {LATEST_CHECKPOINT} to resume (stopped before its "
                         f"first checkpoint?): give {from_best}{fresh}")


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
