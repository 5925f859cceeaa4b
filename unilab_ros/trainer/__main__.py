"""``python -m unilab_ros.trainer``: the trainer node (``trainer_node``)."""

from unilab_ros.trainer.node import main

main()
