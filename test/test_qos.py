"""QoS by parameter: a best-effort robot driver (SensorDataQoS) matches nothing by default
and is named as such; ``qos_reliability`` or a ``qos_overrides`` parameter makes it match."""

import numpy as np
import pytest
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import qos_profile_sensor_data
from ros_helpers import spin_until
from std_msgs.msg import Float32MultiArray
from test_sim_pause import TINY_TRAINER, overrides

from unilab_ros.loop.training_loop import Phase
from unilab_ros.ros.messages import to_float32_msg
from unilab_ros.ros.qos import incompatible_publishers
from unilab_ros.trainer.node import TrainerNode

pytestmark = pytest.mark.ros


@pytest.mark.parametrize("qos, heard", [
    ({}, False),
    ({"qos_reliability": "best_effort"}, True),
    ({"qos_overrides./observation.subscription.reliability": "best_effort"}, True),
], ids=["default", "qos_reliability", "qos_overrides"])
def test_a_best_effort_driver_is_named_or_heard(context, tmp_path, qos, heard):
    trainer = TrainerNode(context=context, parameter_overrides=overrides({
        **TINY_TRAINER, "warm_up_update": False, "checkpoint_dir": str(tmp_path), **qos}))
    driver = rclpy.create_node("sensor_driver", context=context)
    publisher = driver.create_publisher(Float32MultiArray, "observation",
                                        qos_profile_sensor_data)
    executor = SingleThreadedExecutor(context=context)
    for node in (trainer, driver):
        executor.add_node(node)
    msg = to_float32_msg(np.zeros((2, 3), np.float32), ("env", "obs"))
    try:
        assert spin_until(executor, lambda: trainer.count_publishers("observation") == 1, 5.0)
        subscription = trainer._robots[0].input.subscriptions[0]
        named = incompatible_publishers(trainer, subscription.topic_name,
                                        subscription.qos_profile)
        assert (named == []) == heard
        if not heard:
            assert "/sensor_driver" in named[0] and "best effort publisher" in named[0].lower()
        for _ in range(20):
            publisher.publish(msg)
            if spin_until(executor, lambda: trainer.loop.phase is not Phase.WAITING, 0.1):
                break
        assert (trainer.loop.phase is not Phase.WAITING) == heard
    finally:
        executor.shutdown()
        driver.destroy_node()
        trainer.destroy_node()
