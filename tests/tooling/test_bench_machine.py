"""benchmarks/common.py's machine line: every recorded result names the CPU model, the instruction sets that
decide its kernels (speed and float order), the kernels PyTorch chose and any variable that held them back
(issue 37: "with the CPU model and its flags"). Checked on hand-written /proc/cpuinfo texts, so the test does
not depend on the machine it runs on."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def common():
    spec = importlib.util.spec_from_file_location("tandem_bench_common", ROOT / "benchmarks" / "common.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)


XEON = """processor\t: 0
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse2 avx avx2 avx512f avx512bw avx512_bf16 amx_bf16 amx_tile
processor\t: 1
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse2 avx avx2 avx512f avx512bw avx512_bf16 amx_bf16 amx_tile
"""
EPYC = """processor\t: 0
model name\t: AMD EPYC 7B12
flags\t\t: fpu sse2 avx avx2 fma
"""
OLD = """model name\t: Intel(R) Core(TM)2 Duo CPU
flags\t\t: fpu sse2 ssse3
"""


def test_names_the_model_its_instruction_sets_and_torch_kernels(common):
    assert common.cpu_description(XEON, "AVX512", {}) == (
        "Intel(R) Xeon(R) Processor (avx2 avx512f avx512_bf16 amx_tile), torch kernels AVX512")
    assert common.cpu_description(EPYC, "AVX2", {}) == "AMD EPYC 7B12 (avx2), torch kernels AVX2"
    assert common.cpu_description(OLD, "DEFAULT", {}) == "Intel(R) Core(TM)2 Duo CPU (no AVX2), torch kernels DEFAULT"


def test_says_when_the_kernels_were_held_to_a_smaller_instruction_set(common):
    env = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
           "OTHER": "x"}
    line = common.cpu_description(XEON, "AVX2", env)
    assert line.endswith("torch kernels AVX2, held by ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 "
                         "ONEDNN_MAX_CPU_ISA=AVX2")
    assert "OTHER" not in line
    assert "held by" not in common.cpu_description(XEON, "AVX512", {"ATEN_CPU_CAPABILITY": ""})


def test_without_cpuinfo_the_flags_are_unknown_not_guessed(common):
    line = common.cpu_description("", "AVX2", {})
    assert "(flags unknown), torch kernels AVX2" in line
    assert not line.startswith(" (")  # some model name (the platform's) comes first


def test_machine_line_holds_this_process_kernels_cores_and_threads(common):
    import os

    import torch

    line = common.machine()
    assert f"torch kernels {torch.backends.cpu.get_cpu_capability()}" in line
    assert f"{os.cpu_count()} cores, torch threads {torch.get_num_threads()}" in line
