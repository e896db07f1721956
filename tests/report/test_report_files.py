"""Issue 14 §5: the report is where the user looks — output_dir, Report.save, Report.load.

- ``profile_components(..., output_dir=d)`` writes the full set of files in ``d``
  unless the user's own ``reporters=`` say otherwise;
- ``Report.save(d2)`` writes ``report.html`` and copies the artifact files the
  rows link, so the links resolve in ``d2``;
- ``Report.load`` of a file that is not a report raises ``ValueError`` saying what
  is wrong where, never ``KeyError``/``TypeError``.
"""

from __future__ import annotations

import inspect
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import cb_callback
from cb_callback import BenchmarkConfig, Capture, ComponentRow, profile_captured, profile_components
from cb_callback._engine.run import profile as _engine
from cb_callback._report.model import Report
from cb_callback.reporters import ReportContext
from tests._figures import blank_figures
from tests.conftest import FAST

# User peaks: no CPU calibration.
OPTS: dict[str, Any] = {**FAST, "peak_flops": 1e11, "peak_bandwidth": 1e10}

# What FileReporter writes with its defaults (tests/report/test_files.py pins it): the full set.
FULL_SET = [
    "components.csv", "icicle_mfu.png", "icicle_peak_mem_mb.png", "icicle_total_ms.png", "report.html", "report.json",
    "roofline.png",  # issue 26: the roofline
]  # fmt: skip


class _Recorder:
    """A user's reporter: records what it was given, writes nothing."""

    name = "recorder"

    def __init__(self) -> None:
        self.seen: list[tuple[Report, ReportContext]] = []

    def write(self, report: Report, ctx: ReportContext) -> list[Path]:
        self.seen.append((report, ctx))
        return []


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU())


# --- 1. profile_components(output_dir=...) -------------------------------------------------


def test_an_output_dir_gets_the_full_report(tmp_path: Path) -> None:
    out = tmp_path / "run"
    report = profile_components(_model(), (torch.randn(2, 4),), output_dir=str(out), **OPTS)
    # Before issue 14 only artifacts/ (none asked for here: nothing at all) was written.
    assert sorted(p.name for p in out.iterdir()) == FULL_SET
    assert len(Report.load(out)) == len(report) == 3  # root, 0, 1
    assert report.source_dir == out.absolute()


def test_the_output_dir_of_a_config_counts_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blank_figures(monkeypatch)  # reads no image (test_an_output_dir_gets_the_full_report draws them)
    cfg = BenchmarkConfig(output_dir=str(tmp_path), **OPTS)
    profile_components(_model(), (torch.randn(2, 4),), config=cfg)
    assert sorted(p.name for p in tmp_path.iterdir()) == FULL_SET


def test_the_users_own_reporters_replace_the_files(tmp_path: Path) -> None:
    mine = _Recorder()
    report = profile_components(_model(), (torch.randn(2, 4),), output_dir=str(tmp_path), reporters=[mine], **OPTS)
    assert [r for r, _ in mine.seen] == [report]  # called once, with the report
    assert mine.seen[0][1].output_dir == tmp_path
    assert list(tmp_path.iterdir()) == []  # no report.json: the user chose what is written
    # An empty reporters= is a choice too: nothing but the artifacts (none here).
    profile_components(_model(), (torch.randn(2, 4),), output_dir=str(tmp_path), reporters=(), **OPTS)
    assert list(tmp_path.iterdir()) == []
    # Reporters in the config are the user's own as well.
    cfg = BenchmarkConfig(output_dir=str(tmp_path), reporters=[mine], **OPTS)
    profile_components(_model(), (torch.randn(2, 4),), config=cfg)
    assert len(mine.seen) == 2 and list(tmp_path.iterdir()) == []


def test_without_an_output_dir_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    report = profile_components(_model(), (torch.randn(2, 4),), **OPTS)
    assert list(tmp_path.iterdir()) == [] and report.source_dir is None


def test_the_public_function_has_the_engines_signature_and_docstring() -> None:
    assert cb_callback.profile_components is profile_components
    assert profile_components is not _engine.profile_components  # the facade over it
    assert inspect.signature(profile_components) == inspect.signature(_engine.profile_components)
    assert profile_components.__doc__ == _engine.profile_components.__doc__
    assert profile_components.__name__ == "profile_components"


def test_profile_captured_adds_no_reporter(tmp_path: Path) -> None:
    # The callback (pause mode), the fork child and `cb replay` profile through profile_captured and
    # write with their own FileReporter: the engine itself must not add one, or they would write twice.
    model = _model()
    with Capture(model) as cap:
        model(torch.randn(2, 4))
    profile_captured(model, cap.calls, config=BenchmarkConfig(output_dir=str(tmp_path), **OPTS))
    assert list(tmp_path.iterdir()) == []


