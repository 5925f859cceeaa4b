"""The ROS side shared by the nodes: parameters from config dataclasses (``params``), QoS,
messages <-> arrays (``messages``), executors, the core's log records in the ROS log
(``python_logs``), the action publisher (``action_output``), other nodes on the same robot
(``graph_checks``), simulator pause services (``sim_pause``), launch helpers, and a robot
spec's ROS I/O: its messages as samples (``spec_messages``) and its link, the subscriptions,
control timer and reset (``spec_link``). No node lives here."""
