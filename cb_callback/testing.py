"""Assertions for test suites: fail a test when a component got slower (or bigger) than a kept baseline.

A baseline report kept in the repository and a fresh profile of the same model, in pytest::

    from cb_callback import profile_components
    from cb_callback.testing import assert_no_regression

    def test_the_model_did_not_get_slower():
        report = profile_components(model, (x,), descend="all")
        assert_no_regression(report, "tests/baselines/model", fail_over=0.10)

The rule is ``cb diff --fail-over``'s (one implementation, :mod:`cb_callback._report.gate`;
docs/explore.md, "A regression gate in CI" says how to keep and refresh the baseline).
"""

from __future__ import annotations

from pathlib import Path

from cb_callback._report.gate import DEFAULT_MIN_SHARE, GateResult, gate_reports
from cb_callback._report.gate_format import format_gate_table, format_gate_text
from cb_callback._report.model import Report

__all__ = ["assert_no_regression"]


def _report(value: Report | str | Path) -> Report:
    return value if isinstance(value, Report) else Report.load(value)


def assert_no_regression(
    report: Report | str | Path,
    baseline: Report | str | Path,
    fail_over: float = 0.10,
    *,
    metric: str = "total_ms",
    min_share: float = DEFAULT_MIN_SHARE,
    shift: bool = True,
) -> GateResult:
    """Raise ``AssertionError`` when a component of ``report`` regressed against ``baseline``.

    A component regressed when it holds at least ``min_share`` of the step in either report and
    its ``metric`` (over the step: ``× calls`` where it adds up) got worse by more than
    ``fail_over`` of the baseline *and* by more than the two runs' noise allows
    (:mod:`cb_callback._report.gate`). Components in one report only, renamed, or whose time
    cannot be trusted (failed, at the harness floor) never fail it.

    Args:
        report: the new report: a :class:`~cb_callback.Report`, or a location as
            :meth:`Report.load <cb_callback.Report.load>` accepts (a directory, a
            ``report.json``, ``DIR@N``).
        baseline: the kept one, as ``report``.
        fail_over: the threshold, a fraction (0.10: worse by more than 10 % fails).
        metric: the compared column: ``total_ms`` (default), any ``*_ms``, ``peak_mem_mb``,
            ``activation_mb``, ``fwd_flops``, ``bytes``, ... (as ``cb diff --metric``).
        min_share: components holding less of the step than this fraction in both reports
            are not gated (default 0.01).
        shift: discount the change every component shares (the median change below the root,
            a slower or faster machine) before judging a time; ``False``: judge each as measured.

    Returns:
        The gate's result (every component's verdict), when nothing regressed.

    Raises:
        AssertionError: a component regressed; the message is the gate's line and the table
            of the components that regressed (deepest first: the one that slowed before the
            parents it slowed).
        ValueError: ``metric`` cannot be compared, or a threshold is negative.
        FileNotFoundError: a location holds no report.
    """
    __tracebackhide__ = True  # pytest shows the assertion, not this frame
    result = gate_reports(
        _report(baseline), _report(report), fail_over, metric=metric, min_share=min_share, shift=shift
    )
    if not result.passed:
        raise AssertionError("\n".join([format_gate_text(result)[0], *format_gate_table(result.regressed, metric)]))
    return result
