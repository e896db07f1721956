"""Preprocessors clean up after themselves: ``restore_model`` runs once per run, also on error."""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from cb_callback import BenchmarkConfig, Capture, profile_captured, profile_components
from cb_callback.plugins import PrepareContext, Preprocessor
from tests.conftest import FAST

PEAKS: dict[str, Any] = dict(peak_flops=1e12, peak_bandwidth=1e11)


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


class _Counting(Preprocessor):
    """Installs a forward pre-hook on the root in ``prepare_model``; takes it off in ``restore_model``."""

    name = "counting"

    def __init__(self) -> None:
        self.forwards = 0
        self.handle: Any = None
        self.prepared: list[nn.Module] = []
        self.restored: list[tuple[nn.Module, int]] = []  # (model, root forwards seen by then)

    def prepare_model(self, model: nn.Module, ctx: PrepareContext) -> nn.Module:
        self.prepared.append(model)
        self.handle = model.register_forward_pre_hook(self._count)
        return model

    def _count(self, module: nn.Module, args: Any) -> None:
        self.forwards += 1

    def restore_model(self, model: nn.Module, ctx: PrepareContext) -> None:
        self.restored.append((model, self.forwards))
        self.handle.remove()


def test_restore_model_runs_once_after_the_last_replay_with_the_profiled_model() -> None:
    model = _net()
    pre = _Counting()
    report = profile_components(model, (torch.randn(3, 4),), preprocessors=[pre], **FAST, **PEAKS)
    assert report.row("").status == "ok"
    ((restored, seen),) = pre.restored  # once
    assert pre.prepared == [model] and restored is model  # on CPU no copy: the model itself
    assert seen == pre.forwards > 1  # the capture forward and the root's replays, none after the undo
    assert len(model._forward_pre_hooks) == 0


def test_restore_model_runs_when_the_run_raises() -> None:
    class _Stop(Exception):
        pass

    def progress(done: int, total: int, path: str) -> None:
        if done == 2:
            raise _Stop(path)

    model = _net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pre = _Counting()
    with pytest.raises(_Stop):
        profile_components(model, (torch.randn(3, 4),), preprocessors=[pre], progress=progress, **FAST, **PEAKS)
    assert [m for m, _ in pre.restored] == [model]
    assert len(model._forward_pre_hooks) == 0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # the guard ran too


def test_restore_model_runs_last_preprocessor_first_and_on_the_profile_captured_path() -> None:
    order: list[str] = []

    class _Named(Preprocessor):
        def __init__(self, name: str) -> None:
            self.name = name

        def restore_model(self, model: nn.Module, ctx: PrepareContext) -> None:
            order.append(self.name)

    model = _net()
    with Capture(model) as capture:
        model(torch.randn(3, 4))
    profile_captured(
        model, capture.calls, config=BenchmarkConfig(preprocessors=[_Named("a"), _Named("b")], **FAST, **PEAKS)
    )
    assert order == ["b", "a"]


def test_a_preprocessor_without_restore_model_still_runs() -> None:
    class _Old:  # written against the contract before restore_model existed
        name = "old"

        def prepare_model(self, model: nn.Module, ctx: PrepareContext) -> nn.Module:
            return model

        def process_inputs(self, inputs: Any, ctx: PrepareContext) -> Any:
            return inputs

    report = profile_components(_net(), (torch.randn(3, 4),), preprocessors=[_Old()], **FAST, **PEAKS)
    assert report.row("").status == "ok"


def test_a_raising_restore_model_is_a_warning_naming_it_and_the_report_stands() -> None:
    class _Broken(Preprocessor):
        name = "broken"

        def restore_model(self, model: nn.Module, ctx: PrepareContext) -> None:
            raise KeyError("gone")

    with pytest.warns(RuntimeWarning, match=r"preprocessor 'broken' raised in restore_model: KeyError"):
        report = profile_components(_net(), (torch.randn(3, 4),), preprocessors=[_Broken()], **FAST, **PEAKS)
    assert report.row("").status == "ok"


