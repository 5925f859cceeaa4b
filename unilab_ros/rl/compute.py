"""Where and how the core computes: matmul precision, device, the GPU kernel cache.

MLX runs float32 matmuls at TF32 precision (a 10-bit mantissa) by default on CUDA and on
Apple M5 (``MLX_ENABLE_TF32`` defaults to 1 there; MLX reads it once, at its first matmul).
The package decides instead of inheriting that: full float32 unless the user sets
``MLX_ENABLE_TF32=1``. Why full precision: an update at TF32 moved the policy's std by
2.2e-4 (0.808923 against 0.809146 from the float64 reference, issue 38 on an H200) where
float32 agrees within the tests' 1e-5, so the core's numerical reference tests fail at
TF32 and a run on a GPU stops being comparable with the same run on a CPU; and at this
package's robot sizes an update on the GPU is bound by kernel launches (0.065 s for 5
epochs of 4 mini-batches at 256 x 24 samples, [512, 256, 128]), not by matmul throughput,
which is all TF32 speeds up. What full precision costs on a GPU is measured by
``bench/ppo_update.py`` run there with and without ``MLX_ENABLE_TF32=1``.
On the CPU backend the setting changes nothing.

MLX's CUDA backend compiles its kernels at first use (NVRTC: 133 s for the first update phase
on a fresh H200, 26 s from its cache) and caches them in ``MLX_PTX_CACHE_DIR``, by default
under the temporary directory, which a robot computer empties at each boot. The package
keeps them in ``~/.cache/unilab_ros/mlx-ptx/<MLX version>`` instead (``$XDG_CACHE_HOME``
respected), unless the user set ``MLX_PTX_CACHE_DIR``, so only the first start on a
machine pays for the compiles.
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version

TF32_ENV = "MLX_ENABLE_TF32"
PTX_CACHE_ENV = "MLX_PTX_CACHE_DIR"


def choose_precision() -> None:
    """Full float32 matmuls unless the user's environment already says otherwise; must run
    before MLX's first matmul."""
    os.environ.setdefault(TF32_ENV, "0")


def choose_kernel_cache() -> str:
    """A persistent directory for MLX's compiled CUDA kernels unless the user named one;
    returns the directory in use. Must run before MLX's first CUDA kernel."""
    if not os.environ.get(PTX_CACHE_ENV):
        root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                                ".cache")
        try:
            mlx_version = version("mlx")
        except PackageNotFoundError:
            mlx_version = "unknown"
        os.environ[PTX_CACHE_ENV] = os.path.join(root, "unilab_ros", "mlx-ptx", mlx_version)
    return os.environ[PTX_CACHE_ENV]


def tf32_enabled() -> bool:
    return os.environ.get(TF32_ENV, "1").strip() not in ("0", "")


def backend() -> str:
    """The MLX backend that runs the core's arrays: cuda, metal or cpu."""
    import mlx.core as mx

    if mx.default_device() == mx.cpu:
        return "cpu"
    if hasattr(mx, "cuda") and mx.cuda.is_available():
        return "cuda"
    return "metal" if mx.metal.is_available() else "gpu"


def precision_description() -> str:
    """One line for start-up logs: the matmul precision and where it was chosen."""
    kind = backend()
    if kind == "cpu":
        return "float32 (CPU backend: TF32 does not apply)"
    if tf32_enabled():
        return f"TF32 matmuls ({TF32_ENV}=1 set by the user)"
    return f"float32 matmuls ({TF32_ENV}=0; set {TF32_ENV}=1 for TF32)"


def compute_description() -> str:
    """Device, backend, matmul precision and, on the CPU, the BLAS: the start-up line a user
    reads to know what trains their policy."""
    import mlx.core as mx

    from unilab_ros.rl.blas import blas_description

    kind = backend()
    blas = (f"; BLAS: {blas_description()}" if kind == "cpu" else
            f"; compiled kernels cached in {os.environ.get(PTX_CACHE_ENV, 'MLX default')}")
    return (f"MLX {mx.__version__} on {mx.default_device()} ({kind}), "
            f"{precision_description()}{blas}")
