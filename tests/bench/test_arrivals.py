"""Send offsets (``carpool.bench.arrivals``): Poisson, counted, bursty, from a trace file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import carpool.bench.arrivals as arrivals
from carpool.bench.arrivals import (
    bursty_offsets,
    count_offsets,
    poisson_offsets,
    read_trace,
)

# Poisson arrivals


def test_poisson_offsets_are_exponential_gaps_from_the_seed() -> None:
    offsets = poisson_offsets(100.0, 10.0, seed=3)
    gaps = np.random.default_rng(3).exponential(0.01, size=offsets.size + 1)
    expected = np.cumsum(gaps)
    assert offsets.dtype == np.float64
    np.testing.assert_array_equal(offsets, expected[: offsets.size])
    assert offsets[-1] < 10.0 <= expected[offsets.size]  # cut exactly at the duration


def test_poisson_offsets_ascending_within_the_duration_at_about_the_rate() -> None:
    offsets = poisson_offsets(1000.0, 20.0, seed=0)
    assert np.all(np.diff(offsets) > 0)
    assert offsets[0] > 0
    assert offsets[-1] < 20.0
    assert abs(offsets.size - 20_000) < 5 * np.sqrt(20_000)  # Poisson: sd = sqrt(mean)


def test_poisson_offsets_repeat_with_the_seed_and_differ_without_it() -> None:
    a = poisson_offsets(50.0, 5.0, seed=1)
    np.testing.assert_array_equal(a, poisson_offsets(50.0, 5.0, seed=1))
    b = poisson_offsets(50.0, 5.0, seed=2)
    assert a.size != b.size or not np.array_equal(a, b)


def test_poisson_offsets_drawn_in_several_chunks_match_one_draw(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    whole = poisson_offsets(100.0, 10.0, seed=5)
    monkeypatch.setattr(arrivals, "_SLACK_SIGMAS", -20.0)  # first chunk falls ~600 arrivals short
    np.testing.assert_array_equal(poisson_offsets(100.0, 10.0, seed=5), whole)


def test_poisson_offsets_with_a_rate_too_low_for_one_arrival() -> None:
    offsets = poisson_offsets(1e-9, 1.0, seed=0)
    assert offsets.dtype == np.float64
    assert offsets.size == 0


@pytest.mark.parametrize(
    ("rate", "duration", "message"),
    [
        (0, 1.0, "rate must be a finite number > 0, got 0"),
        (-1.0, 1.0, "rate must be"),
        (float("inf"), 1.0, "rate must be"),
        (float("nan"), 1.0, "rate must be"),
        (True, 1.0, "rate must be"),
        (10.0, 0.0, "duration_s must be a finite number > 0, got 0.0"),
    ],
)
def test_poisson_offsets_refuse(rate: float, duration: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        poisson_offsets(rate, duration, seed=0)


def test_count_offsets_are_the_first_of_poisson_offsets() -> None:
    long = poisson_offsets(200.0, 60.0, seed=9)
    counted = count_offsets(200.0, 500, seed=9)
    assert counted.size == 500
    assert counted.dtype == np.float64
    np.testing.assert_array_equal(counted, long[:500])


def test_count_offsets_zero_and_refusals() -> None:
    assert count_offsets(10.0, 0, seed=0).size == 0
    with pytest.raises(ValueError, match="count must be an int >= 0, got -1"):
        count_offsets(10.0, -1, seed=0)
    with pytest.raises(ValueError, match=r"count must be an int >= 0, got 2\.5"):
        count_offsets(10.0, 2.5, seed=0)  # type: ignore[arg-type]


# Bursts


def test_bursty_offsets_alternate_high_and_silent_phases() -> None:
    offsets = bursty_offsets(1000.0, 0.0, 1.0, 5.0, seed=4)
    phase = np.floor(offsets).astype(int)
    assert set(phase.tolist()) == {0, 2, 4}  # high first, low phases silent
    assert np.all(np.diff(offsets) > 0)
    assert offsets[-1] < 5.0
    for k in (0, 2, 4):
        assert abs(np.count_nonzero(phase == k) - 1000) < 5 * np.sqrt(1000)


def test_bursty_offsets_low_rate_and_a_cut_last_phase() -> None:
    offsets = bursty_offsets(2000.0, 200.0, 2.0, 7.0, seed=1)  # phases 0-2 hi, 2-4 lo, ...
    counts = np.bincount(np.floor(offsets / 2.0).astype(int), minlength=4)
    assert offsets[-1] < 7.0
    assert abs(counts[0] - 4000) < 5 * np.sqrt(4000)
    assert abs(counts[1] - 400) < 5 * np.sqrt(400)
    assert abs(counts[3] - 200) < 5 * np.sqrt(200)  # the last phase, [6, 7), is low and half
    np.testing.assert_array_equal(offsets, bursty_offsets(2000.0, 200.0, 2.0, 7.0, seed=1))


def test_bursty_offsets_refuse() -> None:
    with pytest.raises(ValueError, match="low_rate must be a finite number >= 0, got -1"):
        bursty_offsets(10.0, -1, 1.0, 5.0, seed=0)
    with pytest.raises(ValueError, match="period_s must be"):
        bursty_offsets(10.0, 1.0, 0.0, 5.0, seed=0)
    with pytest.raises(ValueError, match="high_rate must be"):
        bursty_offsets(0.0, 1.0, 1.0, 5.0, seed=0)


# Trace files


def _trace(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


def test_read_trace_without_header_is_seconds_sorted_not_shifted(tmp_path: Path) -> None:
    offsets = read_trace(_trace(tmp_path, "0.5\n0.25\n\n1.75\n2\n"))
    assert offsets.dtype == np.float64
    assert offsets.tolist() == [0.25, 0.5, 1.75, 2.0]


def test_read_trace_offset_s_column_among_others(tmp_path: Path) -> None:
    text = "request_id,offset_s,note\na,0.5,x\nb,0,y\nc,0.25,z\n"
    assert read_trace(_trace(tmp_path, text)).tolist() == [0.0, 0.25, 0.5]


def test_read_trace_offset_ms_is_milliseconds(tmp_path: Path) -> None:
    text = " offset_ms \n250\n1000\n0\n"
    assert read_trace(_trace(tmp_path, text)).tolist() == [0.0, 0.25, 1.0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "holds no offsets"),
        ("\n\n", "holds no offsets"),
        ("offset_s\n", "holds a header but no offsets"),
        ("0.1\n-0.5\n", r"line 2: expected an offset, a number >= 0, got '-0.5'"),
        ("0.1\n\nsoon\n", r"line 3: expected an offset, a number >= 0, got 'soon'"),
        ("0.1\nnan\n", r"line 2: .* got 'nan'"),
        ("0.1\ninf\n", r"line 2: .* got 'inf'"),
        ("x,offset_s\n1,2\n3\n", r"line 3: .* got ''"),  # a short row
        ("time,id\n1,2\n", r"line 1: the header must name one column offset_s .* got time, id"),
        ("offset_s,offset_ms\n1,2\n", "line 1: the header must name one column"),
        ("1,2\n", "line 1: 2 columns but no header"),
    ],
)
def test_read_trace_refuses(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_trace(_trace(tmp_path, text))


def test_read_trace_names_the_file(tmp_path: Path) -> None:
    path = _trace(tmp_path, "x\n")
    with pytest.raises(ValueError, match=f"trace '{path}', line 1"):
        read_trace(path)


def test_read_trace_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_trace(tmp_path / "nope.csv")
