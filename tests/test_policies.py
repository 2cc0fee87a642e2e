"""Scale policies against closed-form values, without a model."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_als import policies
from keras_als.policies import ApproxRange, Fixed, MaxSafe, Statistics, _policy_rules, next_scale


def stats(amax, mean_square=None, overflow=None, downstream=(), names=()):
    amax = np.asarray(amax, np.float32)
    return Statistics(
        amax=amax,
        mean_square=np.zeros_like(amax) if mean_square is None else np.float32(mean_square),
        overflow=np.zeros(amax.shape, bool) if overflow is None else np.asarray(overflow),
        downstream=downstream,
        names=names,
    )


def scales(policy, statistics, current):
    return next_scale(policy, statistics, np.asarray(current, np.float32)).numpy()


def test_max_safe_is_the_largest_power_of_two_below_float16_max_with_margin():
    # 65504 / 2 / 1 = 32752 -> 2**14; 65504 / 2 * 2**20 = 2**34.999 -> 2**34.
    np.testing.assert_array_equal(
        scales(MaxSafe(margin=1), stats([1.0, 2.0**-20]), [1.0, 1.0]), [2.0**14, 2.0**34]
    )
    np.testing.assert_array_equal(scales(MaxSafe(margin=0), stats([1.0]), [1.0]), [2.0**15])


def test_max_safe_default_margin_is_six_powers_of_two():
    assert scales(MaxSafe(), stats([1.0]), [1.0])[0] == 2.0**9  # 65504 / 64 = 1023.5 -> 2**9


def test_max_safe_grows_a_blind_scale_by_a_bounded_factor():
    np.testing.assert_array_equal(scales(MaxSafe(), stats([0.0]), [8.0]), [8.0 * 2.0**16])


def test_overflow_backs_off_only_where_it_started():
    statistics = stats([np.inf, np.nan, 1.0], overflow=[True, False, False])
    np.testing.assert_array_equal(
        scales(MaxSafe(margin=1), statistics, [1024.0, 8.0, 1.0]), [64.0, 8.0, 2.0**14]
    )


def test_a_silent_component_keeps_its_scale_instead_of_growing_blind():
    statistics = stats([0.0, 0.0])._replace(silent=np.array([True, False]))
    np.testing.assert_array_equal(
        scales(MaxSafe(), statistics, [8.0, 8.0]), [8.0, 8.0 * policies.BLIND_GROWTH]
    )


def test_scales_stay_within_the_floor_and_ceiling():
    low = scales(MaxSafe(), stats([np.inf], overflow=[True]), [policies.MIN_SCALE])
    high = scales(MaxSafe(), stats([0.0]), [policies.MAX_SCALE])
    huge_gradient = scales(MaxSafe(), stats([3e38]), [1.0])
    assert low[0] == policies.MIN_SCALE
    assert high[0] == policies.MAX_SCALE
    assert huge_gradient[0] == policies.MIN_SCALE


def test_power_of_two_floor_is_exact_on_every_power_of_two_and_just_below():
    exponents = np.arange(-24, 65)
    powers = (2.0**exponents).astype(np.float32)
    np.testing.assert_array_equal(policies.power_of_two_floor(powers).numpy(), powers)
    below = np.nextafter(powers[1:], np.float32(0))
    np.testing.assert_array_equal(policies.power_of_two_floor(below).numpy(), powers[:-1])


def test_erfinv_matches_known_values():
    assert _policy_rules._erfinv(0.5) == pytest.approx(0.4769362762044699, abs=1e-12)
    assert _policy_rules._erfinv(1e-3) == pytest.approx(8.862271574e-4, rel=1e-6)


def test_approx_range_follows_the_paper_with_its_default_bounds():
    z = math.sqrt(2) * _policy_rules._erfinv(1e-3)
    sd = 1e-7
    target = 2.0**-24 / (z * sd)  # 475.9: the scale at 0.1% expected underflow
    assert 256 < target < 512
    # Loss-side component (P = 1): alpha = min(475.9, 16) -> 16.
    assert scales(ApproxRange(), stats([1e-6], [sd**2], downstream=((),)), [1.0])[0] == 16.0
    # Without the bounds: floor to a power of two -> 256.
    unbounded = ApproxRange(max_ratio=None, max_scale=None)
    assert scales(unbounded, stats([1e-6], [sd**2], downstream=((),)), [1.0])[0] == 256.0


def test_approx_range_bounds_each_ratio_and_the_accumulated_scale():
    sd = 1e-12  # target far above every bound
    statistics = stats([1e-11, 1e-11], [sd**2, sd**2], downstream=((), (0,)))
    # Component 1 receives its gradient at component 0's scale (512): 512*16 -> 1024 cap.
    np.testing.assert_array_equal(scales(ApproxRange(), statistics, [512.0, 512.0]), [16.0, 1024.0])
    # alpha >= 1: a component never drops below the scale its gradient arrives with.
    loud = stats([1.0, 1.0], [1.0, 1.0], downstream=((), (0,)))
    np.testing.assert_array_equal(scales(ApproxRange(), loud, [4.0, 1.0]), [1.0, 4.0])


def test_approx_range_never_exceeds_the_overflow_bound():
    statistics = stats([1000.0], [1e-30], downstream=((),))
    unbounded = ApproxRange(max_ratio=None, max_scale=None)
    assert scales(unbounded, statistics, [1.0])[0] == 64.0  # 65504 / 1000 = 65.5 -> 64


def test_fixed_returns_the_named_scales():
    statistics = stats([1.0, 1.0, 1.0], names=("loss", "dense", "conv"))
    policy = Fixed(default=4.0, scales={"dense": 2.0**10, "loss": 0.5})
    np.testing.assert_array_equal(scales(policy, statistics, [1.0] * 3), [0.5, 1024.0, 4.0])


@pytest.mark.parametrize(
    "make",
    [
        lambda: Fixed(scales={"dense": 3.0}),
        lambda: Fixed(default=0.0),
        lambda: MaxSafe(margin=-1),
        lambda: ApproxRange(underflow_rate=0.0),
        lambda: ApproxRange(max_ratio=0.5),
    ],
)
def test_invalid_policy_arguments_raise_value_error(make):
    with pytest.raises(ValueError):
        make()


def test_get_resolves_names_and_rejects_unknown_ones():
    assert policies.get("max_safe") == MaxSafe()
    assert policies.get("approx_range") == ApproxRange()
    policy = MaxSafe(margin=3)
    assert policies.get(policy) is policy
    with pytest.raises(ValueError, match="max_safe"):
        policies.get("dynamic")


finite_or_not = st.one_of(
    st.floats(min_value=0, max_value=3e38, allow_subnormal=True),
    st.sampled_from([0.0, 2.0**-149, 6e-8, np.inf, np.nan, 65504.0]),
)


@settings(max_examples=60, deadline=None)
@given(
    amax=st.lists(finite_or_not, min_size=1, max_size=4),
    current_log2=st.integers(-24, 64),
    mean_square=finite_or_not,
    overflow=st.booleans(),
    policy=st.sampled_from(
        [
            MaxSafe(),
            MaxSafe(margin=4),
            ApproxRange(),
            ApproxRange(max_ratio=None, max_scale=None),
            Fixed(default=2.0**100, scales={"c0": 2.0**-40}),
        ]
    ),
)
def test_any_statistics_give_finite_powers_of_two_within_bounds(
    amax, current_log2, mean_square, overflow, policy
):
    n = len(amax)
    statistics = stats(
        amax,
        [mean_square] * n,
        [overflow] * n,
        downstream=tuple(() for _ in range(n)),
        names=tuple(f"c{i}" for i in range(n)),
    )
    result = scales(policy, statistics, [2.0**current_log2] * n)
    assert np.all(np.isfinite(result))
    assert np.all((result >= policies.MIN_SCALE) & (result <= policies.MAX_SCALE))
    mantissa, _ = np.frexp(result)
    assert np.all(mantissa == 0.5)


# --- headroom learned from overflows (closed-form values) ---------------------


def _headroom(binades, since):
    return policies.Headroom(np.array(binades, np.float32), np.array(since, np.float32))


def test_headroom_decays_one_binade_per_decay_period_and_stops_at_zero():
    h = _headroom([5.0, 1.0], [0.0, 0.0])
    period = policies.HEADROOM_DECAY_STEPS
    for step, expected in [
        (0, [5, 1]),
        (period - 1, [5, 1]),
        (period, [4, 0]),
        (9 * period, [0, 0]),
    ]:
        np.testing.assert_array_equal(policies.headroom_at(h, float(step)).numpy(), expected)


def test_an_overflow_raises_its_origin_by_one_step_and_what_it_passed_to_that_level():
    """Origin 0 (headroom 2) rises to 2 + HEADROOM_STEP; component 1 (reached,
    holding 9) keeps 9; component 2 (reached, 0) rises to the origin's level;
    component 3 (not reached) keeps its 1 and its `since`."""
    h = _headroom([2.0, 9.0, 0.0, 1.0], [0.0, 0.0, 0.0, 5.0])
    reached = np.array([True, True, True, False])
    origin = np.array([True, False, False, False])
    after = policies.after_overflow(h, reached, origin, 100.0)
    level = 2.0 + policies.HEADROOM_STEP
    np.testing.assert_array_equal(after.binades.numpy(), [level, 9.0, level, 1.0])
    np.testing.assert_array_equal(after.since.numpy(), [100.0, 0.0, 100.0, 5.0])


def test_an_overflow_raises_every_other_measured_component_to_one_step():
    """Origin 0; components 1-3 not reached: 1 (measured, 0) rises to
    HEADROOM_STEP, 2 (measured, holding 6) keeps 6, 3 (a first guess) keeps 0.
    A step with no origin (a non-finite loss) raises nothing."""
    h = _headroom([0.0, 0.0, 6.0, 0.0], [0.0, 0.0, 0.0, 0.0])
    reached = np.array([True, False, False, False])
    measured = np.array([True, True, True, False])
    after = policies.after_overflow(h, reached, reached, 50.0, measured=measured)
    step = policies.HEADROOM_STEP
    np.testing.assert_array_equal(after.binades.numpy(), [step, step, 6.0, 0.0])
    np.testing.assert_array_equal(after.since.numpy(), [50.0, 50.0, 0.0, 0.0])
    nothing = np.zeros(4, bool)
    kept = policies.after_overflow(h, nothing, nothing, 50.0, measured=measured)
    np.testing.assert_array_equal(kept.binades.numpy(), h.binades)
    np.testing.assert_array_equal(kept.since.numpy(), h.since)


def test_an_overflow_passing_a_component_that_holds_more_headroom_adds_none_to_it():
    """Chain 0 <- 1 <- 2 (0 furthest upstream). Two overflows start at 0 (it
    needs 8 binades); then one starts at 2 and passes 1 and 0: 2 and 1 rise to
    4, and 0 keeps 8 (adding a step per passing overflow would make it 12)."""
    h = _headroom([0.0, 0.0, 0.0], [0.0, 0.0, 0.0])
    chain = np.arange(3)
    for step, start in enumerate([0, 0, 2]):
        h = policies.after_overflow(h, chain <= start, chain == start, float(step))
    step = policies.HEADROOM_STEP
    np.testing.assert_array_equal(h.binades.numpy(), [2 * step, step, step])
    np.testing.assert_array_equal(h.since.numpy(), [1.0, 2.0, 2.0])


def test_an_overflow_backs_off_by_backoff_and_at_least_to_the_last_finite_measured_scale():
    """Steady (measured at 2**20, now 2**20): 2**16. Raised far by the last
    measurement (2**15 then, 2**30 now): back to 2**15. Raised by less than
    BACKOFF (2**19 then, 2**20 now): 2**16. Never measured (MAX_SCALE): 2**16.
    A scale that is not a power of two (3 * 2**20) is floored: 2**17."""
    scale = np.array([2.0**20, 2.0**30, 2.0**20, 2.0**20, 3 * 2.0**20], np.float32)
    safe = np.array([2.0**20, 2.0**15, 2.0**19, policies.MAX_SCALE, 2.0**30], np.float32)
    np.testing.assert_array_equal(
        policies.back_off(scale, safe).numpy(), [2.0**16, 2.0**15, 2.0**16, 2.0**16, 2.0**17]
    )
    assert policies.BACKOFF == 2.0**-4


def test_before_the_first_update_a_measurement_lowers_scales_and_raises_none():
    """Proposed 2**30, 2**10, 2**15 at scales 2**15: before any update 2**15,
    2**10, 2**15; once updated the proposal itself."""
    proposed = np.array([2.0**30, 2.0**10, 2.0**15], np.float32)
    scale = np.full(3, 2.0**15, np.float32)
    before = policies.rise_after_first_update(proposed, scale, updated=False).numpy()
    after = policies.rise_after_first_update(proposed, scale, updated=True).numpy()
    np.testing.assert_array_equal(before, [2.0**15, 2.0**10, 2.0**15])
    np.testing.assert_array_equal(after, proposed)


def test_headroom_is_capped():
    h = _headroom([policies.MAX_HEADROOM - 1.0], [0.0])
    after = policies.after_overflow(h, np.array([True]), np.array([True]), 1.0)
    assert after.binades.numpy()[0] == policies.MAX_HEADROOM


def test_the_policy_plans_for_gradients_two_to_the_headroom_times_larger():
    """max_safe with amax 1: the scale with 4 binades of headroom is 2**-4 of the one without."""
    statistics = stats([1.0, 1.0])
    scale = np.array([1.0, 1.0], np.float32)
    plain = next_scale(MaxSafe(), statistics, scale).numpy()
    held = next_scale(
        MaxSafe(), statistics, scale, headroom=np.array([0.0, 4.0], np.float32)
    ).numpy()
    assert held[0] == plain[0] and held[1] == plain[1] * 2.0**-4


def test_an_overflow_in_a_chain_starts_at_the_reached_component_furthest_downstream():
    """Chain loss 0 <- 1 <- 2 <- 3 (3 furthest upstream): an overflow in 1
    reaches 1, 2 and 3 and started in 1 alone."""
    downstream = ((), (0,), (1,), (2,))
    reached = np.array([False, True, True, True])
    origins = policies.overflow_origins(reached, downstream).numpy()
    np.testing.assert_array_equal(origins, [False, True, False, False])


def test_an_overflow_in_a_residual_stream_starts_in_its_whole_reached_group():
    """A transformer: loss 0 <- head 1 <- residual stream 2, which feeds the
    branches 3 (attention) and 4 (MLP) whose outputs join it again, <- patch
    embedding 5. Components 2-4 lie on cycles: one group. An overflow that
    reaches 2, 3, 4 and 5 started in the group (2, 3, 4), not in 5; with no
    cycle detection no component would be an origin (each has a reached one
    downstream)."""
    downstream = ((), (0,), (1, 3, 4), (2,), (2,), (2,))
    reached = np.array([False, False, True, True, True, True])
    origins = policies.overflow_origins(reached, downstream).numpy()
    np.testing.assert_array_equal(origins, [False, False, True, True, True, False])
    only_stream = np.array([False, False, True, False, False, True])
    np.testing.assert_array_equal(
        policies.overflow_origins(only_stream, downstream).numpy(),
        [False, False, True, False, False, False],
    )


def test_of_two_groups_in_series_an_overflow_starts_in_the_one_downstream():
    """Groups {1, 2} and {3, 4} (each a stream and its branch), 3 fed by 1:
    an overflow reaching both groups started in {1, 2}; reaching none, nowhere."""
    downstream = ((), (0, 2), (1,), (1, 4), (3,))
    reached = np.array([False, True, True, True, True])
    np.testing.assert_array_equal(
        policies.overflow_origins(reached, downstream).numpy(),
        [False, True, True, False, False],
    )
    nothing = np.zeros(5, bool)
    assert not policies.overflow_origins(nothing, downstream).numpy().any()
