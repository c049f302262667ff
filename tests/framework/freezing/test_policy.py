from __future__ import annotations

import json

import pytest

from framework.freezing import FreezingPolicy, FreezingPolicyConfig, least_squares_slope, scaled_defaults


def _policy(window: int = 2, num_modules: int = 3) -> FreezingPolicy:
    policy = FreezingPolicy(num_modules, FreezingPolicyConfig(window=window))
    policy.force(0)  # leave bootstrapping without freezing anything
    return policy


def test_least_squares_slope_of_a_line_and_of_short_series():
    assert least_squares_slope([1.0, 3.0, 5.0, 7.0]) == pytest.approx(2.0)
    assert least_squares_slope([4.0]) == 0.0
    assert least_squares_slope([1.0, 2.0, 1.0, 2.0]) == pytest.approx(0.2)


def test_policy_bootstrapping_ends_when_loss_change_rate_drops_below_ten_percent():
    policy = FreezingPolicy(3, FreezingPolicyConfig(window=1))
    # change rates: 0.25, 0.2, 1/12 < 0.1
    ended = [policy.on_loss(x) for x in (2.0, 1.5, 1.2, 1.1)]
    assert ended == [False, False, False, True]
    assert not policy.bootstrapping and policy.active == 0


def test_policy_bootstrapping_compares_adjacent_windows_of_the_loss():
    policy = FreezingPolicy(3, FreezingPolicyConfig(window=2))
    # windows of 2: (2.0, 1.0) -> (1.0, 0.8): 1.5 -> 0.9, rate 0.4; (1.0, 1.0) -> (0.8, 0.9): 1.0 -> 0.85, rate 0.15;
    # (1.0, 0.8) -> (0.9, 0.9): 0.9 -> 0.9, rate 0 < 0.1. The first three calls cannot end it (fewer than 2W means).
    ended = [policy.on_loss(x) for x in (2.0, 1.0, 1.0, 0.8, 0.9, 0.9)]
    assert ended == [False, False, False, False, False, True]
    assert policy.previous_loss == pytest.approx(0.9)


def test_policy_bootstrapping_never_ends_before_two_windows():
    policy = FreezingPolicy(3, FreezingPolicyConfig(window=10))
    assert [policy.on_loss(1.0) for _ in range(20)] == [False] * 19 + [True]


def test_scaled_defaults_reduce_to_the_paper_at_its_run_length():
    paper = scaled_defaults(78_000)
    assert (paper.eval_interval, paper.window, paper.earliest_bootstrap_end) == (300, 10, 6000)
    short = scaled_defaults(552, window=5)
    assert (short.eval_interval, short.window, short.earliest_bootstrap_end) == (2, 5, 20)
    assert scaled_defaults(10).eval_interval == 1 and short.policy().window == 5


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"total_steps": 0}, ValueError, "`total_steps` is 0, but must be >= 1"),
        ({"total_steps": 100, "window": 2.5}, TypeError, "`window` is 2.5, but must be an int"),
    ],
)
def test_scaled_defaults_validation(kwargs, error, message):
    with pytest.raises(error, match=message):
        scaled_defaults(**kwargs)


def test_policy_ignores_plasticity_while_bootstrapping():
    policy = FreezingPolicy(3, FreezingPolicyConfig(window=1))
    assert policy.active is None
    assert not any(policy.on_plasticity(0, 1.0, lr=0.1) for _ in range(10))
    assert policy.frozen == 0


def test_policy_freezes_exactly_when_scripted_plasticity_becomes_flat():
    # W = 2. raw 10 8 6 4 4 4 4 -> moving average 10 9 7 5 4 4 4
    # slopes (last 2 smoothed) from reading 2: -1 -2 -2 -1 0 0; tolerance = 0.2 * max(1, 2, 2) = 0.4 at reading 4
    # |slope| <= 0.4 at readings 6 and 7 -> W = 2 consecutive -> freeze at reading 7
    policy = _policy(window=2)
    froze = [policy.on_plasticity(0, p, lr=0.1) for p in (10, 8, 6, 4, 4, 4, 4)]
    assert froze == [False] * 6 + [True]
    assert policy.tolerance is None  # history reset for the next module
    assert policy.frozen == 1 and policy.active == 1 and policy.lr_at_first_freeze == 0.1


def test_policy_never_freezes_a_still_falling_series():
    policy = _policy(window=2)
    assert not any(policy.on_plasticity(0, 100.0 - 5 * i, lr=0.1) for i in range(15))


