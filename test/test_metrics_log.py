"""MetricsLog never blocks its caller and writes whole rows; read_metrics skips broken ones."""

from __future__ import annotations

import errno
import os
import shutil
import struct
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from unilab_ros.trainer import metrics_log
from unilab_ros.trainer.metrics_log import MetricsLog, read_metrics

VALUES = {f"metric_{i}": float(i) + 0.5 for i in range(40)}


def _returns_within(call, seconds: float) -> bool:
    """True when ``call()`` returned within ``seconds`` (it runs on a daemon thread, so
    a call that blocks for ever fails the test instead of hanging it)."""
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive()


def test_a_blocked_tensorboard_writer_blocks_neither_write_nor_close(tmp_path, monkeypatch):
    pytest.importorskip("tensorboardX")
    release = threading.Event()
    # An event file whose disk never answers.
    monkeypatch.setattr(metrics_log._EventFile, "write", lambda *_args: release.wait())
    monkeypatch.setattr(metrics_log, "QUEUE_ROWS", 8, raising=False)
    log = MetricsLog(tmp_path, tensorboard=True)

    def write_rows() -> None:
        for iteration in range(30):
            log.write(iteration, VALUES)
            time.sleep(0.01)  # an iteration takes far longer: the CSV thread keeps up

    try:
        assert _returns_within(write_rows, 5.0), "MetricsLog.write blocked on TensorBoard"
        assert _returns_within(lambda: log.close(timeout=1.0), 4.0), "close blocked"
    finally:
        release.set()
    # The TensorBoard rows beyond the queue were dropped and counted; the CSV kept all.
    assert log.dropped > 0 and log.failures >= log.dropped
    assert read_metrics(tmp_path / "metrics.csv")["iteration"] == list(range(30))


def _read_events(path: Path) -> list:
    """The events of a TensorBoard event file, checking each record's framing and CRCs
    as TensorBoard's reader does."""
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.record_writer import masked_crc32c

    data, events, at = path.read_bytes(), [], 0
    while at < len(data):
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", data[at + 8:at + 12])[0] == masked_crc32c(header)
        body = data[at + 12:at + 12 + length]
        assert struct.unpack("<I", data[at + 12 + length:at + 16 + length])[0] == \
            masked_crc32c(body)
        events.append(Event.FromString(body))
        at += 16 + length
    return events


def test_the_event_file_holds_every_finite_scalar_for_tensorboard(tmp_path):
    pytest.importorskip("tensorboardX")
    log = MetricsLog(tmp_path, tensorboard=True)
    for iteration in (1, 2):
        log.write(iteration, {"mean_return": -10.0 * iteration, "note": float("nan")})
    log.close()
    [path] = (tmp_path / "tensorboard").glob("events.out.tfevents.*")
    events = _read_events(path)
    assert events[0].file_version == "brain.Event:2"
    scalars = [(e.step, v.tag, v.simple_value) for e in events[1:] for v in e.summary.value]
    assert scalars == [(1, "mean_return", -10.0), (2, "mean_return", -20.0)]


def test_a_full_disk_turns_tensorboard_off_with_one_line_and_no_thread_traceback(
    tmp_path, monkeypatch, caplog
):
    """On a full disk tensorboardX's writer thread died with a traceback, a new event file
    was tried every 30 s (each one another traceback) and its atexit hooks printed more:
    8 tracebacks in one sim_train run. Now the first failed write is one line naming the
    file and the error, counted, and TensorBoard is off for the run; the CSV goes on."""
    pytest.importorskip("tensorboardX")
    thread_errors = []
    monkeypatch.setattr(threading, "excepthook", thread_errors.append)
    attempts = []

    def full_disk(self, step, scalars):
        attempts.append(step)
        raise OSError(errno.ENOSPC, "No space left on device", str(self.path))

    monkeypatch.setattr(metrics_log._EventFile, "write", full_disk)
    log = MetricsLog(tmp_path, tensorboard=True)
    with caplog.at_level("ERROR", logger="unilab_ros.trainer.metrics_log"):
        for iteration in range(10):
            log.write(iteration, VALUES)
        log.close()
    assert attempts == [0], "TensorBoard writes went on after the disk refused one"
    [line] = [r.getMessage() for r in caplog.records if "TensorBoard" in r.getMessage()]
    assert "events.out.tfevents" in line and "No space left on device" in line
    assert log.failures == 1 and thread_errors == []
    assert read_metrics(tmp_path / "metrics.csv")["iteration"] == list(range(10))


