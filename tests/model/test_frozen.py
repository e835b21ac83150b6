"""`quick_init` builds exactly what the dataclass's own `__init__` builds, and stays frozen."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from sidecar.model.content import TextContent
from sidecar.model.frozen import quick_init
from sidecar.model.outcome import Outcome
from sidecar.model.tool import ToolContext
from sidecar.stores.call_history import CallRecord


def _made(name: str) -> Any:
    return dataclasses.make_dataclass(name, [
        ("a", str), ("b", int, dataclasses.field(default=2)),
        ("c", Any, dataclasses.field(default=None)),
        ("hidden", bool, dataclasses.field(default=False, compare=False)),
    ], frozen=True, slots=True)


Plain = _made("Plain")
Quick = quick_init(_made("Quick"))


def _values(value: Any) -> dict[str, Any]:
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}


@pytest.mark.parametrize(("args", "kwargs"), [
    (("x",), {}), (("x", 5), {}), (("x",), {"c": [1], "hidden": True}),
    ((), {"a": "x", "b": 3, "c": {"k": 1}, "hidden": False}),
])
def test_the_same_values_signature_and_behaviour(args: tuple[Any, ...],
                                                 kwargs: dict[str, Any]) -> None:
    quick, plain = Quick(*args, **kwargs), Plain(*args, **kwargs)
    assert _values(quick) == _values(plain)
    assert repr(quick) == repr(plain).replace("Plain", "Quick")
    assert quick == Quick(*args, **kwargs)
    assert str(inspect.signature(Quick)) == str(inspect.signature(Plain))
    with pytest.raises(dataclasses.FrozenInstanceError):
        quick.a = "y"
    with pytest.raises(dataclasses.FrozenInstanceError):
        del quick.b
    assert dataclasses.replace(quick, b=9).b == 9


def test_argument_errors_are_the_usual_ones() -> None:
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'a'"):
        Quick()
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        Quick("x", z=1)


def test_post_init_still_runs() -> None:
    with pytest.raises(ValueError, match=r"ToolContext\.call_id must be a non-empty string"):
        ToolContext("s", "a", "m", "")


def test_the_model_classes_it_speeds_up_build_every_field() -> None:
    """A field added to one of them later, and so left unset, fails here."""
    content = (TextContent("hi"),)
    context = ToolContext("s", "a", "m", "c")
    outcome = Outcome("c1", "echo", "completed", content, {"k": 1})
    record = CallRecord("c1", "echo", None, None, "s", "a", "m", "completed", None, 1.0, 2.0,
                        3, {"x": 1}, 4, (), False)
    for value in (content[0], context, outcome, record):
        assert all(hasattr(value, f.name) for f in dataclasses.fields(value)), value


@pytest.mark.parametrize("spec", [
    dataclasses.field(default_factory=list), dataclasses.field(default=1, kw_only=True),
    dataclasses.field(default=1, init=False),
])
def test_refuses_what_it_cannot_build_alike(spec: Any) -> None:
    cls = dataclasses.make_dataclass("Odd", [("a", int), ("b", Any, spec)], frozen=True,
                                     slots=True)
    with pytest.raises(TypeError, match=r"Odd\.b"):
        quick_init(cls)


def test_refuses_a_class_that_is_not_frozen_and_slotted() -> None:
    with pytest.raises(TypeError, match="not a frozen, slotted dataclass"):
        quick_init(dataclasses.make_dataclass("Loose", [("a", int)]))
