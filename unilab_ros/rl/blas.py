"""Load an optimized BLAS into the process before MLX is imported (Linux only).

MLX's Linux CPU wheel links a reference BLAS whose sgemm is 12-35x slower than
OpenBLAS. MLX resolves ``cblas_sgemm`` through the dynamic linker, so a library
loaded earlier with RTLD_GLOBAL wins. ``UNILAB_BLAS`` names a library to load
instead of the search, or ``none`` to keep MLX's own.

OpenBLAS picks its kernels by CPU model unless ``OPENBLAS_CORETYPE`` names them; a release
older than the CPU falls back to older kernels, so ``blas_kernels`` checks its choice
against the CPU's flags before the library loads and forces a better set that computes
exactly. The kernel set it runs, and why, is reported with the library, since it decides
the matmul speed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

from unilab_ros.rl.blas_kernels import KernelChoice, choose_kernels

_LOG = logging.getLogger(__name__)

_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
)

loaded_blas: str | None = None
"""Path of the BLAS loaded for MLX, or None when MLX uses the one it links."""
core_name: str | None = None
"""The kernel set OpenBLAS runs (e.g. "SkylakeX", "Haswell"), when it says."""
kernel_choice: KernelChoice | None = None
"""How the kernel set was chosen, for OpenBLAS loaded from its usual places."""


def _try_load(path: str) -> bool:
    global core_name
    try:
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return False
    if not hasattr(lib, "cblas_sgemm"):
        return False
    if hasattr(lib, "openblas_get_corename"):
        lib.openblas_get_corename.restype = ctypes.c_char_p
        core_name = lib.openblas_get_corename().decode(errors="replace")
    return True


def load_optimized_blas() -> str | None:
    """Load the first BLAS exporting ``cblas_sgemm``; return its path or None."""
    global loaded_blas
    if loaded_blas is not None or not sys.platform.startswith("linux"):
        return loaded_blas
    if "mlx.core" in sys.modules:
        _LOG.warning("mlx was imported before unilab_ros.rl: its reference BLAS stays in use")
        return None
    requested = os.environ.get("UNILAB_BLAS", "")
    if requested.lower() == "none":
        return None
    found = ctypes.util.find_library("openblas")
    candidates = [requested] if requested else [*_CANDIDATES, *([found] if found else [])]
    for path in candidates:
        if not os.path.exists(path) and os.path.sep in path:
            continue
        if "openblas" in os.path.basename(path).lower():
            _choose_kernels(path)
        if _try_load(path):
            loaded_blas = path
            return path
    return None


def _choose_kernels(path: str) -> None:
    global kernel_choice
    if kernel_choice is None and sys.platform.startswith("linux") and os.uname().machine in (
            "x86_64", "AMD64"):
        kernel_choice = choose_kernels(path)


def blas_description() -> str:
    """One line saying which BLAS MLX's CPU matmuls use, for start-up logs."""
    if sys.platform == "darwin":
        return "Accelerate (macOS)"
    if loaded_blas:
        if core_name is None:  # not OpenBLAS: e.g. MKL's libmkl_rt named by UNILAB_BLAS
            return loaded_blas
        why = f": {kernel_choice.reason}" if kernel_choice is not None else ""
        return f"OpenBLAS ({loaded_blas}, {core_name} kernels{why})"
    return "MLX's bundled reference BLAS (slow: install libopenblas0-pthread)"


def set_blas_threads(count: int) -> bool:
    """Let the loaded OpenBLAS use ``count`` threads in this process from now on; False
    when no BLAS with that call was loaded (macOS's Accelerate, MLX's own)."""
    if not loaded_blas:
        return False
    lib = ctypes.CDLL(loaded_blas)
    if not hasattr(lib, "openblas_set_num_threads"):
        return False
    lib.openblas_set_num_threads(int(count))
    return True
