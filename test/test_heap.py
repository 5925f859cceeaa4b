"""MLX's freed buffers are reused from the heap: a PPO update does not fault its memory in.

Each measurement runs in a fresh interpreter, since the heap settings are made once per
process when ``unilab_ros.rl`` is imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from unilab_ros.rl import heap

# Robot-sized updates (rsl_rl's legged-robot network, 256 envs x 24 steps) back to back, as
# between two rollouts; the page faults of the last two, after the first sized the heap.
UPDATE_FAULTS = """
import json, resource
import numpy as np
from unilab_ros.rl import heap
from unilab_ros.rl.buffer import RolloutBuffer
from unilab_ros.rl.model import MLPActorCritic, ModelConfig
from unilab_ros.rl.ppo import PPOTrainer
from unilab_ros.rl.ppo_config import PPOConfig

steps, envs, obs_dim, act_dim = 24, 256, 48, 12
hidden = [512, 256, 128]
model = MLPActorCritic(obs_dim, act_dim, ModelConfig(
    actor_hidden_dims=hidden, critic_hidden_dims=hidden, normalize_observations=False))
trainer = PPOTrainer(model, PPOConfig(num_learning_epochs=5, num_mini_batches=4))
rng = np.random.default_rng(0)
buffer = RolloutBuffer(steps, envs, obs_dim, act_dim, 0.99, 0.95)
for _ in range(steps):
    buffer.add(obs=rng.standard_normal((envs, obs_dim), dtype=np.float32),
               actions=rng.standard_normal((envs, act_dim), dtype=np.float32),
               rewards=rng.standard_normal(envs, dtype=np.float32),
               dones=np.zeros(envs, np.uint8))
zeros = np.zeros((steps, envs), np.float32)
buffer.set_policy_outputs(zeros - 12.0, np.zeros((steps, envs, act_dim), np.float32),
                          np.ones((steps, envs, act_dim), np.float32), zeros)

def update():
    buffer.compute_returns_and_advantages(np.zeros(envs, np.float32))
    trainer.update(buffer)

update()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
update()
update()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"faults": faults / 2, "status": heap.status}))
"""


def run_update(**env_overrides: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("UNILAB_HEAP", "GLIBC_TUNABLES")
           and not k.startswith("MALLOC_")}
    env.update(env_overrides)
    result = subprocess.run(
        [sys.executable, "-c", UPDATE_FAULTS], capture_output=True, text=True, env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


glibc_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="mallopt thresholds are glibc's (Linux)"
)


@glibc_only
def test_a_robot_size_update_reuses_freed_memory():
    tuned = run_update()
    default = run_update(UNILAB_HEAP="default")
    assert tuned["status"].startswith("freed blocks up to 32 MiB reused")
    assert default["status"].startswith("glibc defaults")
    # Measured on x86_64 glibc 2.36: 0-200 faults per update kept, 25,000-30,000 (~100 MB
    # of zero-filled pages) with glibc's defaults.
    assert tuned["faults"] < 2_000, tuned
    assert default["faults"] > 10 * tuned["faults"], (tuned, default)


@glibc_only
def test_the_users_own_glibc_settings_win():
    report = run_update(MALLOC_TRIM_THRESHOLD_="131072")
    assert report["status"] == "glibc with the user's MALLOC_TRIM_THRESHOLD_"
    report = run_update(GLIBC_TUNABLES="glibc.malloc.mmap_threshold=131072")
    assert report["status"] == "glibc with the user's GLIBC_TUNABLES"


def test_status_is_set_once_at_import():
    # This process imported unilab_ros.rl, so the heap was set up (or left) already.
    assert heap.status != "not set"
    assert heap.keep_freed_memory() == heap.status
