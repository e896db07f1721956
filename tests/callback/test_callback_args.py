"""The callback's arguments are derived from ``BenchmarkConfig`` (issue 25 §3), not re-declared."""

from __future__ import annotations

import dataclasses
import inspect
import typing

import pytest

from cb_callback import BenchmarkConfig, ComponentBenchmark
from cb_callback._lightning.args import ENGINE_OPTIONS

OWN = [
    "capture_step", "mode", "capture_batches", "capture_every", "capture_steps", "capture_batch_size",
    "output_dir", "log_to_tensorboard", "stop_after", "ranks", "enabled", "fork_timeout_s",
]  # fmt: skip


def test_the_signature_is_the_own_arguments_then_every_engine_option_with_its_type_and_default() -> None:
    params = inspect.signature(ComponentBenchmark).parameters
    hints, defaults = typing.get_type_hints(BenchmarkConfig), BenchmarkConfig()
    engine = [f.name for f in dataclasses.fields(BenchmarkConfig) if f.name in ENGINE_OPTIONS and f.name not in OWN]
    assert list(params) == OWN + engine  # the dataclass's order, after the callback's own
    assert set(engine) == ENGINE_OPTIONS - {"ranks"}  # ranks is the callback's own (default "zero", not "all")
    for name in engine:
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert params[name].default == getattr(defaults, name), name
        assert params[name].annotation == hints[name], name  # resolved types, not strings
    assert params["ranks"].default == "zero" and BenchmarkConfig().ranks == "all"


def test_a_new_config_field_becomes_an_argument_without_touching_the_callback(monkeypatch: pytest.MonkeyPatch) -> None:
    # Derived, not re-declared: the signature is rebuilt from whatever the dataclass declares.
    from cb_callback._lightning import args

    @dataclasses.dataclass
    class Wider(BenchmarkConfig):
        new_knob: int = 7

    monkeypatch.setattr(args, "BenchmarkConfig", Wider)
    monkeypatch.setattr(args, "ENGINE_OPTIONS", args.ENGINE_OPTIONS | {"new_knob"})
    signature = args.with_engine_options(ComponentBenchmark.__init__)
    assert signature.parameters["new_knob"].default == 7 and signature.parameters["new_knob"].annotation is int


def test_an_engine_option_reaches_the_config_and_an_unknown_keyword_is_a_type_error_with_the_close_names() -> None:
    cb = ComponentBenchmark(capture_step=3, warmup=4, descend="all", budget_s=2.0)
    assert (cb.config.warmup, cb.config.descend, cb.config.budget_s) == (4, "all", 2.0)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'warmpu'; did you mean 'warmup'\?"):
        ComponentBenchmark(warmpu=4)
    # the callback's own arguments are offered too: the most mistyped is capture_step
    with pytest.raises(TypeError, match=r"argument 'capture_stpe'; did you mean 'capture_step' or 'capture_steps'"):
        ComponentBenchmark(capture_stpe=5)
    with pytest.raises(TypeError, match=r"argument 'outputdir'; did you mean 'output_dir'\?$"):
        ComponentBenchmark(outputdir="x")
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'progress'"):
        ComponentBenchmark(progress=print)  # the callback draws its own progress: not an argument
    with pytest.raises(ValueError, match=r"^ComponentBenchmark: .*warmup="):
        ComponentBenchmark(warmup=-1)
    with pytest.raises(ValueError) as e:  # before: accepted, then every row failed "manual_seed expected a long"
        ComponentBenchmark(seed="a")
    assert str(e.value) == (
        "ComponentBenchmark: BenchmarkConfig.seed='a' is invalid: expected an integer from -2**63 to 2**64 - 1 "
        "(what torch.manual_seed takes)"
    )
