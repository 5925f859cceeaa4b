"""Give every pytest process its own ROS 2 graph, so parallel runs do not cross-talk.

This runs at import time, before any test creates an rclpy context: the middleware reads
the variables when the first context is created. A caller's own settings win.
"""

import os

import pytest
import rclpy

# Full float32 matmuls, whatever the caller's environment: the numerical tests compare to
# 1e-5, which TF32 (MLX's default on CUDA and Apple M5) misses. MLX reads it once, at its
# first matmul, so it is set before anything imports mlx (as MLX's own test harness does).
os.environ["MLX_ENABLE_TF32"] = "0"

# Before any test module imports mlx: the core loads the optimized BLAS ahead of it.
import unilab_ros.rl  # noqa: F401

os.environ.setdefault('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')
# Linux allows domain ids 0..101 (UDP port arithmetic); 0 is everyone's default.
os.environ.setdefault('ROS_DOMAIN_ID', str(1 + os.getpid() % 100))


@pytest.fixture
def ros_domain_env():
    """A copy of the environment that puts a subprocess on this process's ROS 2 graph."""
    return dict(os.environ)


@pytest.fixture
def context():
    """A private rclpy context, so in-process node tests never share a graph handle."""
    context = rclpy.Context()
    rclpy.init(context=context)
    yield context
    rclpy.try_shutdown(context=context)


@pytest.fixture
def make_env(context, tmp_path):
    """Builds trainers beside a hand-driven fake environment (trainer_harness.FakeEnv) and
    closes them after the test."""
    # Imported here: only the trainer tests pay for importing the trainer node.
    from trainer_harness import FakeEnv

    made = []

    def make(**overrides) -> FakeEnv:
        overrides.setdefault("checkpoint_dir", str(tmp_path / "checkpoints"))
        made.append(FakeEnv(context, **overrides))
        return made[-1]

    yield make
    for env in made:
        env.close()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(path, model) of the policy node tests' exported policy (policy_harness)."""
    from policy_harness import export_test_policy

    return export_test_policy(tmp_path_factory.mktemp("policy"))


@pytest.fixture
def make_harness(context):
    """Builds policy node harnesses (policy_harness.Harness) and closes them after the
    test."""
    from policy_harness import Harness

    made = []

    def make(checkpoint, **options) -> Harness:
        made.append(Harness(context, checkpoint, **options))
        return made[-1]

    yield make
    for harness in made:
        harness.close()
