"""OpenBLAS's kernel set is checked against the CPU before the library loads, a fallback is
replaced by the best set that computes exactly, a user's choice wins, and the decision is
cached; the matmul precision is decided (full float32) and said at start-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from unilab_ros.rl import blas_kernels
from unilab_ros.rl.blas_kernels import KernelChoice, Trial, choose_kernels, decide

COOPERLAKE_CPU = {"sse3", "avx", "avx2", "fma", "avx512f", "avx512vl", "avx512bw",
                  "avx512dq", "avx512cd", "avx512_bf16"}
OPENBLAS = Path("/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0")


def trials(results: dict[str | None, Trial], asked: list):
    def trial(name: str | None) -> Trial:
        asked.append(name)
        return results[name]
    return trial


def test_a_prescott_fallback_on_an_avx512_bf16_cpu_becomes_cooperlake():
    asked: list = []
    choice = decide(COOPERLAKE_CPU, trials({None: Trial("Prescott", True),
                                            "Cooperlake": Trial("Cooperlake", True)}, asked))
    assert choice.coretype == "Cooperlake"
    assert "Prescott" in choice.reason and asked == [None, "Cooperlake"]


def test_a_kernel_set_that_computes_wrong_or_does_not_take_is_passed_over():
    asked: list = []
    choice = decide(COOPERLAKE_CPU, trials({
        None: Trial("Prescott", True),
        "Cooperlake": Trial("Cooperlake", False),  # wrong results on this CPU
        "SkylakeX": Trial("Prescott", True),  # the library did not know the name
        "Haswell": Trial("Haswell", True),
    }, asked))
    assert choice.coretype == "Haswell"
    assert asked == [None, "Cooperlake", "SkylakeX", "Haswell"]


def test_a_crashing_candidate_leaves_openblas_its_own_choice():
    choice = decide({"avx", "avx2", "fma"}, trials({None: Trial("Sandybridge", True),
                                                    "Haswell": Trial("", False)}, []))
    assert choice.coretype is None and "no better kernel set" in choice.reason


def test_a_choice_that_fits_the_cpu_is_kept_without_further_trials():
    asked: list = []
    choice = decide(COOPERLAKE_CPU, trials({None: Trial("Cooperlake", True)}, asked))
    assert choice == KernelChoice(None, "OpenBLAS's own choice (Cooperlake) fits this CPU")
    assert asked == [None]
    assert decide({"sse3", "avx", "avx2", "fma"},
                  trials({None: Trial("Zen", True)}, [])).coretype is None


@pytest.fixture
def fallback_cpu(monkeypatch):
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    monkeypatch.delenv(blas_kernels.KEEP_ENV, raising=False)
    monkeypatch.setattr(blas_kernels, "cpu_identity", lambda: ("Xeon|6|207|2", COOPERLAKE_CPU))
    calls: list = []

    def trial(library: str, name: str | None) -> Trial:
        calls.append(name)
        return Trial(name or "Prescott", True)
    return trial, calls


def test_the_choice_is_set_for_the_library_and_cached(fallback_cpu, tmp_path):
    trial, calls = fallback_cpu
    cache = tmp_path / "kernels.json"
    first = choose_kernels("/lib/libopenblas.so.0", trial, cache)
    assert first.coretype == "Cooperlake" and os.environ["OPENBLAS_CORETYPE"] == "Cooperlake"
    os.environ.pop("OPENBLAS_CORETYPE")
    second = choose_kernels("/lib/libopenblas.so.0", trial, cache)
    assert second.coretype == "Cooperlake" and second.reason.endswith("(cached)")
    assert calls == [None, "Cooperlake"]  # no trial loads the second time
    assert os.environ.pop("OPENBLAS_CORETYPE") == "Cooperlake"


def test_a_users_coretype_wins_and_auto_keeps_openblas_choice(fallback_cpu, tmp_path,
                                                               monkeypatch):
    trial, calls = fallback_cpu
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    assert choose_kernels("/lib/x.so", trial, tmp_path / "c.json").coretype == "Haswell"
    monkeypatch.delenv("OPENBLAS_CORETYPE")
    monkeypatch.setenv(blas_kernels.KEEP_ENV, "auto")
    assert choose_kernels("/lib/x.so", trial, tmp_path / "c.json").coretype is None
    assert "OPENBLAS_CORETYPE" not in os.environ and calls == []


@pytest.mark.skipif(not OPENBLAS.exists(), reason="libopenblas0-pthread not installed")
def test_a_trial_load_reports_the_kernels_it_ran_and_checks_them_exact():
    trial = blas_kernels.run_trial(str(OPENBLAS), "Prescott")
    assert trial == Trial("Prescott", True)
    assert blas_kernels.run_trial("/nonexistent/libopenblas.so.0", None) == Trial("", False)


def start_up_report(**env: str) -> dict:
    code = ("import json, os, unilab_ros.rl\n"
            "from unilab_ros.rl.compute import compute_description\n"
            "print(json.dumps({'tf32': os.environ.get('MLX_ENABLE_TF32'),"
            " 'line': compute_description()}))")
    child = {k: v for k, v in os.environ.items() if k != "MLX_ENABLE_TF32"}
    child.update(env)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=child, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_core_decides_full_float32_and_a_users_tf32_wins():
    assert start_up_report()["tf32"] == "0"
    assert start_up_report(MLX_ENABLE_TF32="1")["tf32"] == "1"


def test_the_start_up_line_names_device_backend_precision_and_blas():
    line = start_up_report(OPENBLAS_CORETYPE="Haswell")["line"]
    assert "Device(cpu, 0) (cpu)" in line and "float32" in line
    if OPENBLAS.exists():
        assert "Haswell kernels: OPENBLAS_CORETYPE set by the user" in line


def test_the_tests_run_at_full_precision():
    assert os.environ["MLX_ENABLE_TF32"] == "0"


def test_compiled_gpu_kernels_are_kept_out_of_the_temporary_directory(tmp_path):
    code = ("import json, os, unilab_ros.rl\n"
            "print(json.dumps({'dir': os.environ.get('MLX_PTX_CACHE_DIR')}))")
    child = {k: v for k, v in os.environ.items() if k != "MLX_PTX_CACHE_DIR"}
    for env, expected in (({"XDG_CACHE_HOME": str(tmp_path)}, str(tmp_path / "unilab_ros")),
                          ({"MLX_PTX_CACHE_DIR": "/own/cache"}, "/own/cache")):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**child, **env}, timeout=120)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.strip().splitlines()[-1])["dir"].startswith(expected)
