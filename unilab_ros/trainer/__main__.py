"""``python -m unilab_ros.trainer``: the trainer node (``trainer_node``)."""

from unilab_ros.trainer.node import main

# Guarded: a learner process (``rl.learner_process``, spawned) imports this module again.
if __name__ == "__main__":
    main()
