"""BenchmarkConfig's messages for options a user gets wrong: each names the option."""

from __future__ import annotations

import pytest

from cb_callback import BenchmarkConfig, profile_components


@pytest.mark.parametrize("value", [None, 3, [1], ["a", 2], {"a": 1}])
def test_include_and_exclude_refuse_anything_but_patterns_naming_the_option(value: object) -> None:
    for name in ("include", "exclude"):
        with pytest.raises(ValueError, match=rf"^BenchmarkConfig\.{name}=.* is invalid: expected glob patterns"):
            BenchmarkConfig(**{name: value})


def test_include_takes_one_pattern_or_a_list_of_them() -> None:
    assert BenchmarkConfig(include="blocks.*").include == ("blocks.*",)
    assert BenchmarkConfig(include=["a", "b"], exclude=("c",)).include == ("a", "b")


def test_an_unknown_option_names_the_close_ones() -> None:
    import torch

    with pytest.raises(ValueError, match=r"unknown option\(s\) \['warmpu'\]; 'warmpu': did you mean 'warmup'\?; "):
        profile_components(torch.nn.Linear(2, 2), (torch.randn(1, 2),), warmpu=1)
    with pytest.raises(ValueError, match=r"^unknown option\(s\) \['zzzzzz'\]; BenchmarkConfig fields are \["):
        BenchmarkConfig().replace(zzzzzz=1)  # nothing close: no hint


def test_a_config_that_is_not_a_benchmark_config_is_a_type_error_saying_how() -> None:
    import torch

    model, x = torch.nn.Linear(2, 2), torch.randn(1, 2)
    with pytest.raises(TypeError) as e:
        profile_components(model, (x,), config={"max_depth": 0})  # type: ignore[arg-type]
    assert str(e.value) == (
        "config={'max_depth': 0}: expected a BenchmarkConfig, got dict; pass config=BenchmarkConfig(**options) "
        "or the options themselves as keywords"
    )
    expected = r"^config=3: expected a BenchmarkConfig, got int; pass a BenchmarkConfig or None$"
    with pytest.raises(TypeError, match=expected):
        profile_components(model, (x,), config=3, max_depth=0)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["a", 1.0, True, None, 2**64, -(2**63) - 1])
def test_a_seed_torch_cannot_take_is_refused_at_construction_naming_it(value: object) -> None:
    # before: accepted, then every row failed with "manual_seed expected a long"
    expected = (
        f"BenchmarkConfig.seed={value!r} is invalid: expected an integer from -2**63 to 2**64 - 1 "
        "(what torch.manual_seed takes)"
    )
    with pytest.raises(ValueError) as e:
        BenchmarkConfig(seed=value)  # type: ignore[arg-type]
    assert str(e.value) == expected
    assert BenchmarkConfig(seed=2**64 - 1).seed == 2**64 - 1 and BenchmarkConfig(seed=-(2**63)).seed == -(2**63)


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"rounds": "3"}, "expected an integer >= 1"),  # the type and the bound: one message, the real bound
        ({"rounds": 0}, "expected an integer >= 1"),
        ({"max_repeats": -1}, "expected an integer >= 5 (max(min_repeats, 1))"),
        ({"max_repeats": "x", "min_repeats": 0}, "expected an integer >= 1 (max(min_repeats, 1))"),
        ({"batch_size": "2"}, "expected an integer >= 1 or None"),
        ({"batch_size": 0}, "expected an integer >= 1 or None"),
        ({"log_scalars": "x"}, "expected an integer >= 0, 'all' or None"),
        ({"max_depth": -1}, "expected an integer >= 0 or None"),
    ],
)
def test_an_integer_options_message_states_its_real_bound(options: dict[str, object], why: str) -> None:
    name = next(iter(options))
    with pytest.raises(ValueError) as e:
        BenchmarkConfig(**options)  # type: ignore[arg-type]
    assert str(e.value) == f"BenchmarkConfig.{name}={options[name]!r} is invalid: {why}"
