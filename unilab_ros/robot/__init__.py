"""The robot spec, ROS-free: one definition of a robot's observation, reward, terminations and
action mapping (``spec``), the terms it names (``*_terms``), the observation pipeline
(``observation``), the action mapping (``actions``) and the clocked step source that the
training loop reads (``steps``). Messages come in already decoded (``samples``); arrays go out.
"""
