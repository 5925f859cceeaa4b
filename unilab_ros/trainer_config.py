"""The trainer node's own settings (ROS-free; declared as parameters by the node)."""

from __future__ import annotations

from dataclasses import dataclass

UPDATE_TRIGGERS = ("rollout_full", "episode_end")
ACTION_MSG_TYPES = ("float32", "float64")
PAUSE_SERVICE_TYPES = ("empty", "trigger", "setbool")


@dataclass
class TrainerNodeConfig:
    """How the trainer talks to the robot or simulator."""

    step_timeout: float = 1.0
    """Seconds (node clock: sim time under use_sim_time) for reward, done and next
    observation to follow an action; a late step is dropped and cuts the segment."""
    obs_timeout: float = 1.0
    """Seconds (steady clock) without an observation before the watchdog acts."""
    watchdog_safe_action: bool = True
    """The watchdog publishes the safe action (else it only reports)."""
    update_safe_action: bool = True
    """Publish the safe action when an update starts (else publish nothing)."""
    warm_up_update: bool = True
    """Run one throwaway PPO update at start-up, before the first action, so MLX compiles
    its kernels then and not in the first update (while the robot waits)."""
    update_trigger: str = "rollout_full"
    """rollout_full: update as soon as the rollout is full; episode_end: then keep
    acting without storing until every env's episode ends, and update while it resets."""
    episode_end_timeout: float = 30.0
    """Seconds (node clock) episode_end waits for the episodes to end before updating."""
    pause_service: str = ""
    """Simulator service called before each update (e.g. /pause_physics); empty: none."""
    resume_service: str = ""
    """Service called after each update (e.g. /unpause_physics); empty: none."""
    pause_service_type: str = "empty"
    """Type of both services: empty, trigger (std_srvs) or setbool (data true pauses)."""
    service_timeout: float = 2.0
    """Seconds to wait for the pause (resume) service before updating (acting) anyway."""
    checkpoint_dir: str = "checkpoints"
    """Folder for checkpoints, the metrics CSV and TensorBoard logs."""
    checkpoint_interval: int = 50
    """Save a checkpoint every this many iterations (and always on shutdown); 0: only then."""
    resume_from: str = ""
    """Checkpoint to continue from (iteration, optimizer, normalizer); empty: fresh start."""
    best_min_episodes: int = 100
    """best.safetensors keeps the policy with the highest mean return over this many of
    the latest finished episodes (the window the logged mean_return uses)."""
    max_iterations: int = 0
    """Stop (and save) after this many iterations in total; 0 trains until stopped."""
    observation_limit: float = 1e6
    """Observations with any |value| above this are rejected as bad input (a finite but
    huge value would poison the observation normalizer for good)."""
    reward_limit: float = 1e6
    """Rewards with any |value| above this are rejected as bad input."""
    qos_depth: int = 10
    """History depth of every topic."""
    action_msg_type: str = "float32"
    """float32 (std_msgs/Float32MultiArray) or float64 (Float64MultiArray, as
    ros2_control's forward_command_controller takes)."""
    tensorboard: bool = True
    """Also write TensorBoard scalars (needs tensorboardX)."""
    control_services: bool = True
    """Offer ~/save_checkpoint, ~/set_training and ~/set_deterministic and accept live
    parameter changes; false on a robot where nobody on the DDS domain may steer it."""
    training: bool = True
    """Learn from the steps (else only act); see the ~/set_training service."""
    deterministic: bool = False
    """Act with the mean action (no learning from those steps); see ~/set_deterministic."""

    def validate(self) -> None:
        if self.step_timeout <= 0.0 or self.obs_timeout <= 0.0:
            raise ValueError("step_timeout and obs_timeout must be positive")
        if self.episode_end_timeout <= 0.0 or self.service_timeout <= 0.0:
            raise ValueError("episode_end_timeout and service_timeout must be positive")
        if self.update_trigger not in UPDATE_TRIGGERS:
            raise ValueError(f"update_trigger must be one of {UPDATE_TRIGGERS}")
        if self.action_msg_type not in ACTION_MSG_TYPES:
            raise ValueError(f"action_msg_type must be one of {ACTION_MSG_TYPES}")
        if self.pause_service_type not in PAUSE_SERVICE_TYPES:
            raise ValueError(f"pause_service_type must be one of {PAUSE_SERVICE_TYPES}")
        if self.checkpoint_interval < 0 or self.max_iterations < 0:
            raise ValueError("checkpoint_interval and max_iterations must be >= 0")
        if not 1 <= self.best_min_episodes <= 100:
            raise ValueError("best_min_episodes must be in 1..100 (the episode window)")
        if not self.observation_limit > 0.0 or not self.reward_limit > 0.0:
            raise ValueError("observation_limit and reward_limit must be positive")
        if self.qos_depth < 1:
            raise ValueError("qos_depth must be >= 1")
