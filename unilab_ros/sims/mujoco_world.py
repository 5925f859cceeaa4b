"""A MuJoCo world of identical robots, with ros2_control-style commands (ROS-free).

``MujocoWorld`` loads one MJCF model and simulates ``num_robots`` copies of it, each in
its own ``MjData`` (they never touch), advancing all of them one tick at a time (a
whole number of model timesteps). It knows nothing of ROS or of wall time: the node paces
it and turns its samples into messages; a training step source can drive it directly.

Commands follow ros2_control's forward_command_controller: one value per commanded joint,
the last one held. The interface is set on the model's actuators, which must be plain
``<motor>`` actuators on joints, so MuJoCo applies it at every physics step:

- effort: the torque (force on a slide joint) itself;
- position: ``kp (command - q) - kd qdot``;
- velocity: ``kd (command - qdot)``;

every one limited to the actuator's range (``ctrlrange`` x gear, else ``forcerange``).

Quaternions in every sample are (x, y, z, w), as geometry_msgs has them; MuJoCo's own are
(w, x, y, z).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np

from unilab_ros.robot.samples import ImuSample, JointStateSample, OdometrySample, PoseSample
from unilab_ros.sims.mujoco_config import RobotConfig

MODELS_DIR = Path(__file__).resolve().parent / "models"
HOME_KEYFRAME = "home"
GYMNASIUM_PREFIX = "gymnasium:"
"""A model named ``gymnasium:<file>`` is one of Gymnasium's MuJoCo assets."""
_MOVING_JOINTS = (int(mujoco.mjtJoint.mjJNT_HINGE), int(mujoco.mjtJoint.mjJNT_SLIDE))


class WorldConfigError(ValueError):
    """The model and the configuration do not fit (a missing joint, site or body...)."""


def model_path(model: str) -> Path:
    """A shipped model's name (``cartpole.xml``), one of Gymnasium's MuJoCo assets
    (``gymnasium:hopper.xml``) or a path, as a path that exists."""
    if model.startswith(GYMNASIUM_PREFIX):
        name = model[len(GYMNASIUM_PREFIX):]
        spec = importlib.util.find_spec("gymnasium")
        folders = [Path(p) / "envs" / "mujoco" / "assets"
                   for p in (spec.submodule_search_locations or [])] if spec else []
        path = next((f / name for f in folders if (f / name).is_file()), None)
        if path is None:
            found = sorted(p.name for f in folders for p in f.glob("*.xml"))
            raise WorldConfigError(f"model {model!r}: Gymnasium has no such asset "
                                   f"(it has {found or 'none: is gymnasium installed?'})")
        return path
    shipped = MODELS_DIR / model
    path = shipped if shipped.is_file() else Path(model).expanduser()
    if not path.is_file():
        shipped_names = sorted(p.name for p in MODELS_DIR.glob("*.xml"))
        raise WorldConfigError(f"model {model!r} is neither a file nor one of {shipped_names}"
                               f" (or {GYMNASIUM_PREFIX}<asset>.xml)")
    return path


@dataclass(frozen=True)
class CommandResult:
    """What became of one command."""

    accepted: bool
    """False: wrong size, refused and counted; the held command is unchanged."""
    reason: str = ""
    nonfinite: int = 0
    """NaN / Inf entries: those joints keep their previous command."""
    clipped: int = 0
    """Entries clipped to the command range."""


@dataclass
class RobotCounters:
    """Bad commands of one robot (none of them stops the world)."""

    rejected_commands: int = 0
    nonfinite_entries: int = 0
    clipped_entries: int = 0
    resets: int = 0


def _xyzw(wxyz: np.ndarray) -> np.ndarray:
    return np.array([wxyz[1], wxyz[2], wxyz[3], wxyz[0]])