def test_the_callback_writes_its_files_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cb_callback import ComponentBenchmark
    from cb_callback._report.files import FileReporter
    from tests._callback_models import run_fit

    calls: list[Path | None] = []
    original = FileReporter.write

    def counting(self: FileReporter, report: Report, ctx: ReportContext) -> list[Path]:
        calls.append(ctx.output_dir)
        return original(self, report, ctx)

    monkeypatch.setattr(FileReporter, "write", counting)
    out = tmp_path / "cb"
    cb = ComponentBenchmark(capture_step=1, output_dir=str(out), log_to_tensorboard=False, **OPTS)
    run_fit(tmp_path, [cb], max_steps=2, logger=False)
    assert calls == [out]  # one FileReporter, once
    assert (out / "report.html").is_file()


# --- 2. Report.save --------------------------------------------------------------------------


def _linked(tmp_path: Path) -> tuple[Report, Path]:
    """A report in ``tmp_path/a`` whose row ``0`` links ``artifacts/0/ops.csv`` (the file exists)."""
    home = tmp_path / "a"
    report = Report([
        ComponentRow("", "Sequential", 0, None, "ok", calls=1, total_ms=2.0),
        ComponentRow(
            "0", "Linear", 1, "", "ok", calls=1, total_ms=1.5, details={"artifacts": {"ops": "artifacts/0/ops.csv"}}
        ),
    ])  # fmt: skip
    (home / "artifacts" / "0").mkdir(parents=True)
    (home / "artifacts" / "0" / "ops.csv").write_text("name,calls\naten::addmm,1\n")
    report.save(home)
    return report, home


def test_save_writes_the_page(tmp_path: Path) -> None:
    report = Report([ComponentRow("", "Linear", 0, None, "ok", calls=1, total_ms=1.0)], {"device_name": "cpu"})
    out = report.save(tmp_path / "d")
    assert sorted(p.name for p in out.iterdir()) == ["components.csv", "report.html", "report.json"]
    page = (out / "report.html").read_text()
    assert '"module_type":"Linear"' in page  # the report is embedded in the page
    assert report.source_dir == out.absolute()
    out2 = report.save(tmp_path / "e", html=False)
    assert sorted(p.name for p in out2.iterdir()) == ["components.csv", "report.json"]


def test_a_loaded_report_saved_elsewhere_takes_its_artifacts_along(tmp_path: Path) -> None:
    _, home = _linked(tmp_path)
    loaded = Report.load(home)
    assert loaded.source_dir == home.absolute()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is missing: no warning
        d2 = loaded.save(tmp_path / "elsewhere" / "d2")
    # the link is relative to the report: the same relative path under d2, the same bytes
    assert (d2 / "artifacts" / "0" / "ops.csv").read_text() == "name,calls\naten::addmm,1\n"
    assert Report.load(d2).row("0").details["artifacts"] == {"ops": "artifacts/0/ops.csv"}
    # the page's operator table is read from d2's copy
    assert "aten::addmm" in (d2 / "report.html").read_text()


def test_an_engine_report_saved_elsewhere_takes_its_artifacts_along(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blank_figures(monkeypatch)  # reads no image (test_an_output_dir_gets_the_full_report draws them)
    # descend="all": every row replayed, hence an artifact each (the default triage decides by the load)
    report = profile_components(_model(), (torch.randn(2, 4),), output_dir=str(tmp_path / "run"),
                                artifacts=("ops",), descend="all", **OPTS)  # fmt: skip
    links = {r.path: r.details["artifacts"]["ops"] for r in report.rows}
    assert links["0"] == "artifacts/0/ops.csv"  # <output_dir>/artifacts/<path>/ops.csv, relative
    d2 = report.save(tmp_path / "d2")
    for rel in links.values():
        assert (d2 / rel).read_bytes() == (tmp_path / "run" / rel).read_bytes()


def test_a_report_of_unknown_origin_keeps_its_links_and_says_they_are_missing(tmp_path: Path) -> None:
    report, _ = _linked(tmp_path)
    orphan = Report.from_dict(report.to_dict())  # built in memory: it cannot know where its files are
    assert orphan.source_dir is None
    with pytest.warns(RuntimeWarning, match=r"1 artifact file\(s\) the report links are not in .*d2 \(its source "
                                            r"directory is unknown\): artifacts/0/ops.csv"):  # fmt: skip
        d2 = orphan.save(tmp_path / "d2")
    assert not (d2 / "artifacts").exists()
    assert Report.load(d2).row("0").details["artifacts"] == {"ops": "artifacts/0/ops.csv"}  # kept
    # Told where it came from, it copies them.
    orphan.source_dir = tmp_path / "a"
    orphan.save(tmp_path / "d3")
    assert (tmp_path / "d3" / "artifacts" / "0" / "ops.csv").is_file()


def test_saving_where_it_is_copies_nothing_and_never_leaves_the_report(tmp_path: Path) -> None:
    report, home = _linked(tmp_path)
    (tmp_path / "secret.txt").write_text("not an artifact")
    report.row("").details["artifacts"] = {"trace": "../secret.txt", "abs": str(tmp_path / "secret.txt")}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report.save(home)  # the same directory: the files are there already
        report.save(tmp_path / "d2")
    # a link outside the report's directory is never linked by the page, and never copied
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "d2", "secret.txt"]
    assert not (tmp_path / "d2" / "secret.txt").exists()


