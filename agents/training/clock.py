"""Wall time per phase of a training step: what ``time/*`` metrics finer than a whole step are made of."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["PhaseClock"]


class PhaseClock:
    """Wall time per named phase of a step, summed over the phase's passes until :meth:`take` reads it.

    ``with clock("forward"): ...`` adds the block's wall time to ``forward``; :meth:`take` returns the sums
    as ``time/<phase>_s`` metrics and starts again from zero. On an accelerator the times are the host's
    (kernels still queued when a block ends are counted in a later one).
    """

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.totals[phase] += time.perf_counter() - start

    def take(self) -> dict[str, float]:
        """The phases' summed seconds as ``time/<phase>_s``, and a fresh start."""
        out = {f"time/{phase}_s": seconds for phase, seconds in self.totals.items()}
        self.totals.clear()
        return out
