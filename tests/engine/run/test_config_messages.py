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
