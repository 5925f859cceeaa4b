"""Choose OpenBLAS's kernel set for this CPU before the library loads (x86_64 Linux).

OpenBLAS picks its kernels by CPU model. A release older than the CPU does not know the
model and falls back to an old set: Debian 12's 0.3.21 runs an Intel Xeon of family 6,
model 207 (AVX-512 with BF16) on its SSE3 "Prescott" kernels, 14.9 GFLOP/s on a
1536x512 @ 512x512 matmul against 64-90 with ``OPENBLAS_CORETYPE=Cooperlake``. The set is
fixed when the library loads, so the choice is made first, from trial loads in child
processes: the kernel set the library picks by itself; when that is below what the CPU's
flags allow, each better set from the best down, kept only if its matmuls are exact (an old
release can compute wrong results or crash on a CPU it does not know). The decision is
cached per library and CPU, so the trial loads run once per machine.

A user's own ``OPENBLAS_CORETYPE`` always wins, and ``UNILAB_BLAS_KERNELS=auto`` leaves
the choice to OpenBLAS.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

KEEP_ENV = "UNILAB_BLAS_KERNELS"
CORETYPE_ENV = "OPENBLAS_CORETYPE"

_AVX512 = {"avx512f", "avx512vl", "avx512bw", "avx512dq", "avx512cd"}
CANDIDATES: tuple[tuple[str, frozenset[str]], ...] = (
    ("Cooperlake", frozenset(_AVX512 | {"avx512_bf16"})),
    ("SkylakeX", frozenset(_AVX512)),
    ("Haswell", frozenset({"avx2", "fma"})),
    ("Sandybridge", frozenset({"avx"})),
)
"""OpenBLAS's x86_64 kernel sets worth forcing, best first, with the CPU flags each needs."""

_LEVEL = {"cooperlake": 4, "sapphirerapids": 5, "skylakex": 3, "haswell": 2, "zen": 2,
          "excavator": 2, "sandybridge": 1, "bulldozer": 1, "piledriver": 1,
          "steamroller": 1}
"""How much of a modern CPU each named kernel set uses; an unnamed one (Prescott, Core2,
Nehalem, Barcelona, ...) counts as 0. Sets OpenBLAS names beyond this table count as
current: never replaced."""

PROBE = """
import ctypes, json, sys
import numpy as np
lib = ctypes.CDLL(sys.argv[1])
lib.openblas_get_corename.restype = ctypes.c_char_p
core = lib.openblas_get_corename().decode(errors="replace")
rng = np.random.default_rng(0)
exact = True
for m, k, n in ((67, 45, 53), (256, 256, 256), (512, 96, 1536)):
    # Small integers: every product and sum is exact in float32, so a correct sgemm matches
    # numpy's integer matmul (which uses no BLAS) to the last bit.
    a = rng.integers(-4, 5, (m, k)).astype(np.int64)
    b = rng.integers(-4, 5, (k, n)).astype(np.int64)
    a32, b32 = np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32)
    c = np.zeros((m, n), np.float32)
    ptr = ctypes.POINTER(ctypes.c_float)
    lib.cblas_sgemm(101, 111, 111, m, n, k, ctypes.c_float(1.0), a32.ctypes.data_as(ptr), k,
                    b32.ctypes.data_as(ptr), n, ctypes.c_float(0.0), c.ctypes.data_as(ptr), n)
    exact = exact and bool(np.array_equal(c.astype(np.int64), a @ b))
print(json.dumps({"core": core, "exact": exact}))
"""


@dataclass(frozen=True)
class Trial:
    """What one trial load of the library reported."""

    core: str
    """The kernel set it ran (``openblas_get_corename``); empty when it crashed."""
    exact: bool
    """Whether its matmuls matched the exact integer reference."""


@dataclass(frozen=True)
class KernelChoice:
    """The decision and the reason, for the start-up log."""

    coretype: str | None
    """The value set in ``OPENBLAS_CORETYPE``; None leaves OpenBLAS's own choice."""
    reason: str


def level(core: str) -> int:
    return _LEVEL.get(core.lower(), 0)


def best_allowed(flags: set[str]) -> list[str]:
    """Kernel sets the CPU's flags allow, best first."""
    return [name for name, needs in CANDIDATES if needs <= flags]