def test_rows_are_written_in_order_and_close_writes_the_pending_ones(tmp_path):
    log = MetricsLog(tmp_path, tensorboard=True)
    for iteration in range(20):
        log.write(iteration, {"mean_return": -iteration * 1.5, "note": float("nan")})
        # On a disk that answers, the row is there when write returns.
        assert read_metrics(tmp_path / "metrics.csv")["iteration"][-1] == iteration
    log.close()
    metrics = read_metrics(tmp_path / "metrics.csv")
    assert metrics["iteration"] == list(range(20))
    assert metrics["mean_return"] == [-i * 1.5 for i in range(20)]
    assert log.failures == 0
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_a_removed_run_folder_gets_its_header_and_a_new_event_file(tmp_path):
    folder = tmp_path / "run"
    log = MetricsLog(folder, tensorboard=True)
    log.write(0, VALUES)
    _wait_for_rows(folder / "metrics.csv", 1)
    shutil.rmtree(folder)
    log.write(1, VALUES)
    log.write(2, VALUES)
    log.close()
    assert read_metrics(folder / "metrics.csv")["iteration"] == [1, 2]
    assert list((folder / "tensorboard").glob("events.out.tfevents.*"))
    assert log.failures == 2  # the CSV and the TensorBoard file were lost, each once


def test_a_csv_write_that_never_returns_costs_one_short_wait(tmp_path):
    # A FIFO nobody reads: opening it for writing blocks for ever, as a dead disk would.
    os.mkfifo(tmp_path / "metrics.csv")
    log = MetricsLog(tmp_path, tensorboard=False)
    start = time.monotonic()
    for iteration in range(20):
        log.write(iteration, VALUES)
    assert time.monotonic() - start < 20 * metrics_log.CSV_WAIT / 2
    assert _returns_within(lambda: log.close(timeout=0.5), 3.0)
    assert log.failures >= 1  # the rows close could not write
    # Let the stuck thread go.
    os.close(os.open(tmp_path / "metrics.csv", os.O_RDONLY | os.O_NONBLOCK))


def test_read_metrics_skips_a_partial_last_row_and_broken_rows(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text(
        "iteration,mean_return,env_steps\r\n"
        "0,-1200.5,2048\r\n"
        "1,-1100.25,40961,-1000.0,6144\r\n"  # a partial row the next one was appended to
        "2,,6144\r\n"
        "3,-900.0,81"  # cut by a full disk: no line end
    )
    metrics = read_metrics(path)
    assert metrics["iteration"] == [0.0, 2.0]
    assert metrics["mean_return"][0] == -1200.5
    assert str(metrics["mean_return"][1]) == "nan"


def _wait_for_rows(path: Path, rows: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and len(read_metrics(path).get("iteration", [])) >= rows:
            return
        time.sleep(0.01)
    raise AssertionError(f"{path} did not reach {rows} rows")


@pytest.fixture
def small_disk(tmp_path):
    """A 600 kB tmpfs (root only): a disk that really fills."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mount_point = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs",
                             str(mount_point)], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_a_full_disk_with_tensorboard_never_blocks_and_leaves_whole_rows(small_disk):
    folder = small_disk / "run"
    log = MetricsLog(folder, tensorboard=True)
    filler = small_disk / "filler"
    # Leave a few kB: the next rows fill the disk mid-row, mid-event.
    stat = os.statvfs(small_disk)
    filler.write_bytes(b"\0" * (stat.f_bavail * stat.f_frsize - 12_000))
    long_values = {f"a_long_metric_name_{i:03d}": 1.0 / (i + 3) for i in range(60)}

    def write_rows(first: int) -> None:
        for iteration in range(first, first + 150):
            log.write(iteration, long_values)
            time.sleep(0.002)

    assert _returns_within(lambda: write_rows(0), 20.0), "write blocked on a full disk"
    time.sleep(0.5)
    assert log.failures > 0
    # Rows are lost while the disk is full, but those written are whole: every line
    # parses and the file ends with a line end.
    text = (folder / "metrics.csv").read_bytes()
    rows = read_metrics(folder / "metrics.csv")["iteration"]
    assert text.endswith(b"\r\n") and len(rows) == text.count(b"\r\n") - 1
    assert rows == sorted(rows) and len(rows) < 150
    filler.unlink()  # space comes back: rows are written again
    assert _returns_within(lambda: write_rows(1000), 20.0)
    assert _returns_within(lambda: log.close(timeout=2.0), 6.0), "close blocked"
    assert read_metrics(folder / "metrics.csv")["iteration"][-1] == 1149


def test_a_resumed_run_removes_the_rows_past_its_checkpoint(tmp_path):
    """A run killed at iteration 4 after its checkpoint at 2 resumes from 2: its rows 3
    and 4 would come twice (iterations 1, 2, 3, 4, 3, 4): they go, the rest stay."""
    first = MetricsLog(tmp_path, tensorboard=False)
    for iteration in (1, 2, 3, 4):
        first.write(iteration, {"mean_return": float(iteration)})
    first.close()
    resumed = MetricsLog(tmp_path, tensorboard=False, resumed_at=2)
    assert resumed.rows_removed == 2
    resumed.write(3, {"mean_return": 30.0})
    resumed.close()
    metrics = read_metrics(tmp_path / "metrics.csv")
    assert metrics["iteration"] == [1, 2, 3] and metrics["mean_return"] == [1.0, 2.0, 30.0]
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.csv"]
