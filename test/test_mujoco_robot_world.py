"""MujocoWorld without ROS: physics against closed forms, sensor frames, commands, resets.

Small MJCF models written here isolate one effect each (a pendulum, a falling body, a
rotated IMU); the shipped robots are checked for what the node relies on.
"""

import json
import math
import subprocess
import sys

import mujoco
import numpy as np
import pytest

from unilab_ros.sims.mujoco_config import (
    CommandConfig,
    ImuConfig,
    JointStatesConfig,
    OdomConfig,
    ResetConfig,
    RobotConfig,
    SitePosesConfig,
)
from unilab_ros.sims.mujoco_world import MujocoWorld, WorldConfigError, model_path
from unilab_ros.sims.pacing import Every, Pacer

G = 9.81
HALF = math.sqrt(0.5)

PENDULUM = """
<mujoco>
  <option timestep="0.0005" integrator="RK4" gravity="0 0 -9.81"/>
  <worldbody>
    <body name="bob" pos="0 0 1">
      <joint name="swing" type="hinge" axis="0 1 0"/>
      <geom type="sphere" pos="0 0 -0.5" size="0.02" mass="1.0"/>
    </body>
  </worldbody>
</mujoco>
"""

FREE_BODY = """
<mujoco>
  <option timestep="0.001" integrator="RK4" gravity="0 0 {gravity}"/>
  <worldbody>
    <body name="base" pos="0 0 10" quat="{quat}">
      <freejoint name="base"/>
      <geom type="box" size="0.1 0.1 0.1" mass="1.0" contype="0" conaffinity="0"/>
      <site name="imu"/>
    </body>
  </worldbody>
</mujoco>
"""

SPINNING_IMU = """
<mujoco>
  <option timestep="0.001" integrator="RK4"/>
  <worldbody>
    <body name="turntable">
      <joint name="spin" type="hinge" axis="0 0 1"/>
      <geom type="cylinder" size="0.1 0.01" mass="1.0"/>
      <!-- 90 degrees about x: the sensor's y axis points up, its z axis along world -y. -->
      <site name="imu" quat="0.7071067811865476 0.7071067811865476 0 0"/>
    </body>
  </worldbody>
</mujoco>
"""


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


def shipped(name: str, config: RobotConfig, num_robots: int = 1, seed: int = 0,
            update_rate: float = 250.0) -> MujocoWorld:
    return MujocoWorld(model_path(name), num_robots, config, update_rate, seed)


def quadruped_config(**command) -> RobotConfig:
    return RobotConfig(imu=ImuConfig(site="imu"), odom=OdomConfig(body="torso"),
                       command=CommandConfig(controller="position_controller",
                                             interface="position",
                                             **{"kp": [20.0], "kd": [0.5], **command}))


def test_a_pendulum_swings_with_its_small_angle_period(tmp_path):
    world = MujocoWorld(write(tmp_path, "pendulum.xml", PENDULUM), 1, RobotConfig(), 1000.0)
    model, data = world.model, world.data[0]
    # The physical pendulum: T = 2 pi sqrt(I_pivot / (m g d)), I_pivot = I_cm + m d^2.
    body = model.body("bob").id
    mass, d = model.body_mass[body], 0.5
    inertia = model.body_inertia[body][1] + mass * d**2
    expected = 2 * math.pi * math.sqrt(inertia / (mass * G * d))
    data.qpos[0] = 0.02
    angles, times = [], []
    while world.time < 3.5 * expected:
        world.step()
        angles.append(data.qpos[0])
        times.append(world.time)
    angles = np.array(angles)
    # Upward zero crossings, interpolated between ticks.
    up = np.flatnonzero((angles[:-1] < 0) & (angles[1:] >= 0))
    crossings = [times[i] + (times[i + 1] - times[i]) * -angles[i] / (angles[i + 1] - angles[i])
                 for i in up]
    assert len(crossings) >= 3
    measured = np.diff(crossings).mean()
    assert measured == pytest.approx(expected, rel=1e-3)


