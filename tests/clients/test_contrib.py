"""The adapters' folder: `effectd_client.contrib.<framework>` and the first
import path `effectd_client.<framework>` give the same objects, and the
extension surface an adapter may use is pinned and loads no framework."""

from __future__ import annotations

import importlib
import types

import pytest

import effectd_client.extend
from tests.support.imports import imported_by

ADAPTERS = ("langgraph", "mcp", "openai_agents", "pydantic_ai")
FRAMEWORKS = ["agent_framework", "agents", "langgraph", "mcp", "pydantic_ai"]


def differences(old: types.ModuleType, new: types.ModuleType) -> list[str]:
    """Where module `old` does not re-export exactly `new`'s public names."""
    found = []
    if sorted(getattr(old, "__all__", ())) != sorted(new.__all__):
        found.append(f"{old.__name__}.__all__ is not {new.__name__}.__all__")
    for name in new.__all__:
        if getattr(old, name, None) is not getattr(new, name):
            found.append(f"{old.__name__}.{name} is not {new.__name__}.{name}")
    return found


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_the_first_import_path_gives_the_same_objects(adapter: str) -> None:
    old = importlib.import_module(f"effectd_client.{adapter}")
    new = importlib.import_module(f"effectd_client.contrib.{adapter}")
    assert new.__all__
    assert differences(old, new) == []


def test_a_path_that_copies_a_name_is_reported() -> None:
    """The negative control: a first path whose `LedgeredSession` is a
    subclass (a copy, not the object) and that lacks a name is caught."""
    new = importlib.import_module("effectd_client.contrib.mcp")
    forged = types.ModuleType("effectd_client.mcp")
    for name in new.__all__:
        setattr(forged, name, getattr(new, name))
    forged.LedgeredSession = type("LedgeredSession", (new.LedgeredSession,), {})  # type: ignore[attr-defined]
    forged.__all__ = [n for n in new.__all__ if n != "unwrapped"]  # type: ignore[attr-defined]
    assert differences(forged, new) == [
        "effectd_client.mcp.__all__ is not effectd_client.contrib.mcp.__all__",
        "effectd_client.mcp.LedgeredSession is not "
        "effectd_client.contrib.mcp.LedgeredSession",
    ]


def test_the_extension_surface_is_pinned() -> None:
    """What an adapter may use beyond the public names, each importable."""
    assert sorted(effectd_client.extend.__all__) == [
        "Matcher",
        "McpDecision",
        "McpPolicy",
        "McpServerPolicy",
        "Next",
        "admit",
        "asks_for_retry",
        "is_unknown",
    ]
    for name in effectd_client.extend.__all__:
        assert getattr(effectd_client.extend, name) is not None


def test_the_extension_surface_and_the_folder_load_no_framework() -> None:
    """`effectd_client.extend` and `effectd_client.contrib` import none of
    the frameworks; an adapter's package does (the probe's negative control)."""
    assert imported_by("import effectd_client.extend", FRAMEWORKS) == []
    assert imported_by("import effectd_client.contrib", FRAMEWORKS) == []
    assert imported_by("import effectd_client.contrib.pydantic_ai", FRAMEWORKS) == [
        "pydantic_ai"
    ]
