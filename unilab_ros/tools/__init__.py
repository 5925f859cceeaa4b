"""The user's commands: ``sim_train`` (bridge + trainer as two processes, the main job),
``demo`` (in-process training, no ROS graph) and ``plot`` (a run's curves)."""
