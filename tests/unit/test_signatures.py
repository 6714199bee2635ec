"""Calls checked against the function's signature at ``.remote()`` (rtml.core.signatures)."""

from __future__ import annotations

from typing import Any

import pytest

from rtml.core.signatures import CallCheck


def plain(a: int, b: int = 2) -> None: ...


def varargs(a: int, *rest: int, key: str = "", **extra: Any) -> None: ...


def keyword_only(a: int, *, flag: bool) -> None: ...


@pytest.mark.parametrize("args,kwargs", [((1,), {}), ((1, 2), {}), ((), {"a": 1}),
                                         ((1,), {"b": 3}), ((), {"b": 3, "a": 1})])
def test_calls_that_bind_pass(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    CallCheck.of(plain, "remote function plain").check(args, kwargs)


@pytest.mark.parametrize("args,kwargs,why", [
    ((), {}, "missing a required argument: 'a'"),
    ((1, 2, 3), {}, "too many positional arguments"),
    ((1,), {"a": 2}, "multiple values for argument 'a'"),
    ((1,), {"c": 1}, "unexpected keyword argument 'c'"),
])
def test_calls_that_do_not_bind_raise_naming_the_function(args: tuple[Any, ...],
                                                         kwargs: dict[str, Any],
                                                         why: str) -> None:
    with pytest.raises(TypeError) as raised:
        CallCheck.of(plain, "remote function plain").check(args, kwargs)
    assert str(raised.value).startswith("remote function plain(a, b=...) cannot take")
    assert why in str(raised.value)


def test_other_signatures_go_through_bind() -> None:
    check = CallCheck.of(varargs, "remote function varargs")
    check.check((1, 2, 3), {"key": "k", "anything": 1})
    with pytest.raises(TypeError, match="missing a required argument: 'a'"):
        check.check((), {"key": "k"})
    only = CallCheck.of(keyword_only, "remote function keyword_only")
    only.check((1,), {"flag": True})
    with pytest.raises(TypeError, match="missing a required argument: 'flag'"):
        only.check((1,), {})
    with pytest.raises(TypeError, match="too many positional"):
        only.check((1, True), {})


def test_a_class_is_checked_against_its_constructor() -> None:
    class WithInit:
        def __init__(self, x: int) -> None: ...

    class WithoutInit:
        pass

    CallCheck.of(WithInit, "actor class WithInit").check((1,), {})
    with pytest.raises(TypeError, match=r"actor class WithInit\(x\) cannot"):
        CallCheck.of(WithInit, "actor class WithInit").check((), {})
    CallCheck.of(WithoutInit, "actor class WithoutInit").check((), {})
    with pytest.raises(TypeError, match="too many positional"):
        CallCheck.of(WithoutInit, "actor class WithoutInit").check((1,), {})


def test_a_function_without_a_signature_is_not_checked() -> None:
    check = CallCheck.of(print, "remote function print")  # has one in 3.11: still accepts all
    check.check((1, 2, 3), {"sep": ","})


class Methods:
    def method(self, x: int, y: int = 0) -> None: ...

    @staticmethod
    def static(x: int) -> None: ...

    @classmethod
    def klass(cls, x: int) -> None: ...


def test_methods_are_checked_without_their_instance() -> None:
    CallCheck.of(Methods.method, "actor method Methods.method", bound=True).check((1,), {})
    with pytest.raises(TypeError, match=r"Methods.method\(x, y=...\) cannot"):
        CallCheck.of(Methods.method, "actor method Methods.method", bound=True).check((), {})
    CallCheck.of(Methods.static, "actor method Methods.static").check((1,), {})
    CallCheck.of(Methods().klass, "actor method Methods.klass").check((1,), {})


def test_a_check_pickles_small_whatever_its_defaults_are() -> None:
    import pickle
    import threading

    def with_odd_default(lock: object = threading.Lock()) -> None: ...  # noqa: B008

    check = CallCheck.of(with_odd_default, "remote function with_odd_default")
    again = pickle.loads(pickle.dumps(check))
    again.check((), {})
    with pytest.raises(TypeError, match=r"with_odd_default\(lock=...\) cannot"):
        again.check((1, 2), {})
    assert len(pickle.dumps(check)) < 600
