"""Runs of several processes: a free rendezvous port, and the metrics that are means over processes."""

from __future__ import annotations

import socket

# token means over the trained tokens (weighted over chunks, mini-batches and processes), compared with a looser
# tolerance than the other metrics: between runs whose weights differ in float order a ratio near a clip bound
# can fall on either side of it
APPROX = ("train/ratio_mean", "train/clip_frac", "train/clip_frac_low", "train/clip_frac_high")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
