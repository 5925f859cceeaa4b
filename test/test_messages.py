"""numpy <-> std_msgs multi-array conversions and their validation (no rclpy.init needed)."""

import array

import numpy as np
import pytest
from std_msgs.msg import (
    Float32MultiArray,
    Float64MultiArray,
    MultiArrayDimension,
    MultiArrayLayout,
    UInt8MultiArray,
)

from unilab_ros.ros.messages import (
    DONE_RUNNING,
    DONE_TERMINATED,
    DONE_TRUNCATED,
    MessageError,
    encode_done_codes,
    read_done_codes,
    read_matrix,
    read_vector,
    to_float32_msg,
    to_float64_msg,
    to_uint8_msg,
)


def _layout(*sizes: int) -> MultiArrayLayout:
    return MultiArrayLayout(dim=[MultiArrayDimension(label=f'd{i}', size=size, stride=0)
                                 for i, size in enumerate(sizes)])


def test_float32_round_trip_sets_row_major_layout():
    values = np.arange(12, dtype=np.float64).reshape(4, 3)
    msg = to_float32_msg(values)
    assert isinstance(msg.data, array.array) and msg.data.typecode == 'f'
    assert [(d.label, d.size, d.stride) for d in msg.layout.dim] == [('env', 4, 12),
                                                                      ('obs', 3, 3)]
    assert msg.layout.data_offset == 0
    read = read_matrix(msg, 4, 3)
    assert read.dtype == np.float32
    np.testing.assert_array_equal(read, values)


def test_float64_and_uint8_writers_keep_their_payload_type():
    msg64 = to_float64_msg(np.array([[0.1, 0.2]]), ('env', 'action'))
    assert msg64.data.typecode == 'd'
    assert [d.label for d in msg64.layout.dim] == ['env', 'action']
    np.testing.assert_array_equal(read_matrix(msg64, 1, 2, np.float64), [[0.1, 0.2]])
    msg8 = to_uint8_msg(np.array([0, 1, 2]))
    assert msg8.data.typecode == 'B'
    assert [(d.label, d.size, d.stride) for d in msg8.layout.dim] == [('env', 3, 3)]


def test_writers_reject_unsupported_shapes():
    with pytest.raises(ValueError):
        to_float32_msg(np.zeros((2, 2, 2)))
    with pytest.raises(ValueError):
        to_float32_msg(np.zeros((2, 2)), ('env',))


def test_reader_returns_an_array_the_caller_owns():
    msg = to_float32_msg(np.ones((2, 2)))
    read = read_matrix(msg, 2, 2)
    read[0, 0] = 5.0
    assert msg.data[0] == 1.0


def test_reader_accepts_an_empty_layout():
    msg = Float64MultiArray(data=[1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(read_matrix(msg, 2, 2), [[1.0, 2.0], [3.0, 4.0]])


def test_reader_accepts_singleton_dimensions_written_or_omitted():
    values = np.array([[0.5], [-0.5]])
    for layout in (_layout(2), _layout(2, 1)):
        msg = Float32MultiArray(layout=layout, data=array.array('f', [0.5, -0.5]))
        np.testing.assert_array_equal(read_matrix(msg, 2, 1), values)
    single_env = Float32MultiArray(layout=_layout(3), data=[1.0, 2.0, 3.0])
    assert read_matrix(single_env, 1, 3).shape == (1, 3)


@pytest.mark.parametrize('length', [5, 7, 0])
def test_reader_rejects_a_wrong_length(length):
    msg = Float32MultiArray(data=[0.0] * length)
    with pytest.raises(MessageError, match=f'expected 6 values .*got {length}'):
        read_matrix(msg, 2, 3)


def test_reader_rejects_a_layout_that_disagrees_with_the_configured_sizes():
    msg = Float32MultiArray(layout=_layout(3, 2), data=[0.0] * 6)
    with pytest.raises(MessageError, match='layout.dim sizes'):
        read_matrix(msg, 2, 3)


def test_reader_rejects_a_data_offset():
    msg = Float32MultiArray(layout=MultiArrayLayout(data_offset=1), data=[0.0] * 6)
    with pytest.raises(MessageError, match='data_offset'):
        read_matrix(msg, 2, 3)


@pytest.mark.parametrize('bad', [np.nan, np.inf, -np.inf])
def test_reader_rejects_non_finite_values(bad):
    data = [0.0] * 6
    data[4] = bad
    with pytest.raises(MessageError, match='non-finite value .* at row 1'):
        read_matrix(Float64MultiArray(data=data), 2, 3)


def test_reader_rejects_other_message_types():
    with pytest.raises(MessageError, match='unsupported message type'):
        read_vector(MultiArrayLayout(), 1)


def test_read_vector_reads_rewards():
    msg = to_float32_msg(np.array([1.5, -2.0]), ('env',))
    np.testing.assert_array_equal(read_vector(msg, 2), [1.5, -2.0])
    with pytest.raises(MessageError):
        read_vector(msg, 3)


def test_done_codes_are_read_and_validated():
    codes = read_done_codes(to_uint8_msg(np.array([0, 1, 2, 0])), 4)
    assert codes.dtype == np.uint8
    np.testing.assert_array_equal(codes, [0, 1, 2, 0])
    with pytest.raises(MessageError, match='done codes must be 0, 1 or 2, got 3 at env 1'):
        read_done_codes(UInt8MultiArray(data=[0, 3, 0]), 3)
    with pytest.raises(MessageError, match='expected 2 values'):
        read_done_codes(UInt8MultiArray(data=[0, 1, 0]), 2)


def test_encode_done_codes_gives_termination_precedence():
    terminated = np.array([False, True, False, True])
    truncated = np.array([False, False, True, True])
    np.testing.assert_array_equal(
        encode_done_codes(terminated, truncated),
        [DONE_RUNNING, DONE_TERMINATED, DONE_TRUNCATED, DONE_TERMINATED])


def test_reader_rejects_transposed_or_extra_dimensions():
    for layout in (_layout(1, 2), _layout(2, 1, 1)):
        msg = Float32MultiArray(layout=layout, data=[0.0, 0.0])
        with pytest.raises(MessageError, match='layout.dim sizes'):
            read_matrix(msg, 2, 1)


def test_values_beyond_the_limit_are_rejected_with_the_place():
    msg = to_float32_msg(np.array([[0.0, 1.0], [2.0, 1e38]], np.float32))
    with pytest.raises(MessageError, match="1e\\+38 at row 1 exceeds the limit 1e\\+06"):
        read_matrix(msg, 2, 2, limit=1e6)
    np.testing.assert_array_equal(read_matrix(msg, 2, 2)[1], np.array([2.0, 1e38], np.float32))
    with pytest.raises(MessageError, match="exceeds the limit 5"):
        read_vector(to_float32_msg(np.array([1.0, -6.0], np.float32), ("env",)), 2, limit=5.0)
