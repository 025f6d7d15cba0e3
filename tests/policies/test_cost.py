"""The cost model: weighted least squares of seconds on rows, forgetting, a quantile margin,
one fit per collation key. Pure arithmetic: every test feeds exact seconds, no clock."""

from __future__ import annotations

import dataclasses
import math
import threading

import pytest

from carpool.policies.cost import CostCurve, CostModel, LinearFit

# A batch costs 4 ms, plus 0.5 ms per row.
FIXED, PER_ROW = 0.004, 0.0005

# With this half-life the previous batches weigh 2**-100 against the newest one: the fit is
# the last batch alone, so each measured/fitted ratio is simply s[k] / s[k-1].
MEMORYLESS = 0.01


def line(rows: int, fixed: float = FIXED, per_row: float = PER_ROW) -> float:
    return fixed + per_row * rows


def feed_ratios(model: CostModel, ratios: list[float], start: float = 1.0) -> float:
    """Batches of one row whose measured/fitted ratios are exactly ``ratios`` (a memoryless
    model); the last batch's seconds."""
    seconds = start
    model.observe(1, seconds)
    for ratio in ratios:
        seconds *= ratio
        model.observe(1, seconds)
    return seconds


# cold


def test_a_cold_model_predicts_nothing() -> None:
    model = CostModel()
    assert model.curve() is None
    assert model.curve("any key") is None
    assert model.predict(4) is None
    assert model.predict(4, key="any key") is None
    assert model.observed == 0


def test_a_fresh_linear_fit_has_no_curve() -> None:
    fit = LinearFit(half_life=200.0, quantile=0.9, window=256)
    assert fit.curve() is None
    assert fit.samples == 0


# the fit


def test_exact_fit_on_noiseless_linear_data() -> None:
    model = CostModel()
    sizes = [1, 2, 4, 8, 16, 32] * 3
    for rows in sizes:
        model.observe(rows, line(rows))
    curve = model.curve()
    assert curve is not None
    assert curve.fixed_s == pytest.approx(FIXED, rel=1e-9)
    assert curve.per_row_s == pytest.approx(PER_ROW, rel=1e-9)
    assert curve.samples == model.observed == 18
    # after the first two sizes every prediction was right: no margin beyond rounding
    assert curve.margin == pytest.approx(1.0, rel=1e-12)
    assert model.predict(10) == pytest.approx(0.009, rel=1e-9)
    assert model.predict(64) == pytest.approx(0.036, rel=1e-9)


def test_one_batch_size_is_all_fixed_cost() -> None:
    model = CostModel()
    for _ in range(3):
        model.observe(8, 0.012)
    curve = model.curve()
    assert curve is not None
    assert curve.fixed_s == pytest.approx(0.012, rel=1e-12)
    assert curve.per_row_s == 0.0
    assert model.predict(8) == pytest.approx(0.012, rel=1e-12)  # right where it was measured
    # a cold start errs towards admitting: more rows are predicted no slower
    assert model.predict(1) == model.predict(8) == model.predict(32) == curve.fixed_s


def test_a_linear_fit_of_one_batch_is_that_batch_as_fixed_cost() -> None:
    fit = LinearFit(half_life=200.0, quantile=0.9, window=256)
    fit.add(8, 0.012)
    assert fit.curve() == CostCurve(fixed_s=0.012, per_row_s=0.0, margin=1.0, samples=1)


def test_the_first_batch_of_another_size_corrects_the_all_fixed_guess() -> None:
    # The truth is 4 ms + 1 ms per row: 12 ms at 8 rows, 5 ms at 1 row.
    model = CostModel()
    for _ in range(3):
        model.observe(8, 0.012)
    assert model.predict(1) == model.predict(8)  # the guess: all fixed
    model.observe(1, 0.005)
    curve = model.curve()
    assert curve is not None
    assert (curve.fixed_s, curve.per_row_s) == pytest.approx((0.004, 0.001), rel=1e-9)


def test_one_batch_size_uses_the_decayed_mean_of_its_times() -> None:
    # half_life=1: the older batch weighs 1/2 against the newer one.
    model = CostModel(half_life=1.0)
    model.observe(4, 0.010)
    model.observe(4, 0.020)
    mean = (0.010 * 0.5 + 0.020) / 1.5
    curve = model.curve()
    assert curve is not None
    assert curve.fixed_s == pytest.approx(mean, rel=1e-12)
    assert curve.per_row_s == 0.0


def test_more_rows_never_take_less_time() -> None:
    model = CostModel()
    model.observe(1, 0.020)
    model.observe(8, 0.010)  # faster with more rows: noise, not a negative slope
    decay = 0.5 ** (1 / 200)
    curve = model.curve()
    assert curve is not None
    assert curve.per_row_s == 0.0
    assert curve.fixed_s == pytest.approx((0.020 * decay + 0.010) / (decay + 1), rel=1e-12)
    assert model.predict(1) == model.predict(100)


