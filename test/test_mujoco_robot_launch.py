"""mujoco_robot.launch.py from a real colcon install: the robot, its namespaces, SIGINT.

Uses test_colcon_build.py's build (into a temporary folder) and its `ros2` environment;
skipped, as there, where the ros2 CLI and launch_ros are not installed.
"""

import os
import signal
import subprocess

import pytest
from test_colcon_build import PACKAGE, _finish, _ros2, install_prefix  # noqa: F401

pytestmark = pytest.mark.ros


def test_the_launch_starts_namespaced_robots_and_stops_on_sigint(install_prefix,  # noqa: F811
                                                                  ros_domain_env):
    ros2, env = _ros2(install_prefix, ros_domain_env)
    launch = subprocess.Popen(
        [ros2, 'launch', PACKAGE, 'mujoco_robot.launch.py', 'robot:=quadruped',
         'num_robots:=2', 'real_time_factor:=2.0'],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        echo = subprocess.run(
            [ros2, 'topic', 'echo', '--no-daemon', '--once', '--timeout', '60',
             '/robot2/imu', 'sensor_msgs/msg/Imu'],
            env=env, capture_output=True, text=True, timeout=90)
        assert 'frame_id: robot2/imu_link' in echo.stdout, echo.stdout + echo.stderr
    finally:
        os.killpg(launch.pid, signal.SIGINT)
        output = _finish(launch, timeout=30.0)
    assert launch.returncode == 0, output[-3000:]
    assert '2 x quadruped.xml' in output and 'real_time_factor 2' in output, output[-3000:]
    assert 'Traceback' not in output, output[-3000:]


def test_an_unknown_robot_stops_the_launch_naming_the_shipped_ones(
        install_prefix, ros_domain_env):  # noqa: F811
    ros2, env = _ros2(install_prefix, ros_domain_env)
    result = subprocess.run([ros2, 'launch', PACKAGE, 'mujoco_robot.launch.py',
                             'robot:=walker'], env=env, capture_output=True, text=True,
                            timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "robot:= one of ['cartpole', 'quadruped', 'reacher']" in output, output[-3000:]
    assert 'mujoco_robot_node' not in output.split('does not exist')[-1], 'no node started'