# --- ReduceHashSize (torchrec) -----------------------------------------------------------

TABLE = "embedding_bags.t"
ROWS, MAX_ROWS, D = 5_000, 64, 4


class _Modules:
    """A metric plugin that keeps each replayed module alive (so a leaked hook would be seen)."""

    name = "modules"

    def __init__(self) -> None:
        self.seen: dict[str, nn.Module] = {}

    def measure(self, ctx: Any) -> Mapping[str, Any]:
        self.seen[ctx.path] = ctx.module
        return {}


def _ebc_and_kjt() -> tuple[nn.Module, Any]:
    pytest.importorskip("torchrec")
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    import cb_callback.integrations.torchrec  # noqa: F401  (KJT batch rules)

    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name="t", embedding_dim=D, num_embeddings=ROWS, feature_names=["f"])]
    )
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["f"], values=torch.tensor([4_999, 3, 2_500]), lengths=torch.tensor([2, 1])
    )
    return ebc, kjt


def test_reduce_hash_size_takes_its_hooks_off_after_the_run() -> None:
    ebc, kjt = _ebc_and_kjt()
    from cb_callback.integrations.torchrec import ReduceHashSize

    pre, spy = ReduceHashSize(MAX_ROWS), _Modules()
    report = profile_components(ebc, (kjt,), preprocessors=[pre], metrics=[spy], **FAST, **PEAKS)
    assert report.metadata["hash_size_reduction"]["tables"][TABLE]["remapped"] is True
    reduced = spy.seen[TABLE]
    assert reduced.weight.shape == (MAX_ROWS, D)  # the replayed table was the reduced one …
    assert len(reduced._forward_pre_hooks) == 0 and pre._handles == []  # … and its remap hook is off
    assert pre._prepared is False


def test_a_snapshot_holds_the_users_model_and_only_the_preprocessors_option(tmp_path: Path) -> None:
    ebc, kjt = _ebc_and_kjt()
    from cb_callback._whatif.snapshot import load_snapshot, save_snapshot
    from cb_callback.integrations.torchrec import ReduceHashSize

    pre = ReduceHashSize(MAX_ROWS)
    fresh = pickle.dumps(ReduceHashSize(MAX_ROWS))
    prepared = pre.prepare_model(ebc, PrepareContext(BenchmarkConfig(), torch.device("cpu"), {}))
    assert len(prepared.embedding_bags["t"]._forward_pre_hooks) == 1 and pre._prepared
    assert pickle.dumps(pre) == fresh  # a run's hooks and flags are not pickled, even mid-run
    pre.remove()

    with Capture(ebc) as capture:
        ebc(kjt)
    save_snapshot(tmp_path, ebc, capture.calls, config=BenchmarkConfig(preprocessors=[pre], **FAST, **PEAKS))
    snap = load_snapshot(tmp_path)
    assert "snapshot_dropped_plugins" not in snap.metadata  # the preprocessor travelled
    # the user's model: full-size table, no hook of ours on any module
    assert snap.model.embedding_bags["t"].weight.shape == (ROWS, D)
    assert all(len(m._forward_pre_hooks) == 0 for m in snap.model.modules())
    (child_pre,) = snap.config["preprocessors"]
    assert isinstance(child_pre, ReduceHashSize) and child_pre.max_rows == MAX_ROWS
    assert child_pre._handles == [] and child_pre._prepared is False

    report = snap.profile(device="cpu")  # the replaying process reduces the tables itself
    table = report.metadata["hash_size_reduction"]["tables"][TABLE]
    assert table["original_rows"] == ROWS and table["reduced_rows"] == MAX_ROWS and table["remapped"] is True
    assert report.row(TABLE).status == "ok"
    assert report.row(TABLE).params_mb == MAX_ROWS * D * 4 / 2**20  # the reduced table was profiled
    assert child_pre._handles == []