def test_the_fixed_cost_is_never_negative() -> None:
    model = CostModel()
    model.observe(1, 0.001)
    model.observe(2, 0.010)  # the line through both crosses zero rows at -8 ms
    curve = model.curve()
    assert curve is not None
    assert curve.fixed_s == 0.0
    assert curve.per_row_s == pytest.approx(0.009, rel=1e-9)


@pytest.mark.parametrize("half_life", [2.0, 8.0])
def test_after_a_drift_the_fit_follows_the_new_line_within_ten_half_lives(
    half_life: float,
) -> None:
    # After n = 10 half-lives the old batches weigh 2**-10 of the total: under 0.1 %.
    model = CostModel(half_life=half_life)
    for i in range(200):
        rows = 1 if i % 2 else 9
        model.observe(rows, line(rows, 0.010, 0.001))
    before = model.curve()
    assert before is not None
    assert before.fixed_s == pytest.approx(0.010, rel=1e-9)
    assert before.per_row_s == pytest.approx(0.001, rel=1e-9)
    for i in range(int(10 * half_life)):
        rows = 1 if i % 2 else 9
        model.observe(rows, line(rows, 0.002, 0.004))
    after = model.curve()
    assert after is not None
    assert after.fixed_s == pytest.approx(0.002, rel=1e-2)
    assert after.per_row_s == pytest.approx(0.004, rel=1e-2)


def test_without_forgetting_the_fit_stays_between_the_old_and_the_new_line() -> None:
    model = CostModel(half_life=1e12)
    for i in range(200):
        rows = 1 if i % 2 else 9
        model.observe(rows, line(rows, 0.010, 0.001))
    for i in range(20):
        rows = 1 if i % 2 else 9
        model.observe(rows, line(rows, 0.002, 0.004))
    curve = model.curve()
    assert curve is not None
    # weights 200:20, so the fit is the weighted mean of the two lines
    assert curve.fixed_s == pytest.approx((200 * 0.010 + 20 * 0.002) / 220, rel=1e-6)
    assert curve.per_row_s == pytest.approx((200 * 0.001 + 20 * 0.004) / 220, rel=1e-6)


# the margin


def test_the_margin_needs_eight_ratios() -> None:
    model = CostModel(half_life=MEMORYLESS)
    last = feed_ratios(model, [2.0] * 7)  # 8 batches, 7 ratios: the first had no fit
    curve = model.curve()
    assert curve is not None
    assert (curve.margin, curve.samples) == (1.0, 8)
    assert (curve.fixed_s, curve.per_row_s) == (last, 0.0)  # the last batch alone, all fixed
    model.observe(1, last * 2.0)
    curve = model.curve()
    assert curve is not None
    assert (curve.margin, curve.samples) == (2.0, 9)
    assert model.predict(1) == pytest.approx(last * 2.0 * 2.0, rel=1e-12)
    assert model.predict(3) == model.predict(1)  # one size seen: no cost per row


@pytest.mark.parametrize(
    ("quantile", "margin"),
    [(0.9, 1.9), (0.75, 1.7), (0.5, 1.5)],  # index int(q * 9) of the 10 sorted ratios
)
def test_the_margin_is_the_quantile_of_recent_ratios(quantile: float, margin: float) -> None:
    model = CostModel(quantile=quantile, half_life=MEMORYLESS)
    ratios = [1.4, 2.0, 1.1, 1.8, 1.3, 1.9, 1.2, 1.6, 1.5, 1.7]
    feed_ratios(model, ratios)
    curve = model.curve()
    assert curve is not None
    assert curve.margin == pytest.approx(margin, rel=1e-12)


def test_the_margin_is_never_below_one() -> None:
    model = CostModel(half_life=MEMORYLESS)
    feed_ratios(model, [0.5] * 20)  # every batch faster than the fit predicted
    curve = model.curve()
    assert curve is not None
    assert curve.margin == 1.0


def test_the_margin_window_keeps_only_the_latest_ratios() -> None:
    model = CostModel(half_life=MEMORYLESS, window=8)
    last = feed_ratios(model, [3.0] * 8)
    curve = model.curve()
    assert curve is not None
    assert curve.margin == pytest.approx(3.0, rel=1e-12)
    feed_ratios(model, [1.25] * 8, start=last)  # ratio last/last = 1, then 1.25s
    curve = model.curve()
    assert curve is not None
    assert curve.margin == pytest.approx(1.25, rel=1e-12)  # the 3.0s left the window


# per key


def test_each_key_gets_its_own_fit_and_unseen_keys_get_the_pooled_one() -> None:
    model = CostModel()
    pooled = CostModel()
    for rows in [1, 8, 1, 8]:
        for key, fixed, per_row in [("short", 0.002, 0.0001), ("long", 0.010, 0.002)]:
            model.observe(rows, line(rows, fixed, per_row), key)
            pooled.observe(rows, line(rows, fixed, per_row))  # everything under key None
    short, long = model.curve("short"), model.curve("long")
    assert short is not None
    assert long is not None
    assert (short.fixed_s, short.per_row_s) == pytest.approx((0.002, 0.0001), rel=1e-9)
    assert (long.fixed_s, long.per_row_s) == pytest.approx((0.010, 0.002), rel=1e-9)
    assert (short.samples, long.samples) == (4, 4)
    # a key never seen, and the default key, fall back to the fit of every batch
    assert model.curve("medium") == pooled.curve() == model.curve()
    assert model.predict(5, "medium") == pooled.predict(5)
    assert model.observed == 8


