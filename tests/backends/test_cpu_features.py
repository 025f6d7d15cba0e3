"""Which CPUs sum u8 x s8 products exactly, read from ``/proc/cpuinfo``'s text: pure."""

from __future__ import annotations

from pathlib import Path

import pytest

from carpool.backends.cpu_features import CpuFeatures, cpu_features, parse_cpuinfo

AVX2 = {"sse4_2", "avx", "avx2", "fma"}
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512dq", "avx512vl"}
CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse4_2 avx avx2 fma
bugs\t\t: sysret_ss_attrs

processor\t: 1
flags\t\t: fpu sse4_2 avx avx2 fma
"""


@pytest.mark.parametrize(
    ("machine", "flags", "exact"),
    [
        ("x86_64", AVX2, False),  # AMD EPYC (Zen 2/3), Haswell-Broadwell: vpmaddubsw saturates
        ("x86_64", AVX512, False),  # Skylake-SP: AVX-512 without VNNI saturates too
        ("x86_64", AVX512 | {"avx512_vnni"}, True),  # Cascade Lake and later, Zen 4
        ("x86_64", AVX2 | {"avx512_vnni"}, False),  # VNNI without AVX-512 core: not MLAS's kernel
        ("x86_64", AVX2 | {"avx_vnni"}, True),  # Alder Lake: AVX-VNNI
        ("x86_64", set(), False),  # flags unknown: assume the saturating kernel
        ("aarch64", set(), True),  # NEON and dot-product kernels widen
        ("arm64", set(), True),  # macOS names it so
    ],
)
def test_exact_int8_products_need_vnni_on_x86_and_nothing_on_arm(
    machine: str, flags: set[str], exact: bool
) -> None:
    assert CpuFeatures(machine, frozenset(flags)).exact_int8 is exact


def test_cpuinfo_gives_the_first_processors_flags() -> None:
    assert parse_cpuinfo("X86_64", CPUINFO) == CpuFeatures(
        "x86_64", frozenset({"fpu", "sse4_2", "avx", "avx2", "fma"})
    )
    assert parse_cpuinfo("aarch64", "Features\t: fp asimd asimddp\n").flags == {
        "fp",
        "asimd",
        "asimddp",
    }
    assert parse_cpuinfo("x86_64", "processor\t: 0\n") == CpuFeatures("x86_64")


def test_an_unreadable_cpuinfo_leaves_the_flags_unknown(tmp_path: Path) -> None:
    features = cpu_features(tmp_path / "missing")
    assert features.flags == frozenset()
    assert not features.exact_int8 or features.machine in ("aarch64", "arm64")


def test_the_description_names_the_deciding_flags() -> None:
    assert CpuFeatures("x86_64", frozenset(AVX2)).describe() == (
        "x86_64 with avx2 (no VNNI: u8 x s8 pairs saturate at 16 bits)"
    )
    vnni = CpuFeatures("x86_64", frozenset(AVX512 | {"avx512_vnni"}))
    assert vnni.describe() == "x86_64 with avx2, avx512bw, avx512_vnni (VNNI)"
    assert CpuFeatures("x86_64").describe() == "x86_64, CPU flags unknown"
    assert CpuFeatures("aarch64").describe() == "aarch64 (int8 products summed in 32 bits)"
