"""The trainer's decisions, ROS-free: arrays and times in, decisions out.

``training_loop.TrainingLoop`` decides for one robot or a fleet; each robot's steps come
from a step source (``step_sync.StepSync`` pairs the topic contract's observation, reward
and done by arrival); ``action_safety`` and ``watchdog`` are shared with the policy node.
"""
