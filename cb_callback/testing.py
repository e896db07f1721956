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
    allow_mismatch: bool = False,
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
        fail_over: the threshold, a fraction (0.10: worse by more than 10 % fails; 1.5 is 150 %,
            not 1.5 %).
        metric: the compared column: ``total_ms`` (default), any ``*_ms``, ``peak_mem_mb``,
            ``activation_mb``, ``fwd_flops``, ``bytes``, ... (as ``cb diff --metric``).
        min_share: components holding less of the step than this fraction in both reports
            are not gated (default 0.01).
        shift: discount the change every component shares (the median change below the root,
            a slower or faster machine) before judging a time; ``False``: judge each as measured.
        allow_mismatch: gate two reports that look like different models; by default that fails
            the assertion (the comparison means nothing).

    Returns:
        The gate's result (every component's verdict), when nothing regressed.

    Raises:
        AssertionError: a component regressed, or the reports could not be compared (a report
            without rows or root, different models, no component judged:
            :attr:`GateResult.inconclusive <cb_callback._report.gate.GateResult.inconclusive>`);
            the message is the gate's line, the common shift and the mismatch warning where
            there are any, and the table of the components that regressed (deepest first: the
            one that slowed before the parents it slowed; ``change`` after the common shift).
        TypeError: a threshold is not a number (a bool included).
        ValueError: ``metric`` cannot be compared, a threshold is negative, or ``min_share`` is
            outside [0, 1].
        FileNotFoundError: a location holds no report.
    """
    __tracebackhide__ = True  # pytest shows the assertion, not this frame
    result = gate_reports(
        _report(baseline),
        _report(report),
        fail_over,
        metric=metric,
        min_share=min_share,
        shift=shift,
        allow_mismatch=allow_mismatch,
    )
    if not result.passed:
        text = format_gate_text(result)
        notes = [line for line in text[1:] if line.startswith(("warning:", "common shift:"))]
        table = format_gate_table(result.regressed, metric) if result.regressed else []
        if table and result.shift != 1.0:
            table = ["(change: after the common shift; base and new as measured)", *table]
        raise AssertionError("\n".join([text[0], *notes, *table]))
    return result
