"""Where and how urgently a process's threads run: CPU affinity and the lowest priority, for
the learner process (``learner_process``) and the trainer beside it. Linux settings, per
thread; elsewhere each call does what the system allows."""

from __future__ import annotations

import os


def pin_threads(cpus: set[int]) -> None:
    """Every thread of this process on ``cpus`` (a thread's own setting on Linux; threads
    started later inherit their creator's)."""
    for tid in threads():
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass


def threads() -> list[int]:
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def lower_priority(nice: int, cpu: int) -> None:
    """Every thread of this process at ``nice`` and, on Linux, in the SCHED_IDLE class (a
    thread's own setting there; the threads started later inherit their creator's). Nice
    alone is not enough: Linux's EEVDF scheduler lets a running nice-19 thread finish its
    slice (up to a few ms) before a woken control thread runs; a SCHED_IDLE one yields at
    once. With ``cpu`` >= 0 every thread runs on that CPU only: the learner's computing
    otherwise slowed the control loop on whichever CPU it shared, whatever its priority
    (measured on 2 cores: 1.8-2.5 ms more p99 command jitter at SCHED_IDLE, as much with
    its gradient steps kept 3 ms clear of each tick; pinned apart, 0.2-0.7 ms)."""
    if cpu >= 0:
        pin_threads({cpu})
    idle = getattr(os, "SCHED_IDLE", None)
    for tid in threads():
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
            if idle is not None:
                os.sched_setscheduler(tid, idle, os.sched_param(0))
        except OSError:
            pass