def test_a_free_body_falls_as_z0_minus_half_g_t_squared(tmp_path):
    path = write(tmp_path, "fall.xml", FREE_BODY.format(gravity=-G, quat="1 0 0 0"))
    world = MujocoWorld(path, 1, RobotConfig(imu=ImuConfig(site="imu"),
                                             odom=OdomConfig(body="base")), 100.0)
    while world.time < 1.0 - 1e-9:
        world.step()
    odometry = world.odometry(0)
    assert world.time == pytest.approx(1.0)
    assert odometry.position[2] == pytest.approx(10.0 - G / 2, abs=1e-6)
    assert odometry.linear == pytest.approx([0.0, 0.0, -G], abs=1e-6)
    # An accelerometer in free fall reads nothing.
    assert world.imu(0).linear_acceleration == pytest.approx([0.0, 0.0, 0.0], abs=1e-6)


def test_imu_orientation_is_xyzw_and_rates_are_in_the_sensor_frame(tmp_path):
    world = MujocoWorld(write(tmp_path, "spin.xml", SPINNING_IMU), 1,
                        RobotConfig(imu=ImuConfig(site="imu")), 100.0)
    assert world.imu(0).orientation_xyzw == pytest.approx([HALF, 0.0, 0.0, HALF])
    omega = 2.0
    world.data[0].qvel[0] = omega
    for _ in range(25):
        world.step()
    imu = world.imu(0)
    theta = omega * world.time
    # Rz(theta) Rx(90deg) in (x, y, z, w).
    expected = [HALF * math.cos(theta / 2), HALF * math.sin(theta / 2),
                HALF * math.sin(theta / 2), HALF * math.cos(theta / 2)]
    assert imu.orientation_xyzw == pytest.approx(expected, abs=1e-6)
    # The spin axis (world z) is the sensor's y axis; so is "up", which it measures.
    assert imu.angular_velocity == pytest.approx([0.0, omega, 0.0], abs=1e-9)
    assert imu.linear_acceleration == pytest.approx([0.0, G, 0.0], abs=1e-6)


def test_odometry_twist_is_in_the_child_frame(tmp_path):
    # Yawed 90 degrees: the body's x axis is world y, its y axis world -x.
    path = write(tmp_path, "yawed.xml", FREE_BODY.format(gravity=0.0,
                                                         quat=f"{HALF} 0 0 {HALF}"))
    world = MujocoWorld(path, 1, RobotConfig(odom=OdomConfig(body="base")), 100.0)
    world.data[0].qvel[:3] = [1.0, 0.0, 0.0]  # world frame
    world.data[0].qvel[3:] = [0.0, 0.0, 0.5]  # body frame (MuJoCo's free joint)
    world.step()  # 10 ms: the yaw is now 90 degrees + 5 mrad
    odometry = world.odometry(0)
    yaw = math.pi / 2 + 0.5 * world.time
    assert odometry.orientation_xyzw == pytest.approx(
        [0.0, 0.0, math.sin(yaw / 2), math.cos(yaw / 2)], abs=1e-9)
    # World x seen from the body: (cos yaw, -sin yaw), about (0, -1).
    assert odometry.linear == pytest.approx([math.cos(yaw), -math.sin(yaw), 0.0],
                                                     abs=1e-9)
    assert odometry.angular == pytest.approx([0.0, 0.0, 0.5], abs=1e-9)
    assert odometry.position[:2] == pytest.approx([0.01, 0.0], abs=1e-9)


def test_the_world_reads_out_the_robot_specs_sample_types():
    """The simulator once had its own JointSample/ImuSample/OdometrySample/PoseSample with
    other field names, translated in spec_env: one set of sample types now, unstamped."""
    from unilab_ros.robot import samples

    config = quadruped_config()
    config.site_poses = SitePosesConfig(sites=["imu"])
    world = shipped("quadruped.xml", config)
    for sample, kind in ((world.joint_state(0), samples.JointStateSample),
                         (world.imu(0), samples.ImuSample),
                         (world.odometry(0), samples.OdometrySample),
                         (world.site_pose(0, "imu"), samples.PoseSample)):
        assert type(sample) is kind and sample.stamp is None


def test_the_quadruped_stands_on_its_position_controller_with_gravity_up_in_its_imu():
    world = shipped("quadruped.xml", quadruped_config())
    for _ in range(500):
        world.step()
    assert world.odometry(0).position[2] == pytest.approx(0.215, abs=0.01)
    assert world.imu(0).linear_acceleration == pytest.approx([0.0, 0.0, G], abs=0.05)
    assert world.joint_state(0).position == pytest.approx(world.held_command(0), abs=0.03)


