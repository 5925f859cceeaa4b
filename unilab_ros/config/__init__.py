"""Parameter files, ROS-free: where the shipped ones live (``paths``), the one reader of
their keys and the dataclasses they fill (``parameter_files``), and the in-process training
setup read from them (``training_setup``)."""
