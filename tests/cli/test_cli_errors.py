"""The ``cb`` command's error paths: one line that names the cause, and the exit status the help promises.

Exit status 2 is "could not do it" for every command (``cb compare``: could not
compare; ``cb replay``: could not replay; ``cb report``: no readable report),
like argparse's own usage errors; ``cb compare``'s 1 stays "compared, not
equivalent", ``cb replay``'s 1 "profiled, but the files could not be written".
"""

from __future__ import annotations

import errno
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from cb_callback import BenchmarkConfig, Capture
from cb_callback._cli import _parser, main
from cb_callback._whatif.snapshot import SNAPSHOT_FILE, save_snapshot
from tests.conftest import FAST

PEAKS: dict[str, Any] = dict(peak_flops=1e11, peak_bandwidth=1e10)


class OnceOnly(nn.Linear):
    """A Linear whose forward runs once: the replay of a snapshot of it raises (a reference that fails)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ran = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ran:
            raise RuntimeError("OnceOnly ran twice")
        self.ran = True
        return super().forward(x)


def _snapshot(directory: Path, first: nn.Module | None = None) -> Path:
    torch.manual_seed(0)
    model = nn.Sequential(first or nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with Capture(model) as capture:
        model(torch.randn(5, 4))
    return save_snapshot(
        directory, model, capture.calls, config=BenchmarkConfig(**FAST, **PEAKS), captured_batch_size=5,
        metadata={"capture_step": 3, "capture_device": "cpu"},
    )  # fmt: skip


_CANDIDATES = """
import torch
from torch import nn


class BadShape(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(8, 3))

    def forward(self, x):
        return x @ self.weight.T


def wrong_shape():
    return BadShape()


def broken():
    raise ValueError("no width for this layer")


def good():
    return nn.Linear(4, 8)


def no_bias():
    return nn.Linear(4, 8, bias=False)
"""


def _candidates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    source = tmp_path / "cands.py"
    source.write_text(textwrap.dedent(_CANDIDATES))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "cands", raising=False)
    return source


def _err_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one line the command wrote to stderr (it must be one, without a traceback)."""
    return _err_line_of(capsys.readouterr().err)


def _err_line_of(err: str) -> str:
    """The one line of ``err`` (it must be one, without a traceback)."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def _line_of(source: Path, text: str) -> int:
    return next(i for i, ln in enumerate(source.read_text().splitlines(), start=1) if text in ln)


# --- cb compare -------------------------------------------------------------------------------


def test_compare_says_could_not_compare_when_the_candidate_factory_raises(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _candidates(tmp_path, monkeypatch)
    snap = _snapshot(tmp_path / "snap")
    assert main(["compare", str(snap), "--path", "0", "--candidate", "cands:broken"]) == 2
    line = _line_of(source, 'raise ValueError("no width')
    assert _err_line(capsys) == (
        "cb: error: could not compare: the candidate factory cands:broken raised ValueError: no width "
        f"for this layer (at cands.py:{line} in broken)"
    )


def test_compare_says_could_not_compare_when_the_candidates_forward_raises(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _candidates(tmp_path, monkeypatch)
    snap = _snapshot(tmp_path / "snap")
    assert main(["compare", str(snap), "--path", "0", "--candidate", "cands:wrong_shape"]) == 2
    # path "0" is Linear(4, 8) on 5 samples: x (5, 4) @ weight.T (3, 8) cannot be multiplied
    line = _line_of(source, "return x @ self.weight.T")
    assert _err_line(capsys) == (
        "cb: error: could not compare: the candidate cands:wrong_shape (BadShape) raised RuntimeError: "
        f"mat1 and mat2 shapes cannot be multiplied (5x4 and 3x8) (at cands.py:{line} in forward)"
    )
    assert main(["compare", str(snap), "--path", "0", "--candidate", "cands:no_bias"]) == 1  # compared
    assert "NOT equivalent" in capsys.readouterr().out  # the output lacks the bias: not equivalent


def test_compare_names_the_reference_when_it_raises(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _candidates(tmp_path, monkeypatch)
    snap = _snapshot(tmp_path / "snap", first=OnceOnly(4, 8))  # it ran in the capture: a replay raises
    assert main(["compare", str(snap), "--path", "0", "--candidate", "cands:good"]) == 2
    line = _err_line(capsys)
    assert line.startswith(
        "cb: error: could not compare: the reference 0 (OnceOnly) raised RuntimeError: OnceOnly ran twice (at "
    )
    assert line.endswith(" in forward)")


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "-1", "-0.5", "x", "1e400"])
def test_compare_refuses_a_tolerance_that_is_not_finite_and_non_negative(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # --rtol inf --atol inf called any candidate "equivalent"; a usage error, exit 2, before the snapshot is read
    for flag in ("--rtol", "--atol"):
        with pytest.raises(SystemExit) as e:
            main(["compare", "no-such-dir", "--path", "", "--candidate", "m:f", flag, value])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert (
            err.splitlines()[-1] == f"cb compare: error: argument {flag}: expected a finite number >= 0, got {value!r}"
        )
    assert _parser().parse_args(["compare", "d", "--path", "", "--candidate", "m:f", "--rtol", "0"]).rtol == 0.0


def test_compare_and_replay_help_promise_these_statuses() -> None:
    sub = next(a for a in _parser()._actions if a.dest == "command").choices  # type: ignore[attr-defined]
    assert "Exit status: 0 equivalent, 1 not equivalent, 2 could not compare." in sub["compare"].description
    assert (
        "Exit status: 0 profiled and written, 1 profiled but the report files could not be written, 2 could "
        "not replay (the snapshot cannot be read, none of the capture step asked for, the device is not "
        "available, an invalid option, an --out that is a file or cannot be made a directory: said before "
        "replaying)."
    ) in sub["replay"].description
    assert (
        "Exit status: 0 printed, 2 no report, none of the capture step asked for, one that cannot be read (not "
        "JSON, not a report's schema), or a report.html that cannot be written (--html)."
    ) in sub["report"].description
    assert (
        "Exit status: 0 compared (and the gate passed), 1 the gate failed, 2 a report missing or unreadable, or an "
        "--html page that cannot be written."
    ) in sub["diff"].description  # the gate: cb diff --fail-over (issue 26)


# --- cb replay / compare on a device this machine does not have -------------------------------


def _no_cuda_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """This torch as a CPU-only build (the CI machine's), whatever the machine running the test has."""
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_replay_on_cuda_without_cuda_says_so_not_truncated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_cuda_build(monkeypatch)
    snap = _snapshot(tmp_path / "snap")
    assert main(["replay", str(snap), "--device", "cuda", "--out", str(tmp_path / "out")]) == 2
    expected = (
        f"cb: error: --device cuda: CUDA is not available: torch {torch.__version__} is built without CUDA "
        "(torch.version.cuda is None); pass --device cpu (or a device this machine has)"
    )
    assert _err_line(capsys) == expected
    assert not (tmp_path / "out").exists()
    _candidates(tmp_path, monkeypatch)
    assert main(["compare", str(snap), "--path", "0", "--candidate", "cands:good", "--device", "cuda"]) == 2
    assert _err_line(capsys) == expected


def test_replay_names_other_unavailable_devices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = _snapshot(tmp_path / "snap")
    assert main(["replay", str(snap), "--device", "gpu0"]) == 2
    line = _err_line(capsys)
    assert line.startswith("cb: error: --device gpu0: 'gpu0' is not a device torch knows (")
    # A CUDA build whose driver finds no GPU.
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["replay", str(snap), "--device", "cuda:0"]) == 2
    assert _err_line(capsys) == (
        f"cb: error: --device cuda:0: CUDA is not available: torch {torch.__version__} is built with CUDA 12.4 "
        "but finds no CUDA device (torch.cuda.is_available() is False: no GPU, its driver, or "
        "CUDA_VISIBLE_DEVICES); pass --device cpu (or a device this machine has)"
    )
    # One GPU, asked for the fourth (index 3 of count 1).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert main(["replay", str(snap), "--device", "cuda:3"]) == 2
    assert _err_line(capsys) == (
        "cb: error: --device cuda:3: there is no cuda:3: this machine has 1 CUDA device(s), cuda:0 to cuda:0; "
        "pass --device cpu (or a device this machine has)"
    )


