"""The trainer node and what it is built from.

``session`` builds the agent and its training loop from configs (ROS-free, shared with
the in-process run); ``artifacts`` writes the run's files (checkpoints, latest, best,
bundles, metrics); ``reports`` says what happens (progress line, status, diagnostics);
``messages_in`` takes messages in; ``node`` only wires ROS. ``python -m
unilab_ros.trainer`` runs the node.
"""
