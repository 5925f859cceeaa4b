"""Per-iteration metrics to a CSV file and, when available, TensorBoard (ROS-free).

Nothing here may hold up acting: ``write`` only hands a row to two writer threads (one
for the CSV file, one for TensorBoard) through bounded queues, so a slow, full or dead
disk costs rows, counted, never a blocked executor.

The TensorBoard event file is written by our own thread with tensorboardX's protobufs
(``_EventFile``), not by its ``SummaryWriter``: that one writes from a thread of its own,
which a full disk kills with a traceback (then every later ``add_scalar`` blocks), and its
atexit hook prints another traceback for each writer at exit. Here a failed event write
is an OSError on our thread: logged once with the file and the error, counted, and
TensorBoard logging is off for the rest of the run (the CSV rows go on).
"""

from __future__ import annotations

import csv
import errno
import io
import logging
import math
import os
import queue
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_LOG = logging.getLogger(__name__)

QUEUE_ROWS = 64
"""Rows each writer thread may have pending; more are dropped (and counted)."""
CLOSE_TIMEOUT = 5.0
"""Seconds ``close`` waits for both writer threads to write what is pending."""
CSV_WAIT = 0.05
"""Seconds ``write`` waits for its CSV row while the CSV thread keeps up, so a row is on
disk when ``write`` returns (as readers of metrics.csv expect); once a wait times out,
``write`` waits no more until the thread has caught up."""

_STOP = object()