def test_joint_states_follow_the_configured_order_and_a_shuffled_one():
    names = ["hinge", "slider"]
    world = shipped("cartpole.xml", RobotConfig(joint_states=JointStatesConfig(joints=names)))
    world.data[0].qpos[:] = [0.3, -0.2]  # model order: slider, hinge
    world.data[0].qvel[:] = [1.0, 2.0]
    sample = world.joint_state(0)
    assert sample.names == ("hinge", "slider")
    assert list(sample.position) == [-0.2, 0.3] and list(sample.velocity) == [2.0, 1.0]

    shuffled = shipped("quadruped.xml", RobotConfig(
        joint_states=JointStatesConfig(shuffle=True), command=CommandConfig()), seed=3)
    model_order = shuffled.model_joints
    assert sorted(shuffled.joint_names) == sorted(model_order)
    assert shuffled.joint_names != model_order
    state = shuffled.joint_state(0)
    for name, position in zip(state.names, state.position, strict=True):
        assert position == shuffled.data[0].qpos[shuffled.model.joint(name).qposadr[0]]


def test_a_command_of_the_wrong_size_is_refused_and_counted():
    world = shipped("reacher.xml", RobotConfig())
    assert world.set_command(0, np.array([0.01, -0.01])).accepted
    result = world.set_command(0, np.array([1.0, 2.0, 3.0]))
    assert not result.accepted and "expected 2 values (shoulder, elbow), got 3" in result.reason
    assert not world.set_command(0, np.array([])).accepted
    assert world.counters[0].rejected_commands == 2
    assert list(world.held_command(0)) == [0.01, -0.01]


def test_nan_entries_keep_the_previous_command_and_values_are_clipped():
    world = shipped("reacher.xml", RobotConfig())
    world.set_command(0, np.array([0.02, -0.03]))
    result = world.set_command(0, np.array([np.nan, 1.0]))
    assert result.accepted and result.nonfinite == 1 and result.clipped == 1
    assert list(world.held_command(0)) == [0.02, 0.05]
    world.set_command(0, np.array([np.inf, -np.inf]))
    assert list(world.held_command(0)) == [0.02, 0.05]
    assert world.counters[0].nonfinite_entries == 3
    for _ in range(10):
        world.step()
    # The held torque is what the joints feel, tick after tick.
    assert world.joint_state(0).effort == pytest.approx([0.02, 0.05])


def test_the_position_interface_is_a_pd_law_limited_to_the_actuator_range():
    world = shipped("quadruped.xml", quadruped_config(kp=[10.0], kd=[0.2]))
    target = world.held_command(0) + 0.1
    world.set_command(0, target)
    world.step()
    state = world.joint_state(0)
    order = [world.joint_names.index(name) for name in world.command_joints]
    q, qd, effort = state.position[order], state.velocity[order], state.effort[order]
    pd = 10.0 * (target - q) - 0.2 * qd
    assert effort == pytest.approx(np.clip(pd, -5.0, 5.0), abs=1e-9)
    # Beyond the joint range the target is clipped to it (knees: -2.4 .. 0).
    world.set_command(0, np.full(8, 9.0))
    assert list(world.held_command(0)) == [1.2, 0.0] * 4


def test_the_velocity_interface_drives_towards_the_commanded_velocity():
    config = RobotConfig(command=CommandConfig(interface="velocity", kd=[2.0],
                                               velocity_limit=[1.5]))
    world = shipped("reacher.xml", config)
    world.set_command(0, np.array([5.0, -0.2]))
    assert list(world.held_command(0)) == [1.5, -0.2]
    world.step()
    state = world.joint_state(0)
    expected = np.clip(2.0 * (np.array([1.5, -0.2]) - state.velocity), -0.05, 0.05)
    assert state.effort == pytest.approx(expected, abs=1e-9)