def decide(flags: set[str], trial: Callable[[str | None], Trial]) -> KernelChoice:
    """The kernel set to force, from trial loads: ``trial(None)`` loads with OpenBLAS's own
    choice, ``trial(name)`` with ``OPENBLAS_CORETYPE=name``."""
    own = trial(None)
    allowed = best_allowed(flags)
    if not own.core:
        return KernelChoice(None, "a trial load of OpenBLAS failed: its own choice is kept")
    if not allowed or level(own.core) >= level(allowed[0]):
        return KernelChoice(None, f"OpenBLAS's own choice ({own.core}) fits this CPU")
    for name in allowed:
        if level(name) <= level(own.core):
            break
        result = trial(name)
        if result.exact and result.core.lower() == name.lower():
            return KernelChoice(name, f"OpenBLAS picked {own.core} on a CPU with "
                                      f"{' '.join(sorted(dict(CANDIDATES)[name]))}; "
                                      f"{name} kernels checked exact")
    return KernelChoice(None, f"OpenBLAS picked {own.core}; no better kernel set computed "
                              f"exactly on this CPU")


def cpu_identity() -> tuple[str, set[str]]:
    """(model line and family/model/stepping, flags) from /proc/cpuinfo's first CPU."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        return "", set()
    ident = "|".join(fields.get(k, "") for k in ("model name", "cpu family", "model",
                                                 "stepping"))
    return ident, set(fields.get("flags", "").split())


def run_trial(library: str, coretype: str | None, timeout: float = 60.0) -> Trial:
    """Load ``library`` in a child process with ``coretype`` and check its sgemm."""
    env = {k: v for k, v in os.environ.items() if k != CORETYPE_ENV}
    if coretype is not None:
        env[CORETYPE_ENV] = coretype
    try:
        done = subprocess.run([sys.executable, "-c", PROBE, library], capture_output=True,
                              text=True, env=env, timeout=timeout)
        report = json.loads(done.stdout.strip().splitlines()[-1])
        return Trial(str(report["core"]), bool(report["exact"]))
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError, KeyError):
        return Trial("", False)


def cache_path() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "unilab_ros" / "openblas_kernels.json"


def cache_key(library: str, cpu: str) -> str:
    try:
        stat = os.stat(library)
        lib_id = f"{os.path.realpath(library)}|{stat.st_size}|{stat.st_mtime_ns}"
    except OSError:
        lib_id = library
    return hashlib.sha256(f"{lib_id}|{cpu}".encode()).hexdigest()[:16]


def choose_kernels(library: str,
                   trial: Callable[[str, str | None], Trial] = run_trial,
                   cache: Path | None = None) -> KernelChoice:
    """Set ``OPENBLAS_CORETYPE`` for ``library`` when OpenBLAS's own choice falls short of
    the CPU (see the module docstring); return what was decided and why."""
    if os.environ.get(CORETYPE_ENV):
        return KernelChoice(os.environ[CORETYPE_ENV], f"{CORETYPE_ENV} set by the user")
    if os.environ.get(KEEP_ENV, "").lower() == "auto":
        return KernelChoice(None, f"{KEEP_ENV}=auto: OpenBLAS's own choice")
    cpu, flags = cpu_identity()
    if not best_allowed(flags):
        return KernelChoice(None, "no AVX on this CPU: OpenBLAS's own choice")
    cache = cache or cache_path()
    key = cache_key(library, cpu)
    stored = _read_cache(cache)
    if isinstance(stored.get(key), dict) and "reason" in stored[key]:
        choice = KernelChoice(stored[key].get("coretype"), stored[key]["reason"] + " (cached)")
    else:
        choice = decide(flags, lambda name: trial(library, name))
        stored[key] = {"coretype": choice.coretype, "reason": choice.reason}
        _write_atomically(cache, json.dumps(stored, indent=1))
    if choice.coretype is not None:
        os.environ[CORETYPE_ENV] = choice.coretype
    return choice


def _read_cache(path: Path) -> dict:
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return stored if isinstance(stored, dict) else {}


def _write_atomically(path: Path, text: str) -> None:
    """Best effort: an unwritable cache only means the trial loads run again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(text)
        os.replace(partial, path)
    except OSError:
        pass
