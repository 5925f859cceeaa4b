"""ROS-free MLX core of unilab_ros: actor-critic, rollout buffer, PPO, checkpoints.

The optimized BLAS must be in the process before mlx is first imported, so this
package loads it before importing any of its MLX modules, and sets up the heap so
MLX's freed buffers are reused rather than faulted in again (see ``heap``); the matmul
precision and the GPU kernel cache are decided before MLX first reads them (``compute``).
"""

from unilab_ros.rl.blas import load_optimized_blas
from unilab_ros.rl.compute import choose_kernel_cache, choose_precision
from unilab_ros.rl.heap import keep_freed_memory

load_optimized_blas()
keep_freed_memory()
choose_precision()
choose_kernel_cache()

from unilab_ros.rl.agent import AgentConfig, PPOAgent  # noqa: E402
from unilab_ros.rl.buffer import RolloutBuffer  # noqa: E402
from unilab_ros.rl.model import MLPActorCritic, ModelConfig  # noqa: E402
from unilab_ros.rl.ppo import PPOTrainer  # noqa: E402
from unilab_ros.rl.ppo_config import PPOConfig  # noqa: E402
from unilab_ros.rl.ppo_runtime import PPORuntimeConfig  # noqa: E402

__all__ = [
    "AgentConfig",
    "MLPActorCritic",
    "ModelConfig",
    "PPOAgent",
    "PPOConfig",
    "PPORuntimeConfig",
    "PPOTrainer",
    "RolloutBuffer",
]
