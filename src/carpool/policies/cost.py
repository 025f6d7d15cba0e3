"""How long a batch of ``b`` rows takes: an online fit of ``t(b) = fixed + per_row * b`` from
measured batches, per collation key. Batch times jitter and drift, so old batches are
forgotten geometrically and predictions carry a quantile margin: predicting the 90th
percentile, not the mean, is what lets a deadline-aware batcher keep its promises. Pure."""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass

__all__ = ["CostCurve", "CostModel", "LinearFit"]


@dataclass(frozen=True, slots=True)
class CostCurve:
    """What the model learned, for stats and logs: ``t(b) = fixed_s + per_row_s * b`` at the
    mean, times ``margin`` at the fitted quantile."""

    fixed_s: float
    per_row_s: float
    margin: float
    samples: int

    def predict(self, rows: int) -> float:
        return (self.fixed_s + self.per_row_s * rows) * self.margin

    def __str__(self) -> str:
        return (
            f"t(b) = {self.fixed_s * 1e3:.2f} ms + {self.per_row_s * 1e3:.3f} ms x b "
            f"(x{self.margin:.2f} margin, {self.samples} batches)"
        )


class LinearFit:
    """Weighted least squares of seconds on rows, with geometric forgetting and a window
    of recent measured/fitted ratios for the margin."""

    def __init__(self, half_life: float, quantile: float, window: int) -> None:
        self._decay = 0.5 ** (1.0 / half_life)
        self._quantile = quantile
        self._ratios: deque[float] = deque(maxlen=window)
        self._w = self._sx = self._sy = self._sxx = self._sxy = 0.0
        self.samples = 0
        self._curve: CostCurve | None = None

    def add(self, rows: int, seconds: float) -> None:
        fitted = self._mean(rows)
        if fitted is not None and fitted > 0:
            self._ratios.append(seconds / fitted)
        d = self._decay
        self._w = self._w * d + 1.0
        self._sx = self._sx * d + rows
        self._sy = self._sy * d + seconds
        self._sxx = self._sxx * d + rows * rows
        self._sxy = self._sxy * d + rows * seconds
        self.samples += 1
        self._curve = None

    def _line(self) -> tuple[float, float] | None:
        if self._w == 0.0:
            return None
        mean_x, mean_y = self._sx / self._w, self._sy / self._w
        var_x = self._sxx / self._w - mean_x * mean_x
        if var_x <= 1e-9 * max(1.0, mean_x * mean_x):
            # One batch size seen so far: the split between fixed and per-row cost is
            # unknown. Assume it is all fixed: a larger batch is then predicted no slower,
            # which errs towards admitting (a cold start never refuses what would fit),
            # and the first batch of another size corrects it.
            return mean_y, 0.0
        slope = (self._sxy / self._w - mean_x * mean_y) / var_x
        slope = max(slope, 0.0)  # more rows never take less time
        fixed = max(mean_y - slope * mean_x, 0.0)
        return fixed, slope

    def _mean(self, rows: int) -> float | None:
        line = self._line()
        return None if line is None else line[0] + line[1] * rows

    def curve(self) -> CostCurve | None:
        if self._curve is None:
            line = self._line()
            if line is None:
                return None
            margin = 1.0
            if len(self._ratios) >= 8:
                ordered = sorted(self._ratios)
                margin = max(1.0, ordered[int(self._quantile * (len(ordered) - 1))])
            self._curve = CostCurve(line[0], line[1], margin, self.samples)
        return self._curve


class CostModel:
    """Batch time by rows, per collation key, from measured batches; thread-safe (workers
    report from their threads, the scheduler asks on the loop). A key gets its own fit once
    it has been seen (256-token rows cost far more than 16-token ones); until then the
    pooled fit of all keys stands in."""

    def __init__(self, *, quantile: float = 0.9, half_life: float = 200.0, window: int = 256):
        if not 0.5 <= quantile < 1.0:
            raise ValueError(f"quantile must be in [0.5, 1), got {quantile!r}")
        if not half_life > 0:
            raise ValueError(f"half_life must be > 0 batches, got {half_life!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 8:
            raise ValueError(
                f"window must be an int >= 8 batches (the margin needs 8 ratios), got {window!r}"
            )
        self.quantile = quantile
        self._half_life = half_life
        self._window = window
        self._lock = threading.Lock()
        self._pooled = self._new()
        self._by_key: dict[Hashable, LinearFit] = {}
        self.observed = 0

    def _new(self) -> LinearFit:
        return LinearFit(self._half_life, self.quantile, self._window)

    def observe(self, rows: int, seconds: float, key: Hashable = None) -> None:
        """One batch of ``rows`` rows took ``seconds``."""
        if rows < 1 or not 0 <= seconds < math.inf:
            return  # nothing to learn from (and one inf would poison every prediction)
        with self._lock:
            self._pooled.add(rows, seconds)
            fit = self._by_key.get(key)
            if fit is None:
                fit = self._by_key[key] = self._new()
            fit.add(rows, seconds)
            self.observed += 1

    def curve(self, key: Hashable = None) -> CostCurve | None:
        """The fit for ``key`` (the pooled one until ``key`` has batches); None when cold."""
        with self._lock:
            fit = self._by_key.get(key)
            if fit is None or fit.samples == 0:
                fit = self._pooled
            return fit.curve()

    def predict(self, rows: int, key: Hashable = None) -> float | None:
        """Seconds a batch of ``rows`` takes at the fitted quantile; None before any batch."""
        curve = self.curve(key)
        return None if curve is None else curve.predict(rows)
