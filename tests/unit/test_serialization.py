"""Serialization fast paths: plain values by the stdlib pickler, the rest by cloudpickle."""

from __future__ import annotations

import pickle

import numpy as np

from rtml.config import INLINE_MAX
from rtml.core.serialization import deserialize, plain_payload, serialize


def round_trip(value: object) -> object:
    ser = serialize(value)
    payload = ser.to_payload()
    return deserialize(payload.data, payload.buffers)


def test_plain_values_round_trip_in_band() -> None:
    state = {"params": np.arange(10.0), "obs": np.zeros(4, dtype=np.float32), "step": 3,
             "reward": 1.5, "done": False, "tags": ("a", b"b", None, [1, 2.0, 3j])}
    ser = serialize(state)
    assert not ser.buffers and not ser.contained
    back = round_trip(state)
    assert isinstance(back, dict) and back.keys() == state.keys()
    assert np.array_equal(back["params"], state["params"])
    assert back["obs"].dtype == np.float32
    assert back["tags"] == state["tags"]


def test_plain_payload_takes_small_values_of_plain_types_only() -> None:
    for value in (None, True, 7, 2.5, 1j, "text", b"bytes"):
        payload = plain_payload(value)
        assert payload is not None and not payload.buffers and not payload.is_error
        assert payload.data == serialize(value).inband and pickle.loads(payload.data) == value

    class Count(int):
        pass

    # a subclass (its class travels by value), a container, and what must not be inline
    for other in (Count(3), [1], b"x" * (INLINE_MAX + 1), "y" * (INLINE_MAX + 1)):
        assert plain_payload(other) is None


def test_code_inside_a_container_is_shipped_by_value() -> None:
    def local_square(x: int) -> int:  # not importable by name: needs cloudpickle
        return x * x

    back = round_trip([1, {"f": local_square}])
    assert isinstance(back, list) and back[1]["f"](7) == 49
    with_lambda = round_trip((lambda: 5,))
    assert isinstance(with_lambda, tuple) and with_lambda[0]() == 5


def test_object_arrays_and_big_containers_take_the_general_path() -> None:
    objects = np.array([local for local in (len, abs)], dtype=object)
    back = round_trip(objects)
    assert isinstance(back, np.ndarray) and back[0] is len
    big = list(range(10_000))
    assert round_trip(big) == big


def test_big_arrays_stay_out_of_band_for_zero_copy() -> None:
    array = np.ones(1 << 20, dtype=np.uint8)
    ser = serialize({"a": array})
    assert len(ser.buffers) == 1 and ser.size >= array.nbytes
    assert len(ser.inband) < 1024  # the bytes travel as a buffer, not inside the pickle
    back = pickle.loads(ser.inband, buffers=ser.buffers)
    assert np.array_equal(back["a"], array)