def test_reset_draws_the_start_within_the_ranges_and_keeps_the_command():
    config = RobotConfig(command=CommandConfig(joints=["slider"]),
                         reset=ResetConfig(position_range=[0.1, 0.05],
                                           velocity_range=[0.0, 0.2]))
    world = shipped("cartpole.xml", config, num_robots=3, seed=7)
    starts = np.array([world.data[k].qpos.copy() for k in range(3)])
    assert np.all(np.abs(starts) <= [0.1, 0.05]) and len({tuple(s) for s in starts}) == 3
    world.set_command(1, np.array([3.0]))
    for _ in range(50):
        world.step()
    world.reset(1)
    data = world.data[1]
    assert np.all(np.abs(data.qpos) <= [0.1, 0.05]) and data.qvel[0] == 0.0
    assert abs(data.qvel[1]) <= 0.2
    assert list(world.held_command(1)) == [3.0] and data.ctrl[0] == 3.0
    assert world.counters[1].resets == 1 and world.counters[0].resets == 0
    again = shipped("cartpole.xml", config, num_robots=3, seed=7)
    assert np.array_equal(starts, [again.data[k].qpos for k in range(3)]), "seeded"


def test_the_reacher_target_moves_within_its_range_on_reset():
    config = RobotConfig(site_poses=SitePosesConfig(sites=["fingertip", "target"]),
                         reset=ResetConfig(mocap_position_range=[0.08, 0.08, 0.0]))
    world = shipped("reacher.xml", config, seed=1)
    targets = []
    for _ in range(5):
        world.reset(0)
        targets.append(world.site_pose(0, "target").position)
    targets = np.array(targets)
    assert np.all(np.abs(targets[:, :2] - [0.1, 0.0]) <= 0.08)
    assert np.all(targets[:, 2] == pytest.approx(0.01)) and len(np.unique(targets[:, 0])) == 5
    tip = world.site_pose(0, "fingertip")
    shoulder, elbow = world.data[0].qpos
    assert tip.position[:2] == pytest.approx(
        [0.1 * math.cos(shoulder) + 0.11 * math.cos(shoulder + elbow),
         0.1 * math.sin(shoulder) + 0.11 * math.sin(shoulder + elbow)], abs=1e-9)


def test_a_floating_base_starts_within_its_position_and_yaw_ranges():
    config = quadruped_config()
    config.reset = ResetConfig(base_position_range=[0.5, 0.2, 0.0], base_yaw_range=1.0)
    world = shipped("quadruped.xml", config, num_robots=8, seed=2)
    poses = [world.odometry(k) for k in range(8)]
    positions = np.array([pose.position for pose in poses])
    assert np.all(np.abs(positions[:, :2]) <= [0.5, 0.2]) and positions[:, 0].std() > 0.1
    assert positions[:, 2] == pytest.approx([0.22] * 8)
    for pose in poses:
        x, y, z, w = pose.orientation_xyzw
        assert (x, y) == pytest.approx((0.0, 0.0), abs=1e-12), "a turn about z only"
        assert abs(2 * math.atan2(z, w)) <= 1.0
    assert len({round(pose.orientation_xyzw[2], 9) for pose in poses}) == 8


def test_robots_of_one_world_never_touch():
    world = shipped("cartpole.xml", RobotConfig(), num_robots=2)
    world.set_command(0, np.array([20.0]))
    for _ in range(100):
        world.step()
    assert world.data[0].qpos[0] > 0.3
    assert world.data[1].qpos[0] == 0.0 and world.held_command(1)[0] == 0.0


def test_imu_noise_has_the_configured_spread():
    config = quadruped_config()
    config.imu = ImuConfig(site="imu", angular_velocity_noise=0.1,
                           linear_acceleration_noise=0.5)
    world = shipped("quadruped.xml", config)
    gyro = np.array([world.imu(0).angular_velocity for _ in range(2000)])
    accel = np.array([world.imu(0).linear_acceleration for _ in range(2000)])
    assert gyro.std(axis=0) == pytest.approx([0.1] * 3, rel=0.1)
    assert accel.std(axis=0) == pytest.approx([0.5] * 3, rel=0.1)


@pytest.mark.parametrize(("config", "message"), [
    (RobotConfig(command=CommandConfig(joints=["knee"])), "no joint named 'knee'"),
    (RobotConfig(command=CommandConfig(joints=["hinge"])), "no actuator drives ['hinge']"),
    (RobotConfig(joint_states=JointStatesConfig(joints=["slider", "slider"])), "twice"),
    (RobotConfig(imu=ImuConfig(site="imu")), "no site named 'imu'"),
    (RobotConfig(odom=OdomConfig(body="cart")), "has no free joint"),
    (RobotConfig(command=CommandConfig(kp=[1.0, 2.0])), "command.kp needs 1 or 1 values"),
])
def test_a_config_that_does_not_fit_the_model_names_the_problem(config, message):
    with pytest.raises(WorldConfigError) as error:
        shipped("cartpole.xml", config)
    assert message in str(error.value)


