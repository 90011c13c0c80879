"""``tandem-rlvr demo``: the paper's experiment in the built-in arithmetic world, on a CPU.

* :mod:`tandem_rlvr.demo.runner` — :func:`run_demo`: build the world, run the jobs, resume, report.
* :mod:`tandem_rlvr.demo.plan` — the plans (``quick`` / ``full`` per world), the runs and each run's
  training config.
* :mod:`tandem_rlvr.demo.jobs` — one job (train and evaluate one run and seed, or the warm start) and
  how jobs run, in this process or in spawned ones.
* :mod:`tandem_rlvr.demo.val` — the senior-alone validation curves during training.
* :mod:`tandem_rlvr.demo.report`, :mod:`tandem_rlvr.demo.plots`, :mod:`tandem_rlvr.demo.results`,
  :mod:`tandem_rlvr.demo.stats` — the report: table, verdicts, plots and their statistics.
"""

from tandem_rlvr.demo.plan import (
    FULL,
    PLANS,
    QUICK,
    SHORTHAND_FULL,
    SHORTHAND_QUICK,
    SOURCES,
    DemoPlan,
    plans,
    run_names,
    split_run,
    style_rate,
    train_config,
)
from tandem_rlvr.demo.runner import run_demo

__all__ = [
    "FULL", "PLANS", "QUICK", "SHORTHAND_FULL", "SHORTHAND_QUICK", "SOURCES", "DemoPlan", "plans", "run_demo",
    "run_names", "split_run", "style_rate", "train_config",
]