def test_policy_ignores_stale_readings_of_another_module():
    policy = _policy(window=2)
    assert not policy.on_plasticity(1, 1.0, lr=0.1)
    assert policy.raw == []


def test_policy_unfreezes_on_tenfold_lr_drop_at_exact_evaluation_and_halves_window():
    policy = _policy(window=2)
    for p in (10, 8, 6, 4, 4, 4, 4):
        policy.on_plasticity(0, p, lr=0.1)
    lrs = [0.1, 0.1, 0.05, 0.02, 0.011, 0.01, 0.001]  # first lr <= 0.1 / 10 at evaluation 6
    unfroze = [policy.on_lr(lr) for lr in lrs]
    assert unfroze == [False] * 5 + [True, False]
    assert policy.frozen == 0 and policy.window == 1 and policy.lr_at_first_freeze is None


def test_policy_refreezes_faster_with_halved_window():
    policy = _policy(window=2)
    for p in (10, 8, 6, 4, 4, 4, 4):
        policy.on_plasticity(0, p, lr=0.1)
    policy.on_lr(0.01)
    # W = 1: smoothed = raw, slopes over last 2: -2 -2 -2 0 -> tolerance 0.4 at reading 4, then reading 5 is flat
    froze = [policy.on_plasticity(0, p, lr=0.01) for p in (10, 8, 6, 4, 4)]
    assert froze == [False, False, False, False, True]


def test_policy_keeps_the_last_module_trainable():
    policy = _policy(window=1, num_modules=2)
    for _ in range(10):
        policy.on_plasticity(policy.active if policy.active is not None else 0, 1.0, lr=0.1)
    assert policy.frozen == 1 and policy.active is None


def test_policy_state_dict_round_trip_is_json():
    policy = _policy(window=3)
    for p in (5, 4, 3.5, 3.2):
        policy.on_plasticity(0, p, lr=0.1)
    state = json.loads(json.dumps(policy.state_dict()))
    other = FreezingPolicy(3)
    other.load_state_dict(state)
    assert other.state_dict() == policy.state_dict()
    assert [other.on_plasticity(0, p, lr=0.1) for p in (3, 3, 3, 3, 3)] == [
        policy.on_plasticity(0, p, lr=0.1) for p in (3, 3, 3, 3, 3)
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window": 0}, "`window` is 0, but must be >= 1"),
        ({"tolerance_readings": 0}, "`tolerance_readings` is 0, but must be >= 1"),
        ({"tolerance_fraction": 1.5}, r"`tolerance_fraction` is 1.5, but must be in \(0, 1\]"),
        ({"bootstrap_change_rate": -0.1}, "`bootstrap_change_rate` is -0.1, but must be >= 0"),
        ({"lr_drop_factor": 1.0}, "`lr_drop_factor` is 1.0, but must be > 1"),
        ({"max_frozen": -1}, "`max_frozen` is -1, but must be >= 0 or None"),
    ],
)
def test_policy_config_validation_names_parameter_value_and_rule(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FreezingPolicyConfig(**kwargs)


def test_policy_config_rejects_non_int_window():
    with pytest.raises(TypeError, match=r"`window` is 2.5, but must be an int"):
        FreezingPolicyConfig(window=2.5)


def test_policy_rejects_zero_modules():
    with pytest.raises(ValueError, match="`num_modules` is 0, but must be >= 1"):
        FreezingPolicy(0)


def test_policy_force_sets_the_prefix_once_per_change():
    policy = FreezingPolicy(3, FreezingPolicyConfig(window=1))
    assert policy.bootstrapping and policy.frozen == 0 and policy.generation == 0
    policy.force(2, lr=0.05)
    assert (policy.frozen, policy.generation, policy.lr_at_first_freeze) == (2, 1, 0.05)
    assert policy.bootstrapping is False
    policy.force(2, lr=0.9)  # the same prefix: nothing changes, not even the recorded lr
    assert (policy.frozen, policy.generation, policy.lr_at_first_freeze) == (2, 1, 0.05)
    policy.force(3)  # the whole model may be frozen
    assert (policy.frozen, policy.generation) == (3, 2)
    policy.force(0, lr=0.1)  # unfreezing everything forgets the lr
    assert (policy.frozen, policy.generation, policy.lr_at_first_freeze) == (0, 3, None)


@pytest.mark.parametrize("bad", [-1, 4, 1.0, True])
def test_policy_force_rejects_a_prefix_outside_the_model(bad):
    with pytest.raises(ValueError, match=rf"`frozen` is {bad!r}, but must be an int in \[0, 3\]"):
        FreezingPolicy(3, FreezingPolicyConfig(window=1)).force(bad)
