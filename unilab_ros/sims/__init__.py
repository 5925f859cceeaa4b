"""Environments the package ships: the MuJoCo robot node (a free-running, Gazebo-like
simulator speaking standard ROS 2 messages) and its ROS-free world."""