def test_a_key_has_its_own_fit_from_its_first_batch() -> None:
    model = CostModel()
    model.observe(8, 0.016, "a")
    model.observe(1, 0.002, "a")
    model.observe(4, 0.100, "b")  # one batch only: all of its time is fixed cost
    b = model.curve("b")
    assert b is not None
    assert (b.fixed_s, b.per_row_s, b.samples) == (0.100, 0.0, 1)


# input the model ignores


@pytest.mark.parametrize(("rows", "seconds"), [(0, 0.01), (-3, 0.01), (1, -0.001), (1, math.nan)])
def test_batches_without_rows_or_with_bad_seconds_are_ignored(rows: int, seconds: float) -> None:
    model = CostModel()
    model.observe(rows, seconds)
    assert model.observed == 0
    assert model.curve() is None


def test_infinite_seconds_are_ignored() -> None:
    # A measured duration is finite; one inf would make every later prediction inf (or nan),
    # and an admitting policy would then refuse everything forever.
    model = CostModel()
    model.observe(1, 0.010)
    model.observe(1, math.inf)
    assert model.observed == 1
    assert model.predict(1) == pytest.approx(0.010, rel=1e-12)


def test_a_batch_of_zero_seconds_counts() -> None:
    model = CostModel()
    model.observe(3, 0.0)
    curve = model.curve()
    assert curve is not None
    assert (curve.fixed_s, curve.per_row_s, curve.margin, curve.samples) == (0.0, 0.0, 1.0, 1)


# threads


def test_many_threads_observing_lose_no_batch() -> None:
    model = CostModel()
    threads_n, each = 8, 400
    start = threading.Barrier(threads_n)

    def observe(index: int) -> None:
        start.wait()
        for i in range(each):
            rows = 1 + (i + index) % 16
            model.observe(rows, line(rows), key=index % 2)
            model.curve(index % 2)  # readers interleave with writers

    threads = [threading.Thread(target=observe, args=(i,)) for i in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert model.observed == threads_n * each
    for key in (0, 1):
        curve = model.curve(key)
        assert curve is not None
        assert curve.samples == threads_n * each // 2
        assert curve.fixed_s == pytest.approx(FIXED, rel=1e-6)
        assert curve.per_row_s == pytest.approx(PER_ROW, rel=1e-6)
    pooled = model.curve("unseen")
    assert pooled is not None
    assert pooled.samples == threads_n * each


# validation


@pytest.mark.parametrize("quantile", [0.4, 1.0, 1.5, -0.9, math.nan])
def test_quantile_must_be_in_half_to_one(quantile: float) -> None:
    with pytest.raises(ValueError, match="quantile") as info:
        CostModel(quantile=quantile)
    assert str(info.value) == f"quantile must be in [0.5, 1), got {quantile!r}"


@pytest.mark.parametrize("half_life", [0.0, -1.0, math.nan])
def test_half_life_must_be_positive(half_life: float) -> None:
    with pytest.raises(ValueError, match="half_life") as info:
        CostModel(half_life=half_life)
    assert str(info.value) == f"half_life must be > 0 batches, got {half_life!r}"


def test_the_edges_of_the_valid_range_are_accepted() -> None:
    assert CostModel(quantile=0.5).quantile == 0.5
    assert CostModel(quantile=0.99, half_life=1e-3).quantile == 0.99


@pytest.mark.parametrize("window", [-1, 0, 7])
def test_window_must_hold_the_eight_ratios_the_margin_needs(window: int) -> None:
    # Below 8 the margin can never apply (it needs 8 ratios), and -1 fails inside deque
    # with a message that does not name the argument.
    with pytest.raises(ValueError, match="window"):
        CostModel(window=window)


# the curve value


def test_cost_curve_predicts_and_prints_in_milliseconds() -> None:
    curve = CostCurve(fixed_s=0.004, per_row_s=0.0005, margin=1.25, samples=12)
    assert curve.predict(8) == pytest.approx(0.010, rel=1e-12)
    assert str(curve) == "t(b) = 4.00 ms + 0.500 ms x b (x1.25 margin, 12 batches)"
    with pytest.raises(dataclasses.FrozenInstanceError):
        curve.margin = 1.0  # type: ignore[misc]


def test_a_curve_is_a_snapshot_kept_until_the_next_batch() -> None:
    model = CostModel()
    model.observe(2, 0.004)
    first = model.curve()
    assert model.curve() is first
    model.observe(4, 0.006)
    second = model.curve()
    assert second is not first
    assert first is not None
    assert second is not None
    assert (first.samples, second.samples) == (1, 2)
