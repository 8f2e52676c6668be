"""The identity snapshot's one-pass lookup table finds exactly what `inspect.getattr_static` finds (grader 2.4)."""

from __future__ import annotations

import inspect

import pytest
import torch

import mkb.grader._harness  # noqa: F401 - puts every watched space in sys.modules, as in a worker
from mkb.grader._guards import Identities, _spaces, static_table

_NONE = object()


def _static(obj: type, name: str):
    try:
        return inspect.getattr_static(obj, name)
    except AttributeError:
        return _NONE


def _same_as_getattr_static(klass: type) -> list[str]:
    table = static_table(klass)
    return [n for n in dir(klass) if table.get(n, _NONE) is not _static(klass, n)]


def test_the_table_matches_getattr_static_on_every_watched_class():
    classes = [obj for obj in _spaces().values() if isinstance(obj, type)]
    assert torch.Tensor in classes and torch.cuda.Event in classes
    for klass in classes:
        assert _same_as_getattr_static(klass) == [], klass


def test_the_table_matches_getattr_static_through_metaclasses_and_shadowing():
    class Meta(type):
        meta_only = staticmethod(lambda: 1)

        @property
        def both(cls):  # a data descriptor on the metaclass: the class's own `both` still wins for getattr_static
            return 0

    class Base(metaclass=Meta):
        def f(self):
            return 1

        both = staticmethod(lambda: 2)

    class Child(Base):
        pass

    assert _same_as_getattr_static(Child) == []
    Child.f = lambda self: 2  # shadows Base.f
    assert _same_as_getattr_static(Child) == [] and static_table(Child)["f"] is Child.__dict__["f"]


def test_a_rebinding_on_a_subclass_shadowing_its_base_is_still_seen(monkeypatch):
    before = Identities.take()
    assert "torch.Tensor.mean" in before.ids
    monkeypatch.setattr(torch.Tensor, "mean", lambda self, *a, **k: self.sum(), raising=False)
    assert "torch.Tensor.mean" in before.changed()
    monkeypatch.undo()
    assert before.changed() == []


@pytest.mark.parametrize("name", ["elapsed_time", "record", "synchronize"])
def test_a_rebound_event_method_is_seen(monkeypatch, name):
    before = Identities.take()
    monkeypatch.setattr(torch.cuda.Event, name, lambda *a, **k: 0.0)
    assert f"torch.cuda.Event.{name}" in before.changed()


def test_changed_looks_each_watched_name_up_again_by_object_not_by_a_new_snapshot(monkeypatch):
    """Grader 2.21's `changed`: a deleted, rebound, non-callable or equal-but-other object is a change, a space that is
    gone changes all its names, and a metaclass that hides names from dir() after the snapshot hides nothing."""
    import types

    from mkb.grader import _guards

    class Meta(type):
        pass

    class Watched(metaclass=Meta):
        def f(self):
            return 1

        def g(self):
            return 2

        def h(self):
            return 3

    mod = types.ModuleType("fake_space")
    mod.fn = len
    mod.other = abs
    spaces = {"fake_space": mod, "fake_space.Watched": Watched}
    monkeypatch.setattr(_guards, "_spaces", lambda: dict(spaces))
    before = Identities.take()
    assert {"fake_space.fn", "fake_space.Watched.f", "fake_space.Watched.h"} <= set(before.ids)
    assert before.changed() == []
    Meta.__dir__ = lambda cls: []  # hide every name from dir() after the snapshot
    Watched.f = lambda self: 1  # rebound
    del Watched.g  # deleted
    Watched.h = 3  # no longer callable
    mod.fn = (lambda f: f)(len)  # the same object again: not a change
    mod.other = lambda x: abs(x)  # an equal-behaving, other object
    assert before.changed() == ["fake_space.Watched.f", "fake_space.Watched.g", "fake_space.Watched.h", "fake_space.other"]
    del spaces["fake_space"]  # the space itself gone
    assert "fake_space.fn" in before.changed()
