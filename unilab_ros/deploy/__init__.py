"""Deployment: the policy node (``policy_node``), its control of a robot spec's robot
(``spec_control``) and the export_bundle command (checkpoint -> bundle, + ONNX)."""
