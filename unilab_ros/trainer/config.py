"""The trainer node's own settings (ROS-free; declared as parameters by the node).

When it stores, updates and stops is ``training_loop.LoopConfig``; the watchdog and the
action message type are shared with the policy node (``watchdog``, ``action_output``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from unilab_ros.ros.qos import RELIABILITIES

PAUSE_SERVICE_TYPES = ("empty", "trigger", "setbool")


@dataclass
class TrainerNodeConfig:
    """How the trainer talks to the robot or simulator."""

    algorithm: str = "ppo"
    """The learner: ppo (on-policy; ``model.*``, ``ppo.*``) or sac (the off-policy soft
    actor-critic; ``sac.*``). Read at start."""
    update_safe_action: bool = True
    """Publish the safe action when an update starts (else publish nothing)."""
    warm_up_update: bool = True
    """Run one throwaway PPO update at start-up, before the first action, so MLX compiles
    its kernels then and not in the first update (while the robot waits)."""
    pause_service: str = ""
    """Simulator service called before each update (e.g. /pause_physics); empty: none."""
    resume_service: str = ""
    """Service called after each update (e.g. /unpause_physics); empty: none."""
    pause_service_type: str = "empty"
    """Type of both services: empty, trigger (std_srvs) or setbool (data true pauses)."""
    service_timeout: float = 2.0
    """Seconds to wait for the pause (resume) service before updating (acting) anyway."""
    checkpoint_dir: str = ""
    """Folder for checkpoints, the metrics CSV and TensorBoard logs; empty: a new folder
    per run, runs_root/<namespace or default>/<YYYYmmdd-HHMMSS>-<pid>/ (runs_root/<namespace
    or default>/latest links to the newest), so two runs never write the same files."""
    runs_root: str = "runs"
    """Where the per-run folders go when checkpoint_dir is empty."""
    resume_from: str = ""
    """Checkpoint to continue from (iteration, optimizer, normalizer); empty: fresh start."""
    best_min_episodes: int = 100
    """best.safetensors keeps the policy with the highest mean return over this many of
    the latest finished episodes (the window the logged mean_return uses)."""
    observation_limit: float = 1e6
    """Observations with any |value| above this are rejected as bad input (a finite but
    huge value would poison the observation normalizer for good)."""
    reward_limit: float = 1e6
    """Rewards with any |value| above this are rejected as bad input."""
    qos_depth: int = 10
    """History depth of every topic."""
    qos_reliability: str = "reliable"
    """reliable or best_effort (e.g. for a driver that publishes SensorDataQoS) for every
    topic; one topic's QoS can be changed with its qos_overrides.<topic>.* parameters."""
    tensorboard: bool = True
    """Also write TensorBoard scalars (needs tensorboardX)."""
    control_services: bool = True
    """Offer ~/save_checkpoint, ~/set_training and ~/set_deterministic and accept live
    parameter changes; false on a robot where nobody on the DDS domain may steer it."""

    robots: list[str] = field(default_factory=list)
    """A fleet: the namespaces (relative to the trainer's) of robots that each speak the
    topic contract with num_envs rows (<robot>/observation, ... <robot>/action), stacked
    into one rollout; a robot that stalls is left out until it comes back. Empty: one
    robot on the trainer's own topics."""

    robot_spec: str = ""
    """A robot that speaks standard messages (joint states, IMU, odometry; joint commands
    to a ros2_control controller): a robot spec file, or a shipped spec's name (config/
    robot_specs). Its sources replace the topic contract; obs_dim, action_dim and the
    action mapping come from it. Empty: the topic contract."""

    control_spin_margin: float = 0.001
    """A robot spec's control loop on the wall clock: each tick waits, spinning, until this
    many seconds after its timer's scheduled time, so a timer the scheduler wakes up to
    this late still ticks on the period (~/status timer_wake says how late it wakes). Costs
    this x control_rate of a core; 0: off. Under use_sim_time the ticks follow /clock."""

    wait_report_period: float = 5.0
    """Seconds between the log lines that say, while no observation has come yet, which
    topics the trainer waits on."""

    def validate(self) -> None:
        if self.wait_report_period <= 0.0:
            raise ValueError("wait_report_period must be positive")
        if self.service_timeout <= 0.0:
            raise ValueError("service_timeout must be positive")
        if not 0.0 <= self.control_spin_margin <= 0.01:
            raise ValueError("control_spin_margin must be in 0..0.01 s")
        if self.pause_service_type not in PAUSE_SERVICE_TYPES:
            raise ValueError(f"pause_service_type must be one of {PAUSE_SERVICE_TYPES}")
        if not 1 <= self.best_min_episodes <= 100:
            raise ValueError("best_min_episodes must be in 1..100 (the episode window)")
        if not self.observation_limit > 0.0 or not self.reward_limit > 0.0:
            raise ValueError("observation_limit and reward_limit must be positive")
        if len(set(self.robots)) != len(self.robots) or not all(
            robot.strip("/") for robot in self.robots
        ):
            raise ValueError("robots must be distinct, non-empty namespaces")
        if self.qos_depth < 1:
            raise ValueError("qos_depth must be >= 1")
        if self.qos_reliability not in RELIABILITIES:
            raise ValueError(f"qos_reliability must be one of {sorted(RELIABILITIES)}")