def test_a_tick_must_be_a_whole_number_of_timesteps_and_the_model_must_exist(tmp_path):
    with pytest.raises(WorldConfigError, match="whole number"):
        shipped("cartpole.xml", RobotConfig(), update_rate=200.0)
    with pytest.raises(WorldConfigError, match="neither a file nor one of"):
        model_path("no_such_robot.xml")
    broken = write(tmp_path, "broken.xml", "<mujoco><worldbody><body>")
    with pytest.raises(WorldConfigError, match="cannot load"):
        MujocoWorld(broken, 1, RobotConfig(), 100.0)


def test_gymnasium_assets_load_by_name():
    # Its timestep is 20 ms: 50 ticks a second.
    world = MujocoWorld(model_path("gymnasium:inverted_pendulum.xml"), 1,
                        RobotConfig(), 50.0)
    assert world.model_joints == ("slider", "hinge") and world.command_joints == ("slider",)
    # Its motor has gear 100 on a +-3 control: the effort command is the force, +-300 N.
    world.set_command(0, np.array([1000.0]))
    world.step()
    assert world.joint_state(0).effort[0] == pytest.approx(300.0)
    with pytest.raises(WorldConfigError, match="Gymnasium has no such asset"):
        model_path("gymnasium:robot_dog.xml")


def test_only_plain_motors_can_take_an_interface(tmp_path):
    model = write(tmp_path, "servo.xml", """
<mujoco><worldbody><body><joint name="j" type="hinge"/><geom size="0.1"/></body></worldbody>
<actuator><position joint="j" kp="10"/></actuator></mujoco>""")
    with pytest.raises(WorldConfigError, match="must be a plain <motor>"):
        MujocoWorld(model, 1, RobotConfig(), 500.0)


def test_sim_time_counts_whole_ticks_in_nanoseconds():
    world = shipped("cartpole.xml", RobotConfig(), update_rate=100.0)
    assert world.steps_per_tick == 5 and world.tick_ns == 10_000_000
    for _ in range(1000):
        world.step()
    assert world.time_ns == 10_000_000_000
    assert world.data[0].time == pytest.approx(10.0)
    assert mujoco.mj_name2id(world.model, mujoco.mjtObj.mjOBJ_SITE, "tip") >= 0


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_pacer_holds_the_pace_on_average_and_reanchors_when_far_behind():
    clock = FakeClock()
    pacer = Pacer(2.0, max_lag=0.25, clock=clock)
    pacer.anchor(10.0)
    assert pacer.delay(11.0) == pytest.approx(0.5)
    clock.now += 0.6  # overslept by 0.1 s: the next tick is due sooner, not later
    assert pacer.delay(11.2) == pytest.approx(0.0)
    assert pacer.delay(11.4) == pytest.approx(0.1)
    clock.now += 5.0
    assert pacer.delay(11.6) == 0.0 and pacer.late == 1
    assert pacer.delay(11.8) == pytest.approx(0.1), "re-anchored at 11.6"
    assert Pacer(0.0, clock=clock).delay(1e6) == 0.0, "0: as fast as it can"


def test_every_marks_ticks_at_its_rate():
    every = Every(100.0)
    ticks = [t * 4_000_000 for t in range(250)]  # 250 Hz for one second
    assert sum(every.due(t) for t in ticks) == 100
    coarse = Every(1000.0)
    assert sum(coarse.due(t) for t in ticks) == 250, "never more than once a tick"


def test_the_world_imports_no_ros_module():
    # A fresh interpreter: this one may hold rclpy from other tests.
    code = ("import json, sys\n"
            "import unilab_ros.sims.mujoco_world, unilab_ros.sims.pacing\n"
            "print(json.dumps(sorted(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    modules = json.loads(result.stdout.strip().splitlines()[-1])
    assert "unilab_ros.sims.mujoco_config" in modules
    assert [m for m in modules if m.startswith(("rclpy", "std_msgs", "rosidl", "sensor_msgs"))
            ] == []
