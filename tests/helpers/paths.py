"""Where things are: the repository, tests/ (on PYTHONPATH for a subprocess that loads a reward from
``helpers.rewards_for_tests``) and this folder (the scripts the tests start)."""

from pathlib import Path

HELPERS = Path(__file__).resolve().parent
TESTS = HELPERS.parent
ROOT = TESTS.parent
