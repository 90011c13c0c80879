"""What the tests share: tiny models, trainers, run files, the vLLM stand-ins' fixtures, and the scripts and
reward module the tests start in other processes. Importable as ``helpers.*`` because pyproject's
``[tool.pytest.ini_options] pythonpath`` puts tests/ on ``sys.path``; no test module imports another."""
