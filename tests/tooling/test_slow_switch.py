"""TANDEM_SLOW=1 (read by tests/conftest.py) runs the slow tests that the default run deselects."""

import pytest

from helpers.paths import ROOT

pytest_plugins = "pytester"


@pytest.fixture
def project(pytester):
    """A test directory with this repository's pyproject.toml and conftest, one fast and one slow test."""
    pytester.makepyprojecttoml((ROOT / "pyproject.toml").read_text())
    pytester.makeconftest((ROOT / "tests" / "conftest.py").read_text())
    pytester.makepyfile(test_two="""
        import pytest

        def test_fast():
            pass

        @pytest.mark.slow
        def test_slow():
            pass
    """)
    return pytester


@pytest.mark.parametrize("env, args, passed, deselected", [
    (None, [], 1, 1),                     # the default run deselects slow tests
    ("1", [], 2, 0),                      # TANDEM_SLOW=1 runs them too
    ("0", [], 1, 1),                      # only "1" switches
    ("1", ["-m", "slow"], 1, 1),          # an explicit -m wins
    (None, ["-m", "slow"], 1, 1),
])
def test_tandem_slow_runs_slow_tests(project, monkeypatch, env, args, passed, deselected):
    if env is None:
        monkeypatch.delenv("TANDEM_SLOW", raising=False)
    else:
        monkeypatch.setenv("TANDEM_SLOW", env)
    res = project.runpytest_inprocess(*args)
    res.assert_outcomes(passed=passed, deselected=deselected)
