"""Snapshots: round trip, profiling a loaded one, and clear errors for what cannot be pickled."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from cb_callback import BenchmarkConfig, Capture, profile_components
from cb_callback._engine.capture.tree import SCRIPTED
from cb_callback._hardware.devices import device_problem
from cb_callback._whatif.snapshot import (
    META_FILE,
    SNAPSHOT_FILE,
    SnapshotError,
    load_snapshot,
    precision_context,
    save_snapshot,
)
from tests.conftest import FAST

PEAKS: dict[str, Any] = dict(peak_flops=1e11, peak_bandwidth=1e10)


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 2))


def _captured(model: nn.Module, x: torch.Tensor, keep: int | None = None) -> Capture:
    with Capture(model, keep_samples=keep) as capture:
        model(x)
    return capture


class _NamedPlugin:
    name = "named"

    def measure(self, ctx: Any) -> dict[str, Any]:
        return {"answer": 42}


def test_round_trip_keeps_model_inputs_options_and_metadata(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _net()
    x = torch.randn(6, 4)
    capture = _captured(model, x, keep=2)
    config = BenchmarkConfig(max_depth=1, exclude=["4"], metrics=[_NamedPlugin()], **FAST, **PEAKS)
    out = save_snapshot(
        tmp_path / "snap", model, capture.calls, config=config, captured_batch_size=2,
        precision="bf16-mixed", metadata={"capture_step": 7},
    )  # fmt: skip
    assert {p.name for p in out.iterdir()} == {SNAPSHOT_FILE, META_FILE}
    description = json.loads((out / META_FILE).read_text())
    assert description["model_class"] == "torch.nn.modules.container.Sequential"
    assert description["components_captured"] == 6
    assert description["precision"] == "bf16-mixed"
    assert "only load snapshots you trust" in description["warning"]

    snap = load_snapshot(out)
    assert isinstance(snap.model, nn.Sequential)
    for (ka, a), (kb, b) in zip(model.state_dict().items(), snap.model.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(a, b)
    assert list(snap.calls) == list(capture.calls)
    assert torch.equal(snap.calls[""].args[0], x[:2])
    assert snap.calls["3"].training is True and snap.calls["3"].order == capture.calls["3"].order
    assert snap.captured_batch_size == 2
    assert snap.precision == "bf16-mixed"
    assert snap.metadata == {"capture_step": 7}
    cfg = snap.benchmark_config()
    assert (cfg.max_depth, cfg.exclude, cfg.warmup, cfg.peak_flops) == (1, ("4",), 0, 1e11)
    assert [type(m).__name__ for m in cfg.metrics] == ["_NamedPlugin"]
    assert snap.benchmark_config(max_depth=None).max_depth is None


def test_a_loaded_snapshot_profiles_like_the_model(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _net()
    x = torch.randn(6, 4)
    capture = _captured(model, x)
    # descend_share=0: every row replayed in both (which small rows the default's triage leaves in situ
    # follows their in-situ times, and so the machine's load)
    config = BenchmarkConfig(**FAST, **PEAKS, descend_share=0.0)
    save_snapshot(tmp_path, model, capture.calls, config=config, captured_batch_size=6)
    report = load_snapshot(tmp_path).profile(device="cpu")
    direct = profile_components(model, x, **FAST, **PEAKS, descend_share=0.0)
    assert [r.path for r in report.rows] == [r.path for r in direct.rows]
    assert [r.status for r in report.rows] == ["ok"] * 6
    # the same FLOPs: Linear(4 -> 8) on 6 samples is 2 * 6 * 4 * 8 forward
    assert report.row("0").fwd_flops == direct.row("0").fwd_flops == 2 * 6 * 4 * 8
    assert report.metadata["snapshot_precision"] is None
    assert report.metadata["captured_batch_size"] == 6


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_a_torchscript_submodule_round_trips_and_replays(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(torch.jit.script(nn.Linear(4, 8)), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(6, 4)
    capture = _captured(model, x)
    # pickle refuses a ScriptModule ("Tried to serialize object __torch__... __getstate__"): mode="fork" lost
    # its report; it is written as its torch.jit.save archive instead
    save_snapshot(tmp_path, model, capture.calls, config=BenchmarkConfig(**FAST, **PEAKS, descend="all"))
    snap = load_snapshot(tmp_path)
    assert isinstance(snap.model[0], torch.jit.ScriptModule)
    assert torch.equal(snap.model(x), model(x))
    report = snap.profile(device="cpu")
    assert [(r.path, r.status) for r in report.rows] == [("", "ok"), ("0", "ok"), ("1", "ok"), ("2", "ok")]
    assert report.row("0").note == SCRIPTED
    # Linear(4 -> 8) on 6 samples: 2 * 6 * 4 * 8 forward
    assert report.row("0").fwd_flops == 2 * 6 * 4 * 8


def test_unpicklable_parts_give_a_clear_error(tmp_path: Path) -> None:
    model = _net()
    model.hook = lambda x: x  # type: ignore[assignment]  # a lambda cannot be pickled
    capture = _captured(model, torch.randn(2, 4))
    with pytest.raises(SnapshotError, match=r"cannot pickle the model torch\.nn\.modules\.container\.Sequential") as e:
        save_snapshot(tmp_path, model, capture.calls)
    assert "use mode='pause'" in str(e.value)
    assert not (tmp_path / SNAPSHOT_FILE).exists()


def test_plugins_that_cannot_be_pickled_are_left_out_and_named(tmp_path: Path) -> None:
    class Local:  # defined in a function: cannot be pickled
        name = "local"

        def write(self, report: Any, ctx: Any) -> list[Path]:
            return []

    model = _net()
    capture = _captured(model, torch.randn(2, 4))
    save_snapshot(tmp_path, model, capture.calls, config=BenchmarkConfig(reporters=[Local()]))
    snap = load_snapshot(tmp_path)
    assert snap.config["reporters"] == ()
    assert snap.metadata["snapshot_dropped_plugins"] == ["reporters: local"]


def test_a_class_that_cannot_be_imported_is_named_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "src"
    pkg.mkdir()
    (pkg / "cb_gone_models.py").write_text(
        textwrap.dedent(
            """
            from torch import nn

            class GoneNet(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(2, 2)

                def forward(self, x):
                    return self.fc(x)
            """
        )
    )
    monkeypatch.syspath_prepend(str(pkg))
    import cb_gone_models  # type: ignore[import-not-found]

    model = cb_gone_models.GoneNet()
    capture = _captured(model, torch.randn(3, 2))
    save_snapshot(tmp_path / "snap", model, capture.calls)
    monkeypatch.delitem(sys.modules, "cb_gone_models")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(pkg)])
    with pytest.raises(SnapshotError) as e:
        load_snapshot(tmp_path / "snap")
    text = str(e.value)
    assert "a class it references cannot be imported here" in text
    assert "No module named 'cb_gone_models'" in text
    assert "The snapshot's model is cb_gone_models.GoneNet." in text
    assert 'needs an `if __name__ == "__main__":` guard' in text


def test_missing_and_foreign_files(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="no snapshot at"):
        load_snapshot(tmp_path)
    torch.save({"something": 1}, tmp_path / SNAPSHOT_FILE)
    with pytest.raises(SnapshotError, match="is not a cb_callback snapshot"):
        load_snapshot(tmp_path)
    (tmp_path / SNAPSHOT_FILE).write_bytes(b"not a pickle")
    with pytest.raises(SnapshotError, match="cannot read the snapshot"):
        load_snapshot(tmp_path)


def test_precision_context_mirrors_lightning_precisions() -> None:
    assert precision_context(None, "cpu") is None
    assert precision_context("32-true", "cpu") is None
    mixed = precision_context("bf16-mixed", "cpu")
    assert mixed is not None
    with mixed():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")
    true64 = precision_context("64-true", "cpu")
    assert true64 is not None
    with true64():
        assert torch.get_default_dtype() == torch.float64
    assert torch.get_default_dtype() == torch.float32


# --- errors that say what they are (issue 14 §4) ----------------------------------------------


def _small_snapshot(directory: Path) -> Path:
    model = nn.Linear(4, 2)
    return save_snapshot(directory, model, _captured(model, torch.randn(3, 4)).calls)


def test_loading_onto_a_device_this_machine_lacks_is_a_value_error_not_truncated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = _small_snapshot(tmp_path)
    monkeypatch.setattr(torch.version, "cuda", None)  # a CPU-only torch build, whatever this machine has
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError) as info:
        load_snapshot(snap, map_location="cuda")
    assert str(info.value) == (
        f"map_location='cuda': CUDA is not available: torch {torch.__version__} is built without CUDA "
        "(torch.version.cuda is None)"
    )
    assert device_problem("cpu") is None


def test_other_torch_load_errors_are_named_not_called_truncated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = _small_snapshot(tmp_path)
    why = "don't know how to restore data location of torch.storage.UntypedStorage (tagged with xla:0)"

    def load(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(why)

    monkeypatch.setattr(torch, "load", load)
    with pytest.raises(SnapshotError) as info:
        load_snapshot(snap, map_location="cpu")
    assert str(info.value) == f"cannot load the snapshot {snap / SNAPSHOT_FILE}: RuntimeError: {why}"


def test_a_plain_pickle_is_still_not_a_snapshot(tmp_path: Path) -> None:
    import pickle

    (tmp_path / SNAPSHOT_FILE).write_bytes(pickle.dumps([1, 2]))  # torch.load: "Invalid magic number"
    with pytest.raises(SnapshotError, match=r"cannot read the snapshot .* \(truncated or not a snapshot\?\)"):
        load_snapshot(tmp_path)


def test_a_snapshot_json_the_disk_cannot_hold_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    real = Path.write_text

    def write_text(self: Path, *args: Any, **kwargs: Any) -> int:
        if self.name == META_FILE:
            raise OSError(errno.ENOSPC, "No space left on device")  # a failed write() names no file
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    with pytest.raises(OSError) as info:
        _small_snapshot(tmp_path)
    assert (info.value.errno, info.value.filename) == (errno.ENOSPC, str(tmp_path / META_FILE))


class MainNet(nn.Linear):
    """A model class as a training script defines it: pickled as ``__main__.MainNet``."""


def test_a_corrupt_snapshot_json_is_named_unreadable_not_a_script_never_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cb_callback._whatif.snapshot import description_problem

    monkeypatch.setattr(MainNet, "__module__", "__main__")
    monkeypatch.setattr(sys.modules["__main__"], "MainNet", MainNet, raising=False)
    model = MainNet(4, 2)
    snap = save_snapshot(tmp_path / "snap", model, _captured(model, torch.randn(3, 4)).calls)
    monkeypatch.delattr(sys.modules["__main__"], "MainNet")  # a replay elsewhere: the class is in the script
    assert description_problem(snap) is None
    (snap / META_FILE).write_text("{\n")  # next to a good snapshot.pt
    why = (
        f"{snap / META_FILE} is unreadable (not JSON: Expecting property name enclosed in double quotes: line 2 "
        "column 1 (char 2))"
    )
    assert description_problem(snap) == why
    with pytest.raises(SnapshotError) as e:
        load_snapshot(snap)
    # before: "cannot load the snapshot ...: SnapshotError: ... and the script was not recorded: pass it with ..."
    assert str(e.value) == (
        f"the snapshot's classes include some defined in its training script (`__main__`), and the script cannot "
        f"be found: {why}, where its path is recorded: pass it with `cb replay --script PATH` "
        "(load_snapshot(..., script=PATH))"
    )
    (snap / META_FILE).write_text("[1]")
    assert description_problem(snap) == f"{snap / META_FILE} is unreadable (not a JSON object: list)"
    (snap / META_FILE).unlink()
    assert description_problem(snap) is None  # a snapshot without one: nothing unreadable
