"""Fixture scopes that depend on how the tests run."""

from __future__ import annotations

import os


def module_scope_unless_mutating(fixture_name: str, config) -> str:
    """Scope of fixtures that run the trainer once for many tests: per module, but per test under mutmut
    (``MUTANT_UNDER_TEST`` set), which maps each test to the functions it calls and would otherwise credit
    the shared call to the first test only (``make mutate`` then skips the tests that check the result)."""
    return "function" if os.environ.get("MUTANT_UNDER_TEST") else "module"
