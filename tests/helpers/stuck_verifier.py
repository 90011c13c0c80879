"""A process whose verifier worker is stuck in C code when its watchdog fires (tests/rewards/test_workers.py).

``python tests/helpers/stuck_verifier.py DUMP``: starts one ``subprocess`` verifier worker, prints its pid, hands it
a check that computes 9^(9^9) (C code for hours: its own interval timer cannot stop it) and never beats a 1 s
watchdog, which ends this process with exit code 124.
"""

import sys
import threading
import time
from pathlib import Path

from tandem_rlvr.rewards import RewardScorer
from tandem_rlvr.training.watchdog import Watchdog

if __name__ == "__main__":
    scorer = RewardScorer("math", num_workers=1, time_limit=600)
    scorer.start()
    print(scorer._workers[0].proc.pid, flush=True)
    threading.Thread(target=scorer.score, args=(["\\boxed{9^{9^{9}}}"], ["1"]), daemon=True).start()
    time.sleep(0.5)  # the check is under way
    Watchdog(1.0, dump_path=Path(sys.argv[1])).start()
    time.sleep(600)