def test_replay_of_a_truncated_snapshot_still_says_truncated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snap = _snapshot(tmp_path / "snap")
    data = (snap / SNAPSHOT_FILE).read_bytes()
    (snap / SNAPSHOT_FILE).write_bytes(data[: len(data) // 2])  # the zip's central directory is gone
    assert main(["replay", str(snap), "--device", "cpu"]) == 2
    line = _err_line(capsys)
    assert line.startswith(
        f"cb: error: cannot read the snapshot {snap / SNAPSHOT_FILE} (truncated or not a snapshot?): "
    )


def test_replay_that_cannot_write_its_files_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = _snapshot(tmp_path / "snap")
    out = tmp_path / "out"
    real = Path.write_text

    def full_disk(self: Path, *args: Any, **kwargs: Any) -> int:
        if self.name == "report.json":  # a write() that fails names no file, as on a real full disk
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    assert main(["replay", str(snap), "--device", "cpu", "--out", str(out)]) == 1
    captured = capsys.readouterr()
    assert "cb_callback component benchmark" in captured.out  # the summary is printed all the same
    errors = [ln for ln in captured.err.splitlines() if ln.startswith("cb: error")]
    # errno 28 is ENOSPC on Linux; its strerror "No space left on device"
    assert errors == [
        f"cb: error: could not write the report files to {out} (OSError: [Errno 28] No space left on device (ENOSPC))"
    ]


def test_replay_to_an_out_it_cannot_make_a_directory_exits_2_before_replaying(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snap = _snapshot(tmp_path / "snap")
    (tmp_path / "afile").write_text("")
    cases = {
        tmp_path / "afile": f"cannot write the report files to {tmp_path / 'afile'}: it is a file, not a directory",
        tmp_path / "afile" / "out": f"cannot write {tmp_path / 'afile' / 'out'}: Not a directory",  # under a file
    }
    for out, expected in cases.items():
        assert main(["replay", str(snap), "--device", "cpu", "--out", str(out)]) == 2
        captured = capsys.readouterr()
        assert "cb_callback component benchmark" not in captured.out  # nothing replayed: said before its minutes
        assert _err_line_of(captured.err) == f"cb: error: --out: {expected}"


# --- cb report on files that are not reports --------------------------------------------------


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ('{"rows": [{"path": 1}], "metadata": 5}', None),
        ("{}", "'rows' missing"),
        ("[1, 2]", None),
        ("not json at all", "not JSON ("),
        ('{"rows": 5}', None),
        ('{"rows": [5]}', None),
    ],
)
def test_report_on_a_file_that_is_not_a_report_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, reason: str | None
) -> None:
    (tmp_path / "report.json").write_text(content)
    assert main(["report", str(tmp_path)]) == 2
    line = _err_line(capsys)
    head = f"cb: error: cannot read a report at {tmp_path / 'report.json'}: "
    assert line.startswith(head) and len(line) > len(head)
    if reason is not None:
        assert reason in line


def test_diff_that_cannot_read_a_report_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "report.json").write_text("{}")
    # 2: could not compare (as cb compare and cb report say it), not 1
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "a")]) == 2
    assert "cannot read a report at" in capsys.readouterr().err
