"""bfloat16 compute: whether a device has it, and the precision a run actually gets.

A CPU multiplies bfloat16 matrices at speed only with AVX512-BF16 (``avx512_bf16``) or AMX (``amx_bf16``);
elsewhere oneDNN emulates them, slower than float32. A CUDA device needs bfloat16 support (Ampere and later).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

__all__ = ["BF16_CPU_FLAGS", "bf16_support", "cpu_flags", "resolve_precision"]

BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
"""The CPU flags (as ``/proc/cpuinfo`` spells them) of native bfloat16 matrix products."""


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str]:
    """The flags of the first processor in ``cpuinfo`` (empty where there is no such file: not Linux)."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def bf16_support(device: str = "cpu", flags: set[str] | None = None) -> tuple[bool, str]:
    """Whether ``device`` multiplies bfloat16 matrices natively, and what says so.

    On a CPU: the flags of :data:`BF16_CPU_FLAGS` in ``flags`` (default: ``/proc/cpuinfo``'s), else torch's own
    check (``torch.cpu._is_avx512_bf16_supported`` / ``_is_amx_tile_supported``, where this torch has them).

    Returns:
        ``(supported, reason)``, the reason naming the flags found or missing, or the CUDA device.
    """
    kind = torch.device(device).type
    if kind == "cuda":
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return True, f"{torch.cuda.get_device_name(torch.device(device))} supports bfloat16"
        return False, "this CUDA device has no bfloat16 support"
    if kind != "cpu":
        return False, f"bfloat16 autocast is not checked on {kind!r} devices"
    found = sorted(set(BF16_CPU_FLAGS) & (cpu_flags() if flags is None else flags))
    if found:
        return True, "CPU flags " + ", ".join(found)
    if flags is None:  # no cpuinfo to read (macOS, Windows): ask torch
        checks = {"avx512_bf16": "_is_avx512_bf16_supported", "amx_bf16": "_is_amx_tile_supported"}
        found = [flag for flag, name in checks.items() if getattr(torch.cpu, name, lambda: False)()]
        if found:
            return True, "torch reports " + ", ".join(found)
    return False, f"the CPU has neither {' nor '.join(BF16_CPU_FLAGS)}"


def resolve_precision(precision: str, device: str = "cpu") -> str:
    """The precision a run gets: ``precision``, or ``"fp32"`` (said in one line on stderr) where the device
    has no native bfloat16."""
    if precision == "fp32":
        return precision
    supported, reason = bf16_support(device)
    if supported:
        return precision
    print(f"searchgym: --precision {precision}: {reason}; running fp32", file=sys.stderr)
    return "fp32"