def _per_joint(values: list[float], count: int, name: str) -> np.ndarray:
    if len(values) == 1:
        return np.full(count, float(values[0]))
    if len(values) != count:
        raise WorldConfigError(f"{name} needs 1 or {count} values (one per joint), "
                               f"got {len(values)}")
    return np.asarray(values, dtype=float)


class MujocoWorld:
    """``num_robots`` copies of one MJCF robot, stepped together one tick at a time."""

    def __init__(self, path: Path, num_robots: int, config: RobotConfig,
                 update_rate: float, seed: int = 0) -> None:
        try:
            self.model = mujoco.MjModel.from_xml_path(str(path))
        except ValueError as error:
            raise WorldConfigError(f"cannot load {path}: {error}") from None
        model = self.model
        self.config = config
        self.timestep = float(model.opt.timestep)
        steps = 1.0 / (update_rate * self.timestep)
        self.steps_per_tick = round(steps)
        if self.steps_per_tick < 1 or abs(steps - self.steps_per_tick) > 1e-6:
            raise WorldConfigError(
                f"update_rate {update_rate:g} Hz is not a whole number of model timesteps "
                f"({self.timestep:g} s): 1 / (update_rate x timestep) = {steps:.4g}")
        self.tick_ns = self.steps_per_tick * round(self.timestep * 1e9)
        self.time_ns = 0
        self.num_robots = num_robots
        self.data = [mujoco.MjData(model) for _ in range(num_robots)]
        self.counters = [RobotCounters() for _ in range(num_robots)]
        self._reset_rngs = [np.random.default_rng([seed, k, 0]) for k in range(num_robots)]
        self._noise_rngs = [np.random.default_rng([seed, k, 1]) for k in range(num_robots)]
        self._fresh = [False] * num_robots

        self._setup_joints(config, seed)
        self._setup_commands(config)
        self._imu_site = self._find(mujoco.mjtObj.mjOBJ_SITE, config.imu.site, "imu.site")
        self._odom_body = self._find(mujoco.mjtObj.mjOBJ_BODY, config.odom.body, "odom.body")
        if self._odom_body is not None and not self._has_free_joint(self._odom_body):
            raise WorldConfigError(f"odom.body {config.odom.body!r} has no free joint")
        self.site_ids = {name: self._find(mujoco.mjtObj.mjOBJ_SITE, name, "site_poses.sites")
                         for name in config.site_poses.sites}
        self._setup_reset(config)
        self._held = np.zeros((num_robots, len(self.command_joints)))
        for k in range(num_robots):
            self.reset(k, count=False)
            if config.command.interface == "position":
                # A position controller starts by holding where the joint is, not at 0.
                self._held[k] = self.data[k].qpos[self._command_qpos]
                self.data[k].ctrl[self._command_actuators] = self._held[k]

    # -- set-up ------------------------------------------------------------------------------

    def _find(self, kind: mujoco.mjtObj, name: str, parameter: str) -> int | None:
        if not name:
            return None
        index = mujoco.mj_name2id(self.model, kind, name)
        if index < 0:
            raise WorldConfigError(f"{parameter}: the model has no {kind.name[6:].lower()} "
                                   f"named {name!r}")
        return index

    def _has_free_joint(self, body: int) -> bool:
        start, count = self.model.body_jntadr[body], self.model.body_jntnum[body]
        return any(self.model.jnt_type[j] == int(mujoco.mjtJoint.mjJNT_FREE)
                   for j in range(start, start + count))

    def _joint_id(self, name: str, parameter: str) -> int:
        index = self._find(mujoco.mjtObj.mjOBJ_JOINT, name, parameter)
        if index is None or self.model.jnt_type[index] not in _MOVING_JOINTS:
            raise WorldConfigError(f"{parameter}: {name!r} is not a hinge or slide joint")
        return index

    def _setup_joints(self, config: RobotConfig, seed: int) -> None:
        model = self.model
        self.model_joints = tuple(
            model.joint(j).name for j in range(model.njnt) if model.jnt_type[j] in _MOVING_JOINTS)
        names = list(config.joint_states.joints or self.model_joints)
        if len(set(names)) != len(names):
            raise WorldConfigError(f"joint_states.joints names a joint twice: {names}")
        if config.joint_states.shuffle:
            # The same order for every robot and every run with this seed.
            names = [names[i] for i in np.random.default_rng(seed).permutation(len(names))]
        ids = [self._joint_id(name, "joint_states.joints") for name in names]
        self.joint_names = tuple(names)
        self._state_qpos = model.jnt_qposadr[ids]
        self._state_dof = model.jnt_dofadr[ids]

    def _setup_commands(self, config: RobotConfig) -> None:
        model, command = self.model, config.command
        by_joint: dict[int, int] = {}
        for a in range(model.nu):
            if model.actuator_trntype[a] == int(mujoco.mjtTrn.mjTRN_JOINT):
                by_joint.setdefault(int(model.actuator_trnid[a, 0]), a)
        names = list(command.joints) or [model.joint(j).name for j in by_joint]
        ids = [self._joint_id(name, "command.joints") for name in names]
        missing = [name for name, j in zip(names, ids, strict=True) if j not in by_joint]
        if missing:
            raise WorldConfigError(f"command.joints: no actuator drives {missing}")
        self.command_joints = tuple(names)
        actuators = np.array([by_joint[j] for j in ids], dtype=int)
        count = len(ids)
        kp = _per_joint(command.kp, count, "command.kp")
        kd = _per_joint(command.kd, count, "command.kd")
        velocity_limit = _per_joint(command.velocity_limit, count, "command.velocity_limit")
        effort_low, effort_high = np.empty(count), np.empty(count)
        for i, a in enumerate(actuators):
            if (model.actuator_gaintype[a] != int(mujoco.mjtGain.mjGAIN_FIXED)
                    or model.actuator_biastype[a] != int(mujoco.mjtBias.mjBIAS_NONE)
                    or model.actuator_dyntype[a] != int(mujoco.mjtDyn.mjDYN_NONE)):
                raise WorldConfigError(f"actuator {model.actuator(a).name!r} of joint "
                                       f"{names[i]!r} must be a plain <motor>")
            gear = model.actuator_gear[a, 0] * model.actuator_gainprm[a, 0]
            if model.actuator_ctrllimited[a]:
                low, high = sorted(model.actuator_ctrlrange[a] * gear)
            elif model.actuator_forcelimited[a]:
                low, high = model.actuator_forcerange[a]
            else:
                low, high = -np.inf, np.inf
            effort_low[i], effort_high[i] = low, high
            # The actuator now outputs joint torque: gain x ctrl + bias, limited to the effort.
            model.actuator_gear[a] = [1.0, 0, 0, 0, 0, 0]
            model.actuator_ctrllimited[a] = 0
            model.actuator_forcelimited[a] = int(np.isfinite([low, high]).all())
            model.actuator_forcerange[a] = [low, high] if np.isfinite([low, high]).all() \
                else [0.0, 0.0]
            model.actuator_biastype[a] = int(mujoco.mjtBias.mjBIAS_AFFINE)
            gain, bias = {"effort": (1.0, [0.0, 0.0, 0.0]),
                          "position": (kp[i], [0.0, -kp[i], -kd[i]]),
                          "velocity": (kd[i], [0.0, 0.0, -kd[i]])}[command.interface]
            model.actuator_gainprm[a, :3] = [gain, 0.0, 0.0]
            model.actuator_biasprm[a, :3] = bias
        self._command_actuators = actuators
        self._command_qpos = model.jnt_qposadr[ids]
        if command.interface == "effort":
            self.command_low, self.command_high = effort_low, effort_high
        elif command.interface == "position":
            limited = model.jnt_limited[ids].astype(bool)
            self.command_low = np.where(limited, model.jnt_range[ids, 0], -np.inf)
            self.command_high = np.where(limited, model.jnt_range[ids, 1], np.inf)
        else:
            limit = np.where(velocity_limit > 0.0, velocity_limit, np.inf)
            self.command_low, self.command_high = -limit, limit
        self.effort_low, self.effort_high = effort_low, effort_high

    def _setup_reset(self, config: RobotConfig) -> None:
        model = self.model
        ids = [self._joint_id(name, "reset") for name in self.model_joints]
        count = len(ids)
        self._reset_qpos = model.jnt_qposadr[ids]
        self._reset_dof = model.jnt_dofadr[ids]
        self._position_range = _per_joint(config.reset.position_range, count,
                                          "reset.position_range")
        self._velocity_range = _per_joint(config.reset.velocity_range, count,
                                          "reset.velocity_range")
        limited = model.jnt_limited[ids].astype(bool)
        self._joint_low = np.where(limited, model.jnt_range[ids, 0], -np.inf)
        self._joint_high = np.where(limited, model.jnt_range[ids, 1], np.inf)
        self._mocap_range = np.asarray(config.reset.mocap_position_range, dtype=float)
        self._base_range = np.asarray(config.reset.base_position_range, dtype=float)
        self._base_yaw_range = config.reset.base_yaw_range
        self._base_qpos = [int(model.jnt_qposadr[j]) for j in range(model.njnt)
                           if model.jnt_type[j] == int(mujoco.mjtJoint.mjJNT_FREE)]
        self._home_key = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_KEY, HOME_KEYFRAME)

    # -- stepping and commands -----------------------------------------------------------

    @property
    def time(self) -> float:
        """Sim seconds since the start (never reset)."""
        return self.time_ns * 1e-9

    def step(self) -> None:
        """Advance every robot by one tick, holding each one's last command."""
        for data in self.data:
            mujoco.mj_step(self.model, data, nstep=self.steps_per_tick)
        self.time_ns += self.tick_ns
        self._fresh = [False] * self.num_robots

    def set_command(self, robot: int, values: np.ndarray) -> CommandResult:
        """Hold ``values`` (one per command joint) from now on, as a forward controller."""
        counters = self.counters[robot]
        values = np.asarray(values, dtype=float).reshape(-1)
        if values.size != len(self.command_joints):
            counters.rejected_commands += 1
            return CommandResult(False, f"expected {len(self.command_joints)} values "
                                        f"({', '.join(self.command_joints)}), got {values.size}")
        finite = np.isfinite(values)
        command = np.where(finite, values, self._held[robot])
        clipped = np.clip(command, self.command_low, self.command_high)
        changed = int(np.count_nonzero(clipped != command))
        self._held[robot] = clipped
        self.data[robot].ctrl[self._command_actuators] = clipped
        counters.nonfinite_entries += int(finite.size - np.count_nonzero(finite))
        counters.clipped_entries += changed
        return CommandResult(True, nonfinite=int(finite.size - np.count_nonzero(finite)),
                             clipped=changed)

    def held_command(self, robot: int) -> np.ndarray:
        return self._held[robot].copy()

    def reset(self, robot: int, count: bool = True) -> None:
        """A new initial state within the reset ranges; the held command stays (as Gazebo's
        reset_world leaves ros2_control's controllers alone)."""
        model, data, rng = self.model, self.data[robot], self._reset_rngs[robot]
        if self._home_key >= 0:
            mujoco.mj_resetDataKeyframe(model, data, self._home_key)
        else:
            mujoco.mj_resetData(model, data)
        data.qpos[self._reset_qpos] = np.clip(
            data.qpos[self._reset_qpos]
            + rng.uniform(-self._position_range, self._position_range),
            self._joint_low, self._joint_high)
        data.qvel[self._reset_dof] += rng.uniform(-self._velocity_range, self._velocity_range)
        if model.nmocap:
            data.mocap_pos += rng.uniform(-self._mocap_range, self._mocap_range,
                                          size=data.mocap_pos.shape)
        for adr in self._base_qpos:
            data.qpos[adr:adr + 3] += rng.uniform(-self._base_range, self._base_range)
            yaw = rng.uniform(-self._base_yaw_range, self._base_yaw_range)
            turn, turned = np.array([np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2)]), np.empty(4)
            # Turn about the world's z: the turn multiplies from the left (w, x, y, z).
            mujoco.mju_mulQuat(turned, turn, data.qpos[adr + 3:adr + 7])
            data.qpos[adr + 3:adr + 7] = turned
        data.ctrl[self._command_actuators] = self._held[robot]
        data.time = self.time
        self._fresh[robot] = False
        if count:
            self.counters[robot].resets += 1

    # -- samples -------------------------------------------------------------------------

    def _forward(self, robot: int) -> mujoco.MjData:
        """Bring positions, velocities, accelerations and forces up to the current state.

        After mj_step they describe the state before the last step; mj_forward leaves the
        state (and the solver's warm start) as it is, so the trajectory does not change.
        """
        data = self.data[robot]
        if not self._fresh[robot]:
            mujoco.mj_forward(self.model, data)
            if self._imu_site is not None:
                mujoco.mj_rnePostConstraint(self.model, data)
            self._fresh[robot] = True
        return data

    def joint_state(self, robot: int) -> JointStateSample:
        data = self._forward(robot)
        return JointStateSample(self.joint_names, data.qpos[self._state_qpos].copy(),
                                data.qvel[self._state_dof].copy(),
                                data.qfrc_actuator[self._state_dof].copy())

    @property
    def has_imu(self) -> bool:
        return self._imu_site is not None

    @property
    def has_odometry(self) -> bool:
        return self._odom_body is not None

    def imu(self, robot: int) -> ImuSample:
        if self._imu_site is None:
            raise WorldConfigError("no imu.site configured")
        data, site, cfg = self._forward(robot), self._imu_site, self.config.imu
        quat = np.empty(4)
        mujoco.mju_mat2Quat(quat, data.site_xmat[site])
        velocity, acceleration = np.empty(6), np.empty(6)
        mujoco.mj_objectVelocity(self.model, data, mujoco.mjtObj.mjOBJ_SITE, site, velocity, 1)
        # MuJoCo accelerates the world body by -gravity, so this is what an accelerometer
        # reads: +g upwards at rest, zero in free fall.
        mujoco.mj_objectAcceleration(self.model, data, mujoco.mjtObj.mjOBJ_SITE, site,
                                     acceleration, 1)
        angular, linear = velocity[:3], acceleration[3:]
        rng = self._noise_rngs[robot]
        if cfg.orientation_noise > 0.0:
            mujoco.mju_quatIntegrate(quat, rng.normal(0.0, cfg.orientation_noise, 3), 1.0)
        if cfg.angular_velocity_noise > 0.0:
            angular = angular + rng.normal(0.0, cfg.angular_velocity_noise, 3)
        if cfg.linear_acceleration_noise > 0.0:
            linear = linear + rng.normal(0.0, cfg.linear_acceleration_noise, 3)
        return ImuSample(_xyzw(quat), angular, linear)

    def odometry(self, robot: int) -> OdometrySample:
        if self._odom_body is None:
            raise WorldConfigError("no odom.body configured")
        data, body = self._forward(robot), self._odom_body
        velocity = np.empty(6)
        mujoco.mj_objectVelocity(self.model, data, mujoco.mjtObj.mjOBJ_BODY, body, velocity, 1)
        return OdometrySample(data.xpos[body].copy(), _xyzw(data.xquat[body]),
                              velocity[3:].copy(), velocity[:3].copy())

    def site_pose(self, robot: int, site: str) -> PoseSample:
        data, index = self._forward(robot), self.site_ids[site]
        quat = np.empty(4)
        mujoco.mju_mat2Quat(quat, data.site_xmat[index])
        return PoseSample(data.site_xpos[index].copy(), _xyzw(quat))