# --- 3. Report.load on what is not a report ----------------------------------------------------


@pytest.mark.parametrize(
    ("content", "why"),
    [
        # the file: the first wrong thing, where it is
        ('{"rows": [{"path": 1}], "metadata": 5}', "rows[0].path is int, expected str"),
        ("{}", "'rows' missing"),
        ("[]", "the top level is list, expected an object (dict) with 'rows'"),
        ('{"rows": {}}', "rows is dict, expected a list"),
        ('{"rows": [], "metadata": 5}', "metadata is int, expected an object (dict)"),
        ('{"rows": ["x"]}', "rows[0] is str, expected an object (dict)"),
        ('{"rows": [{"path": "", "depth": 0, "parent": null}]}', "rows[0]: 'module_type' missing"),
        (
            '{"rows": [{"path": "", "module_type": "M", "depth": 0, "parent": null}, '
            '{"path": "a", "module_type": "M", "depth": "1", "parent": ""}]}',
            "rows[1].depth is str, expected int",
        ),
        (
            '{"rows": [{"path": "", "module_type": "M", "depth": 0, "parent": 3}]}',
            "rows[0].parent is int, expected str or None",
        ),
        ('{"rows": [{"path": "", "module_type": "M", "depth": 0, "parent": null, "calls": true}]}',
         "rows[0].calls is bool, expected int"),
        ('{"rows": [{"path": "", "module_type": "M", "depth": 0, "parent": null, "fwd_ms": "1"}]}',
         "rows[0].fwd_ms is str, expected a number or None"),
        ('{"rows": [{"path": "", "module_type": "M", "depth": 0, "parent": null, "details": []}]}',
         "rows[0].details is list, expected an object (dict)"),
        ('{"rows": [{"path": "", "module_type": "M", "depth": 0, "parent": null, "status": "great"}]}',
         "rows[0].status is 'great', expected one of ('ok', 'estimated', 'failed', 'not_run', 'skipped')"),
    ],
)  # fmt: skip
def test_load_says_what_is_wrong_where(tmp_path: Path, content: str, why: str) -> None:
    (tmp_path / "report.json").write_text(content)
    with pytest.raises(ValueError) as info:
        Report.load(tmp_path)
    assert type(info.value) is ValueError  # not a KeyError/TypeError in disguise
    assert str(info.value) == f"cannot read a report at {tmp_path / 'report.json'}: {why}"


def test_load_of_a_file_that_is_not_json(tmp_path: Path) -> None:
    (tmp_path / "report.json").write_text('{"rows": [')
    with pytest.raises(ValueError, match=r"cannot read a report at .*report.json: not JSON \(Expecting value: line 1"):
        Report.load(tmp_path)
    (tmp_path / "report.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(ValueError, match=r"cannot read a report at .*report.json: not UTF-8 text \(invalid start byte"):
        Report.load(tmp_path)


def test_load_still_reads_what_save_writes_and_keeps_unknown_keys(tmp_path: Path) -> None:
    data = {
        "metadata": None,  # a missing metadata reads as {}
        "rows": [{"path": "", "module_type": "M", "depth": 0, "parent": None, "fwd_ms": None, "calls": 2,
                  "details": None, "from_the_future": [1, 2]}],
    }  # fmt: skip
    (tmp_path / "report.json").write_text(json.dumps(data))
    report = Report.load(tmp_path)
    row = report.row("")
    assert report.metadata == {} and row.calls == 2 and row.fwd_ms != row.fwd_ms  # null -> NaN
    assert row.details == {"from_the_future": [1, 2]}  # an unknown key lands in details


# --- the layering rule ---------------------------------------------------------------------------
