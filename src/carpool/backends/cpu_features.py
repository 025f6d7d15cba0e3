"""What the CPU offers that changes a model's numbers, not only its speed. onnxruntime's int8
matrix products are exact where the CPU sums u8 x s8 products in 32 bits (VNNI, AMX, aarch64)
and saturate in 16 bits on AVX2 or AVX-512 without VNNI (``vpmaddubsw``); the int8 engine
reads these features to pick weights that cannot saturate there."""

from __future__ import annotations

import dataclasses
import platform
from pathlib import Path

__all__ = ["CpuFeatures", "cpu_features", "parse_cpuinfo"]

# MLAS takes its AVX-512 VNNI kernel only with AVX-512 core (BW, DQ, VL) beside it.
_AVX512_CORE = frozenset({"avx512bw", "avx512dq", "avx512vl"})
# What the log names: the flags that decide which integer kernel runs.
_SHOWN = ("avx2", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8")
_ARM = ("aarch64", "arm64")


@dataclasses.dataclass(frozen=True)
class CpuFeatures:
    """``machine`` as ``platform.machine()`` says it, lower-cased; ``flags`` as the kernel
    lists them in ``/proc/cpuinfo`` (empty where they cannot be read)."""

    machine: str
    flags: frozenset[str] = frozenset()

    @property
    def exact_int8(self) -> bool:
        """Whether u8 x s8 products are summed without 16-bit saturation."""
        if self.machine in _ARM:
            return True
        vnni512 = "avx512_vnni" in self.flags and self.flags >= _AVX512_CORE
        vnni256 = "avx_vnni" in self.flags and "avx2" in self.flags
        return vnni512 or vnni256

    def describe(self) -> str:
        """A few words for the log: the machine and the flags that decide the kernel."""
        if self.machine in _ARM:
            return f"{self.machine} (int8 products summed in 32 bits)"
        if not self.flags:
            return f"{self.machine}, CPU flags unknown"
        shown = [flag for flag in _SHOWN if flag in self.flags]
        vnni = "VNNI" if self.exact_int8 else "no VNNI: u8 x s8 pairs saturate at 16 bits"
        return f"{self.machine} with {', '.join(shown) or 'none of ' + '/'.join(_SHOWN)} ({vnni})"


def parse_cpuinfo(machine: str, text: str) -> CpuFeatures:
    """The features in ``/proc/cpuinfo``'s text: the first ``flags`` line (x86) or
    ``Features`` line (arm)."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return CpuFeatures(machine.lower(), frozenset(value.split()))
    return CpuFeatures(machine.lower())


def cpu_features(cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuFeatures:
    """This machine's features; flags empty where ``/proc/cpuinfo`` cannot be read (not Linux)."""
    machine = platform.machine()
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return CpuFeatures(machine.lower())
    return parse_cpuinfo(machine, text)
