"""What a step costs and how fast slots free up, learnt as steps run; pure (no clock of its own).

The adaptive policy asks it, on arrival, when a new sequence's first output would come:
the wait for a slot, plus one start, plus one step with one more sequence aboard.
"""

from __future__ import annotations

__all__ = ["StepCost"]


class StepCost:
    """A line ``seconds = fixed + per_sequence * n`` fitted to recent steps, and the rate at
    which sequences leave, each forgetting old steps at ``decay`` per step."""

    def __init__(self, decay: float = 0.98) -> None:
        self.decay = decay
        self._w = self._n = self._t = self._nn = self._nt = 0.0
        self._leaves = 0.0  # decayed sequences left
        self._busy = 0.0  # decayed seconds spent stepping

    @property
    def steps_seen(self) -> float:
        return self._w

    def observe(self, sequences: int, seconds: float, left: int) -> None:
        """One step: how many sequences it carried, how long it took, how many then left."""
        d = self.decay
        n = float(sequences)
        self._w = self._w * d + 1
        self._n = self._n * d + n
        self._t = self._t * d + seconds
        self._nn = self._nn * d + n * n
        self._nt = self._nt * d + n * seconds
        self._leaves = self._leaves * d + left
        self._busy = self._busy * d + seconds

    def line(self) -> tuple[float, float]:
        """(fixed seconds, seconds per sequence); a flat line until sizes have varied."""
        if self._w == 0:
            return 0.0, 0.0
        mean_n, mean_t = self._n / self._w, self._t / self._w
        var = self._nn / self._w - mean_n * mean_n
        if var <= 1e-9:
            return mean_t, 0.0
        slope = max((self._nt / self._w - mean_n * mean_t) / var, 0.0)
        return max(mean_t - slope * mean_n, 0.0), slope

    def step_seconds(self, sequences: int) -> float:
        fixed, per = self.line()
        return fixed + per * sequences

    def leave_rate(self) -> float:
        """Sequences that leave per second of stepping (0 until one has)."""
        return self._leaves / self._busy if self._busy > 0 else 0.0

    def first_output_seconds(self, ahead: int, free: int, active: int) -> float:
        """Predicted wait for a new sequence's first output, with ``ahead`` waiting before it,
        ``free`` slots free now and ``active`` sequences stepping."""
        wait = 0.0
        rate = self.leave_rate()
        if ahead >= free and rate > 0:  # before any has left, the wait is not known yet
            wait = (ahead - free + 1) / rate
        return wait + 2 * self.step_seconds(active + 1)  # its start, then its first step