class _WriterThread:
    """A daemon thread calling ``handle`` on each submitted item, in order."""

    def __init__(
        self, name: str, handle: Callable[[Any], None], capacity: int,
        finish: Callable[[], None] | None = None,
    ) -> None:
        self._handle = handle
        self._finish = finish
        self._queue: queue.Queue[Any] = queue.Queue(capacity)
        self._idle = threading.Condition()
        self._pending = 0
        # Daemon: a thread stuck in a dead disk's write must not keep the process alive.
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, item: Any) -> bool:
        """Queue ``item``; False (dropped) when the queue is full."""
        with self._idle:
            try:
                self._queue.put_nowait(item)
            except queue.Full:
                return False
            self._pending += 1
        return True

    def wait_idle(self, timeout: float) -> bool:
        """True once every submitted item was handled, False after ``timeout`` seconds."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def stop(self, deadline: float) -> bool:
        """Let the pending items be handled, then end the thread; False when that did not
        happen before ``deadline`` (``time.monotonic()``): the thread is left behind."""
        try:
            self._queue.put(_STOP, timeout=max(0.0, deadline - time.monotonic()))
        except queue.Full:
            return False
        self._thread.join(max(0.0, deadline - time.monotonic()))
        return not self._thread.is_alive()

    def _run(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            self._handle(item)
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()
        if self._finish is not None:
            self._finish()


class _EventFile:
    """A TensorBoard event file (TFRecord framing of ``Event`` protobufs) that this process
    appends to with one ``os.write`` per row: a failed or short write raises OSError and is
    undone, so the file only ever holds whole records."""

    def __init__(self, folder: Path) -> None:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.record_writer import masked_crc32c
        from tensorboardX.summary import scalar

        self._event, self._crc, self._scalar = Event, masked_crc32c, scalar
        folder.mkdir(parents=True, exist_ok=True)
        # The pid keeps two runs started in one second (a restart) in two files.
        self.path = folder / (f"events.out.tfevents.{int(time.time())}."
                              f"{socket.gethostname()}.{os.getpid()}")
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            self._append([Event(wall_time=time.time(), file_version="brain.Event:2")])
        except OSError:
            self.close()
            raise

    def write(self, step: int, scalars: dict[str, float]) -> None:
        now = time.time()
        self._append([self._event(wall_time=now, step=step, summary=self._scalar(key, value))
                      for key, value in scalars.items()])

    def _append(self, events: list[Any]) -> None:
        data = b"".join(self._record(event.SerializeToString()) for event in events)
        size = os.fstat(self._fd).st_size
        try:
            if os.write(self._fd, data) != len(data):
                raise OSError(errno.ENOSPC, "short write", str(self.path))
        except OSError:
            os.ftruncate(self._fd, size)
            raise

    def _record(self, data: bytes) -> bytes:
        header = struct.pack("<Q", len(data))
        return (header + struct.pack("<I", self._crc(header)) + data
                + struct.pack("<I", self._crc(data)))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class MetricsLog:
    """Appends one CSV row per iteration; the columns are fixed by the first row.

    A folder or disk that refuses writes (read-only, full) does not stop training: the
    failure is logged once and counted in ``failures``; later CSV rows are tried again,
    while TensorBoard stays off for the run. A row is appended whole or not at all, so a
    full disk never leaves half a row. A run folder removed while training is made again,
    the CSV with its header and TensorBoard with a new event file (counted too: the
    earlier rows are gone).

    ``resumed_at``: the iteration a resumed run continues from. The rows of later
    iterations (written before a crash, after its last checkpoint) are removed from an
    existing CSV (``rows_removed``), so its iterations only ever go up.
    """

    def __init__(
        self, folder: str | Path, tensorboard: bool = True, resumed_at: int | None = None
    ) -> None:
        self.folder = Path(folder)
        self.csv_path = self.folder / "metrics.csv"
        self.tensorboard_folder = self.folder / "tensorboard"
        self._lock = threading.Lock()
        self._failures = 0
        self.dropped = 0
        """Rows (CSV or TensorBoard) dropped because their writer thread was behind."""
        self._logged: set[str] = set()
        self._columns: list[str] | None = None
        self._csv_behind = False
        self._events: _EventFile | None = None
        self.rows_removed = 0
        """Rows past ``resumed_at`` removed from an existing CSV."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            if self.csv_path.exists() and self.csv_path.stat().st_size > 0:
                with open(self.csv_path, newline="") as handle:
                    self._columns = next(csv.reader(handle), None)
                if resumed_at is not None:
                    self.rows_removed = _keep_rows_through(self.csv_path, resumed_at)
        except OSError as error:
            self._failed("csv", f"cannot write {self.csv_path}: {error}")
        self._csv_thread: _WriterThread | None = _WriterThread(
            "metrics-csv", self._write_row, QUEUE_ROWS
        )
        self._tensorboard_thread: _WriterThread | None = None
        if tensorboard:
            self._events = self._event_file()
            if self._events is not None:
                self._tensorboard_thread = _WriterThread(
                    "metrics-tensorboard", self._write_scalars, QUEUE_ROWS,
                    finish=self._close_events,
                )

    @property
    def failures(self) -> int:
        """Rows lost: failed or dropped writes and removed run folders."""
        with self._lock:
            return self._failures

    def _event_file(self) -> _EventFile | None:
        try:
            return _EventFile(self.tensorboard_folder)
        except ImportError:
            _LOG.warning("tensorboardX is not installed: TensorBoard logging is off")
        except OSError as error:
            self._failed("tensorboard", f"cannot write a TensorBoard event file in "
                         f"{self.tensorboard_folder}: {error}; TensorBoard logging is off "
                         "for this run")
        return None

    def _failed(self, kind: str, message: str) -> None:
        """Count a lost row; log the first of each ``kind`` only."""
        with self._lock:
            self._failures += 1
            first = kind not in self._logged
            self._logged.add(kind)
        if first:
            _LOG.error("%s (training goes on; logged once)", message)

    def write(self, iteration: int, values: dict[str, float]) -> None:
        """Queue one row; returns within CSV_WAIT seconds, whatever the disk does."""
        row = {"iteration": iteration, **values}
        csv_thread = self._csv_thread
        if csv_thread is not None and self._csv_behind:
            self._csv_behind = not csv_thread.wait_idle(0.0)
        for name, thread in (("CSV", csv_thread), ("TensorBoard", self._tensorboard_thread)):
            if thread is not None and not thread.submit(row):
                with self._lock:
                    self.dropped += 1
                self._failed(f"dropped {name}", f"{name} metrics writes are behind (a slow "
                             f"or dead disk?): the row of iteration {iteration} is dropped")
        if csv_thread is not None and not self._csv_behind:
            self._csv_behind = not csv_thread.wait_idle(CSV_WAIT)

    def _write_row(self, row: dict[str, Any]) -> None:
        columns = self._columns or list(row)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.csv_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as error:
            self._failed("csv", f"cannot write {self.csv_path}: {error}")
            return
        try:
            size = os.fstat(fd).st_size
            if size == 0 and self._columns is not None:
                self._failed("csv recreated", f"{self.csv_path} was removed: written "
                             "again from its header")
            text = io.StringIO()
            writer = csv.DictWriter(text, fieldnames=columns, extrasaction="ignore")
            if size == 0:
                writer.writeheader()
            writer.writerow(row)
            data = text.getvalue().encode()
            try:
                # One write call; a short one (the disk filled) is undone, so the file
                # only ever holds whole rows.
                if os.write(fd, data) != len(data):
                    raise OSError(errno.ENOSPC, "short write", str(self.csv_path))
            except OSError:
                os.ftruncate(fd, size)
                raise
            self._columns = columns
        except OSError as error:
            self._failed("csv", f"cannot write {self.csv_path}: {error}")
        finally:
            os.close(fd)

    def _write_scalars(self, row: dict[str, Any]) -> None:
        if self._events is None:
            return
        if not self.tensorboard_folder.is_dir():
            # A removed folder would swallow the scalars (the event file is unlinked).
            self._failed("tensorboard lost", f"{self.tensorboard_folder} was removed: "
                         "starting a new event file")
            self._close_events()
            self._events = self._event_file()
            if self._events is None:
                return
        scalars = {key: float(value) for key, value in row.items()
                   if key != "iteration" and isinstance(value, int | float)
                   and math.isfinite(value)}
        try:
            self._events.write(row["iteration"], scalars)
        except OSError as error:
            # A full disk fails every later row too: one line, then TensorBoard is off.
            self._failed("tensorboard", f"cannot write {self._events.path}: {error}; "
                         "TensorBoard logging is off for the rest of this run")
            self._close_events()

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Write what is pending, within ``timeout`` seconds in all; a writer thread
        stuck on a dead disk is left behind (it is a daemon) and counted."""
        deadline = time.monotonic() + timeout
        if self._csv_thread is not None and not self._csv_thread.stop(deadline):
            self._failed("close csv", f"metrics.csv writes did not finish in {timeout} s")
        self._csv_thread = None
        thread, self._tensorboard_thread = self._tensorboard_thread, None
        if thread is not None and not thread.stop(deadline):
            self._failed("close tensorboard", f"TensorBoard writes did not finish in "
                         f"{timeout} s (a full disk?)")

    def _close_events(self) -> None:
        if self._events is not None:
            self._events.close()
            self._events = None


def _keep_rows_through(path: Path, iteration: int) -> int:
    """Remove the rows of ``path`` whose iteration is past ``iteration`` (the file is
    replaced atomically: a crash leaves the old one whole); returns how many."""
    with open(path, newline="") as handle:
        lines = handle.read().splitlines(keepends=True)
    header = next(csv.reader(lines[:1]), [])
    if "iteration" not in header:
        return 0
    column = header.index("iteration")
    kept = lines[:1]
    for line in lines[1:]:
        fields = next(csv.reader([line]), [])
        try:
            later = float(fields[column]) > iteration
        except (IndexError, ValueError):
            later = False  # a broken row: read_metrics skips it anyway
        if not later:
            kept.append(line)
    removed = len(lines) - len(kept)
    if removed:
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            with open(temporary, "w", newline="") as handle:
                handle.write("".join(kept))
            os.replace(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)
    return removed


def read_metrics(csv_path: str | Path) -> dict[str, list[float]]:
    """Columns of a metrics CSV as float lists (for plots and tests).

    A row that is not whole (a disk that filled mid-write under an older version, a
    process killed mid-row) is skipped; an empty field reads as NaN.
    """
    with open(csv_path, newline="") as handle:
        text = handle.read()
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines.pop()
    reader = csv.reader(lines)
    header = next(reader, [])
    columns: dict[str, list[float]] = {key: [] for key in header}
    rows = 0
    for fields in reader:
        if len(fields) != len(header):
            continue
        try:
            values = [float(field) if field else math.nan for field in fields]
        except ValueError:
            continue
        for key, value in zip(header, values, strict=True):
            columns[key].append(value)
        rows += 1
    return columns if rows else {}
