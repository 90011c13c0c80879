"""Evaluation: solo, step handoff, communication tax, handoff-rate curve, legibility, drift;
metrics, the report and ``tandem-rlvr eval``."""
