"""The regression gate's rule on hand-built reports: every verdict, the shares, renames, the common shift, outputs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from cb_callback import ComponentRow, Report
from cb_callback._report.gate import VERDICTS, common_shift, gate_reports, parse_percent
from cb_callback._report.gate_format import format_gate_markdown, format_gate_text, gate_dict, gate_json
from cb_callback._report.renames import rename_pairs
from cb_callback.testing import assert_no_regression


def _row(path: str, total: float = math.nan, noise: float = 0.01, **kw: Any) -> ComponentRow:
    parent = None if path == "" else (path.rsplit(".", 1)[0] if "." in path else "")
    flags = kw.pop("flags", [])
    row = ComponentRow(
        path,
        kw.pop("module_type", "Net" if path == "" else "Linear"),
        0 if path == "" else path.count(".") + 1,
        parent,
        kw.pop("status", "ok"),
        calls=kw.pop("calls", 1),
        total_ms=total,
        noise=noise,
        **kw,
    )
    row.details["flags"] = flags
    return row


def _report(*rows: ComponentRow) -> Report:
    return Report(list(rows), {"device_name": "cpu", "dtype": "fp32"})


def _verdicts(g: Any) -> dict[str, str]:
    return {r.path: r.verdict for r in g.rows}


def test_every_verdict_in_the_order_the_rule_decides_them() -> None:
    base = _report(
        _row("", 100.0),
        # the noise bound: the larger value within 1 + 2 x 0.01 = 1.02 times the smaller
        _row("slow", 10.0),  # -> 20: +100 % > 10 %, 2.0 beyond 1.02: regressed
        _row("fast", 10.0),  # -> 5: -50 % (10 / 5 = 2.0 beyond 1.02): improved
        _row("bit", 10.0),  # -> 10.5: 1.05, beyond 1.02 but not over 10 %: within_threshold
        _row("noisy", 10.0, noise=0.5),  # -> 14: +40 %, within 1 + 2 x 0.5 = 2.0: within_noise
        _row("same", 10.0),  # -> 10: unchanged
        _row("tiny", 0.5),  # under 1 % of the step in both (0.5 / 100, 0.9 / 160): below_min_share though +80 %
        _row("grew", 0.5),  # -> 30: 30 % of the new step: gated, and regressed
        _row("broke", 10.0),  # failed in new: not gated
        _row("floor", 10.0, flags=["at_floor"]),  # at the harness floor in base: not gated
        _row("gone", 5.0),  # only in base
        _row("old", 3.0, module_type="ReLU", fwd_flops=10.0, params_mb=0.0),  # renamed: same type, parent, sizes
        # -> 11.2 (+12 %), its parts 4 -> 4.3 each (+7.5 %, within threshold): their sum 8 -> 8.6 (+7.5 %),
        # its own part 2 -> 2.6 (+0.6 ms, at most 10 % of its base 10): unconfirmed
        _row("box", 10.0),
        _row("box.p", 4.0),
        _row("box.q", 4.0),
    )
    new = _report(
        _row("", 160.0),
        _row("slow", 20.0),
        _row("fast", 5.0),
        _row("bit", 10.5),
        _row("noisy", 14.0, noise=0.5),
        _row("same", 10.0),
        _row("tiny", 0.9),
        _row("grew", 30.0),
        _row("broke", status="failed", error="RuntimeError: boom"),
        _row("floor", 20.0),
        _row("added", 5.0),
        _row("new_name", 3.0, module_type="ReLU", fwd_flops=10.0, params_mb=0.0),
        _row("box", 11.2),
        _row("box.p", 4.3),
        _row("box.q", 4.3),
    )
    g = gate_reports(base, new, 0.10, shift=False)
    assert _verdicts(g) == {
        "": "regressed",  # 100 -> 160 ms: +60 %
        "slow": "regressed",
        "fast": "improved",
        "bit": "within_threshold",
        "noisy": "within_noise",
        "same": "unchanged",
        "tiny": "below_min_share",
        "grew": "regressed",
        "broke": "not_gated",
        "floor": "not_gated",
        "gone": "only_in_base",
        "new_name": "renamed",
        "added": "only_in_new",
        "box": "unconfirmed",
        "box.p": "within_threshold",
        "box.q": "within_threshold",
    }
    by = {r.path: r for r in g.rows}
    assert by["broke"].reason == "failed in new: RuntimeError: boom"
    assert by["floor"].reason == "at the harness floor in base"
    assert by["new_name"].renamed_from == "old" and by["new_name"].change == 0.0
    assert by["slow"].change == 1.0 and by["slow"].noise_bound == 0.02  # 2 x 0.01
    assert by["gone"].verdict == "only_in_base"  # and "added" is not its rename: neither has FLOPs or params
    assert by["tiny"].share == 0.9 / 160  # the larger of its two shares (0.5 / 100 in base)
    assert not g.passed
    assert [r.path for r in g.regressed] == ["slow", "grew", ""]  # deepest first, then the base's order
    assert set(VERDICTS) - set(_verdicts(g).values()) == set()  # every verdict appears here


def test_a_parent_is_confirmed_by_a_regressed_part_or_by_its_parts_sum() -> None:
    base = _report(_row("", 10.0, noise=0.1), _row("p", 5.0, noise=0.1), _row("q", 5.0, noise=0.1))

    def new(root: float, p: float, q: float) -> Report:
        return _report(_row("", root, noise=0.1), _row("p", p, noise=0.1), _row("q", q, noise=0.1))

    # (bound: within 1 + 2 x 0.1 = 1.2 times.) The root 10 -> 14 (1.4) alone, its parts did not move: its
    # own part 0 -> 4 ms grew by more than 10 % of its base (1 ms): the root's own code got slower, regressed
    assert _verdicts(gate_reports(base, new(14.0, 5.0, 5.0), 0.10)) == {
        "": "regressed",
        "p": "unchanged",
        "q": "unchanged",
    }
    # the root 10 -> 11.5 (+15 %, its noise 0.02: bound 1.04), p and q 5 -> 5.3 (within their noise): the parts'
    # sum 10 -> 10.6 (+6 %), the root's own part 0 -> 0.9 ms (at most 1 ms): unconfirmed, which passes
    quiet = _report(_row("", 10.0, noise=0.02), _row("p", 5.0, noise=0.1), _row("q", 5.0, noise=0.1))
    moved = _report(_row("", 11.5, noise=0.02), _row("p", 5.3, noise=0.1), _row("q", 5.3, noise=0.1))
    g = gate_reports(quiet, moved, 0.10)
    assert _verdicts(g) == {"": "unconfirmed", "p": "within_noise", "q": "within_noise"}
    assert g.passed  # unconfirmed does not fail the gate
    # p 5 -> 9 (1.8): regressed, and the root with it
    assert _verdicts(gate_reports(base, new(14.0, 9.0, 5.0), 0.10)) == {
        "": "regressed",
        "p": "regressed",
        "q": "unchanged",
    }
    # p and q 5 -> 5.75 each (1.15, within noise), their sum +15 % > 10 %: the root's +40 % is confirmed
    g = gate_reports(base, new(14.0, 5.75, 5.75), 0.10, shift=False)
    assert _verdicts(g) == {"": "regressed", "p": "within_noise", "q": "within_noise"}


def test_a_slow_component_below_the_threshold_or_inside_the_noise_passes() -> None:
    base = _report(_row("", 10.0, noise=0.05), _row("a", 5.0, noise=0.05), _row("b", 5.0, noise=0.05))
    # the bound: within 1 + 2 x 0.05 = 1.1 times. a: 5 -> 5.4 (1.08: within); b: 5 -> 6 (1.2: beyond, +20 %)
    new = _report(_row("", 10.4, noise=0.05), _row("a", 5.4, noise=0.05), _row("b", 5.0 * 1.2, noise=0.05))
    g = gate_reports(base, new, 0.10, shift=False)
    assert _verdicts(g) == {"": "within_noise", "a": "within_noise", "b": "regressed"}
    # the root: 10 -> 10.4, 1.04: within
    assert gate_reports(base, new, 0.25, shift=False).passed  # b's +20 % is not over 25 %


def test_without_a_measured_noise_the_unknown_noise_bounds_the_change() -> None:
    base = _report(_row("", 10.0, noise=math.nan, status="estimated"))
    # 10 -> 10.4: 1.04, within 1 + UNKNOWN_NOISE = 1.05; 10 -> 11: 1.1, beyond it and +10 % over 5 %
    assert _verdicts(gate_reports(base, _report(_row("", 10.4, noise=math.nan)), 0.0))[""] == "within_noise"
    assert _verdicts(gate_reports(base, _report(_row("", 11.0, noise=math.nan)), 0.05))[""] == "regressed"


def test_memory_is_exact_a_rise_over_the_threshold_fails() -> None:
    def mem(root: float, a: float) -> Report:
        # calls=2: a peak is one call's, compared per call (never x calls)
        return _report(_row("", 1.0, peak_mem_mb=root), _row("a", 1.0, peak_mem_mb=a, calls=2, noise=0.9))

    g = gate_reports(mem(200.0, 100.0), mem(222.0, 111.0), 0.10, metric="peak_mem_mb")
    assert _verdicts(g) == {"": "regressed", "a": "regressed"}  # +11 % each, no noise for a size
    assert [r.noise_bound for r in g.rows] == [0.0, 0.0] and g.shift == 1.0
    assert g.rows[1].share == 0.5  # 111 / 222: its peak over the root's
    g = gate_reports(mem(200.0, 100.0), mem(220.0, 110.0), 0.10, metric="peak_mem_mb")
    assert _verdicts(g) == {"": "within_threshold", "a": "within_threshold"}  # exactly +10 % is not over 10 %
    assert g.passed


def test_a_throughput_regresses_when_it_falls() -> None:
    base = _report(_row("", 1.0, mfu=0.40))
    # MFU 0.40 -> 0.30: 25 % lower (a rate: per call, judged by the time noise: 0.40 / 0.30 beyond 1.02)
    assert _verdicts(gate_reports(base, _report(_row("", 1.0, mfu=0.30)), 0.10, metric="mfu"))[""] == "regressed"
    assert _verdicts(gate_reports(base, _report(_row("", 1.0, mfu=0.60)), 0.10, metric="mfu"))[""] == "improved"


def test_the_common_shift_discounts_a_change_every_component_shares() -> None:
    # The machine got 30 % slower for every component; d also doubled. Median of a, b, c, d's ratios
    # (1.3, 1.3, 1.3, 2.6) is 1.3: a, b, c are unchanged after it, d is 2.6 / 1.3 = 2x.
    base = _report(_row(""), *(_row(p, 10.0) for p in "abcd"))
    new = _report(_row(""), *(_row(p, 13.0) for p in "abc"), _row("d", 26.0))
    base.rows[0].total_ms, new.rows[0].total_ms = 40.0, 65.0
    g = gate_reports(base, new, 0.10)
    assert math.isclose(g.shift, 1.3)
    assert _verdicts(g) == {
        "": "regressed",
        "a": "within_noise",
        "b": "within_noise",
        "c": "within_noise",
        "d": "regressed",
    }
    # the root 65 / 1.3 = 50 against 40: +25 %; d 26 / 1.3 = 20 against 10: +100 %
    by = {r.path: r for r in g.rows}
    assert math.isclose(by[""].change, 0.25) and math.isclose(by["d"].change, 1.0)
    assert by["d"].new == 26.0  # the value shown is the one measured
    assert "common shift: +30.0 %" in format_gate_text(g)[1]
    absolute = gate_reports(base, new, 0.10, shift=False)
    assert absolute.shift == 1.0 and [r.path for r in absolute.regressed] == ["a", "b", "c", "d", ""]


def test_components_given_other_work_are_no_witnesses_of_the_common_shift() -> None:
    # A change to a repeated block: three of four components do twice the FLOPs and take twice as long.
    # Were they witnesses, the median (2, 2, 2, 1) = 2 would call it the machine's and pass the gate;
    # their FLOPs changed, so only d (1.0) is left, fewer than three witnesses: no shift, all judged.
    base = _report(_row(""), *(_row(p, 10.0, fwd_flops=1e6) for p in "abcd"))
    new = _report(_row(""), *(_row(p, 20.0, fwd_flops=2e6) for p in "abc"), _row("d", 10.0, fwd_flops=1e6))
    base.rows[0].total_ms, new.rows[0].total_ms = 40.0, 70.0
    g = gate_reports(base, new, 0.10)
    assert g.shift == 1.0 and not g.passed
    assert _verdicts(g) == {"": "regressed", "a": "regressed", "b": "regressed", "c": "regressed", "d": "unchanged"}
    # the same with the counts unknown (NaN FLOPs on both sides): witnesses, the shift takes it (median 2)
    base = _report(_row(""), *(_row(p, 10.0) for p in "abcd"))
    new = _report(_row(""), *(_row(p, 20.0) for p in "abc"), _row("d", 10.0))
    assert gate_reports(base, new, 0.10).shift == 2.0
    # calls count as work too: a called twice as often is no witness
    pairs = [(_row(p, 10.0), _row(p, 20.0, calls=2 if p == "a" else 1)) for p in "abcd"]
    assert common_shift(pairs, "total_ms", 0.01) == 2.0  # b, c, d: 2, 2, 2
    pairs[1] = (_row("b", 10.0), _row("b", 20.0, calls=2))
    assert common_shift(pairs, "total_ms", 0.01) == 1.0  # c, d only: fewer than three


def test_the_common_shift_needs_three_components_and_ignores_an_exact_metric() -> None:
    pairs = [(_row("a", 10.0), _row("a", 20.0)), (_row("b", 10.0), _row("b", 20.0))]
    assert common_shift(pairs, "total_ms", 0.01) == 1.0  # two components: no median worth the name
    three = [*pairs, (_row("c", 10.0), _row("c", 30.0))]
    assert common_shift(three, "total_ms", 0.01) == 2.0  # median of 2, 2, 3
    assert common_shift(three, "fwd_flops", 0.01) == 1.0


def test_renames_are_paired_root_first_and_only_when_unambiguous() -> None:
    block = dict(module_type="Block", fwd_flops=1e6, params_mb=2.0)
    fc = dict(fwd_flops=5e5, params_mb=1.0)
    base = _report(_row("", 1.0), _row("blocks", **block), _row("blocks.fc", **fc), _row("x", **fc), _row("y", **fc))
    # blocks -> layers (and its child with it); x and y both became p and q: the same type and size, ambiguous
    new = _report(_row("", 1.0), _row("layers", **block), _row("layers.fc", **fc), _row("p", **fc), _row("q", **fc))
    assert rename_pairs(base, new) == {"blocks": "layers", "blocks.fc": "layers.fc"}
    # a different size is another component, not a rename
    other = _report(_row("", 1.0), _row("layers", **{**block, "params_mb": 3.0}))
    assert rename_pairs(_report(_row("", 1.0), _row("blocks", **block)), other) == {}
    g = gate_reports(base, new, 0.10)
    assert _verdicts(g) == {
        "": "unchanged",
        "layers": "renamed",  # (no total_ms to gate: not gated, and renamed)
        "layers.fc": "renamed",
        "x": "only_in_base",
        "y": "only_in_base",
        "p": "only_in_new",
        "q": "only_in_new",
    }
    assert {r.path: r.renamed_from for r in g.rows if r.renamed_from} == {"layers": "blocks", "layers.fc": "blocks.fc"}


def test_a_renamed_component_that_regressed_is_regressed() -> None:
    base = _report(_row("", 10.0), _row("old", 5.0, fwd_flops=1.0, params_mb=1.0))
    new = _report(_row("", 20.0), _row("new", 15.0, fwd_flops=1.0, params_mb=1.0))
    g = gate_reports(base, new, 0.10)
    assert [(r.path, r.verdict, r.renamed_from) for r in g.rows] == [
        ("", "regressed", None),
        ("new", "regressed", "old"),
    ]
    assert "regressed (renamed from old)" in format_gate_text(g)[1 + 2]  # the headline, the header, its rule


def test_percent_syntax() -> None:
    assert parse_percent("10") == 0.10 and parse_percent("10%") == 0.10 and parse_percent(" 2.5 % ") == 0.025
    assert parse_percent("0") == 0.0
    for bad in ("-1", "ten", "nan", "%"):
        with pytest.raises(ValueError, match="expected a percent"):
            parse_percent(bad)
    with pytest.raises(ValueError, match=r"fail_over=-0\.1"):
        gate_reports(_report(_row("", 1.0)), _report(_row("", 1.0)), -0.1)


def _pair() -> tuple[Report, Report]:
    base = _report(_row("", 10.0), _row("a", 4.0), _row("b", 6.0), _row("gone", 0.5))
    new = _report(_row("", 14.0), _row("a", 8.0), _row("b", 6.0), _row("added", 0.5))
    return base, new


def test_json_carries_every_verdict_the_options_and_passed() -> None:
    base, new = _pair()
    g = gate_reports(base, new, 0.10, shift=False)
    data = json.loads(gate_json(g, labels=("runs/main", "runs/pr")))
    assert data["schema"] == "cb_callback.gate/1" and data["passed"] is False
    assert data["options"] == {
        "metric": "total_ms", "fail_over": 0.1, "min_share": 0.01, "over_step": True, "exact": False,
        "noise_factor": 2.0, "unknown_noise": 0.05, "common_shift": False, "allow_mismatch": False,
    }  # fmt: skip
    assert (data["base"], data["new"], data["shift"], data["regressed"]) == ("runs/main", "runs/pr", 1.0, ["a", ""])
    assert [(c["path"], c["verdict"]) for c in data["components"]] == [
        ("", "regressed"),  # 10 -> 14
        ("a", "regressed"),  # 4 -> 8
        ("b", "unchanged"),
        ("gone", "only_in_base"),
        ("added", "only_in_new"),
    ]
    a = data["components"][1]
    assert (a["base"], a["new"], a["change"], a["share"], a["renamed_from"], a["reason"]) == (
        4.0,
        8.0,
        1.0,
        8 / 14,
        None,
        None,
    )
    assert a["noise_bound"] == 0.02  # 2 x 0.01
    assert data["components"][3]["noise_bound"] is None  # not compared: null, never NaN
    assert sum(data["counts"].values()) == 5 and list(data["counts"]) == list(VERDICTS)
    assert gate_dict(g)["base"] is None


def test_markdown_is_a_table_for_a_pull_request_comment() -> None:
    base, new = _pair()
    text = format_gate_markdown(gate_reports(base, new, 0.10, shift=False), labels=("main", "pr"))
    lines = text.splitlines()
    assert lines[0] == "### cb diff gate: FAILED"
    header = lines.index("| component | type | base | new | change | noise bound | verdict |")
    assert lines[header + 1] == "|---|---|--:|--:|--:|--:|---|"
    body = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[header + 2 :] if ln.startswith("|")]
    assert body == [
        ["`a`", "Linear", "4.00 ms", "8.00 ms", "+100 %", "±2.00 %", "**regressed**"],  # 2 x noise 0.01
        ["`(root)`", "Net", "10.0 ms", "14.0 ms", "+40.0 %", "±2.00 %", "**regressed**"],
        ["`gone`", "Linear", "0.500 ms", "-", "-", "-", "only in base"],
        ["`added`", "Linear", "-", "0.500 ms", "-", "-", "only in new"],
    ]
    assert lines[-1] == "Not listed: 1 unchanged."


def test_assert_no_regression_raises_with_the_table_and_passes_otherwise(tmp_path: Path) -> None:
    base, new = _pair()
    with pytest.raises(AssertionError) as raised:
        assert_no_regression(new, base, fail_over=0.10, shift=False)
    message = str(raised.value).splitlines()
    assert message[0].startswith("gate: FAILED (total_ms over the step, fail over 10 %") and message[0].endswith(
        ": a, (root)"
    )
    assert message[1].split() == ["component", "type", "base", "new", "change", "noise", "bound", "verdict"]
    assert [ln.split()[0] for ln in message[3:]] == ["a", "(root)"]  # the regressed, and only they
    base.save(tmp_path / "baseline")
    new.save(tmp_path / "new")
    result = assert_no_regression(tmp_path / "new", str(tmp_path / "baseline"), fail_over=1.5)  # +100 % < 150 %
    assert result.passed and _verdicts(result)["a"] == "within_threshold"


def _three() -> Report:
    return _report(_row("", 10.0), _row("a", 5.0), _row("b", 5.0))


def test_a_broken_new_report_or_nothing_judged_could_not_compare() -> None:
    # each of these passed before: nothing regressed because nothing was judged
    failed = _report(*(_row(p, status="failed", error="OOM") for p in ("", "a", "b")))
    cases = {
        "the new report has no rows": _report(),
        "the new report has no root row": _report(_row("a", 5.0), _row("b", 9.0)),
        "no component could be judged (3 not gated)": failed,
    }
    for why, new in cases.items():
        g = gate_reports(_three(), new, 0.10)
        assert (g.outcome, g.passed) == ("inconclusive", False) and g.inconclusive is not None
        assert g.inconclusive.startswith(why), g.inconclusive
        assert format_gate_text(g)[0].startswith("gate: could not compare ("), format_gate_text(g)[0]
        with pytest.raises(AssertionError, match="could not compare"):
            assert_no_regression(new, _three())
    # every component below min_share: none judged either (the root holds 100 % and is judged at min_share 1)
    g = gate_reports(_three(), _three(), 0.10, min_share=1.0)
    assert g.outcome == "passed" and "judged 1 of 3 components" in format_gate_text(g)[0]
    g = gate_reports(_three(), failed, 0.10)
    assert "judged 0 of 3 components" in format_gate_text(g)[0]
    assert json.loads(gate_json(g))["outcome"] == "inconclusive"


def test_the_common_shift_takes_the_leaf_most_witnesses_not_the_ancestors() -> None:
    # a leaf 7 -> 14 ms (same work) under two wrappers that repeat it: backbone 8 -> 15, encoder 7.9 -> 14.9.
    # All five rows below the root did the same work; with the ancestors the median of 15/8, 14.9/7.9, 2, 1, 1
    # was 1.875 and the gate passed a +70 % step, calling head and norm improved. The leaf-most witnesses
    # (layer, norm, head: none has a witness below it) give the median of 2, 1, 1 = 1: no shift.
    def chain(layer: float) -> Report:
        return _report(
            _row("", 3.0 + layer),
            _row("backbone", 1.0 + layer, module_type="Wrap", fwd_flops=5e6),
            _row("backbone.encoder", 0.9 + layer, module_type="Enc", fwd_flops=5e6),
            _row("backbone.encoder.layer", layer, fwd_flops=4e6),
            _row("backbone.encoder.norm", 0.8, module_type="LN", fwd_flops=1e6),
            _row("head", 2.0, fwd_flops=1e6),
        )

    g = gate_reports(chain(7.0), chain(14.0), 0.10)
    assert g.shift == 1.0 and g.outcome == "failed"
    assert [r.path for r in g.regressed] == ["backbone.encoder.layer", "backbone.encoder", "backbone", ""]
    assert _verdicts(g)["head"] == "unchanged" and _verdicts(g)["backbone.encoder.norm"] == "unchanged"


def test_a_shift_that_explains_the_whole_step_is_warned_about() -> None:
    # every leaf 3 -> 6 ms alike, the root 10 -> 20: the shift (2.0) explains the root's +100 %, which passes,
    # but the text says so before anything else (the machine was busier, or everything got slower)
    base = _report(_row("", 10.0), _row("a", 3.0), _row("b", 3.0), _row("c", 3.0))
    new = _report(_row("", 20.0), _row("a", 6.0), _row("b", 6.0), _row("c", 6.0))
    g = gate_reports(base, new, 0.10)
    assert g.shift == 2.0 and g.passed and g.shift_hides_step and g.step_change == 1.0
    assert format_gate_text(g)[1].startswith("warning: the whole step got +100 % worse as measured")
    assert "warning: the whole step" in format_gate_markdown(g)
    assert not gate_reports(base, new, 0.10, shift=False).passed


def test_a_parent_is_unconfirmed_only_when_every_child_is_paired_and_its_own_part_is_steady() -> None:
    flops = {"fwd_flops": 1e6, "params_mb": 0.25}
    base = _report(_row("", 10.0), *(_row(p, 3.0, **flops) for p in "abc"))
    # a new child d (8 ms, only in new): the root 10 -> 18 was unconfirmed (its judged children a, b, c steady)
    new = _report(_row("", 18.0), *(_row(p, 3.0, **flops) for p in "abc"), _row("d", 8.0, **flops))
    assert _verdicts(gate_reports(base, new, 0.10))[""] == "regressed"
    # p (30 % of the step): c renamed to c2 and 3x costlier (other FLOPs: not paired): p 3 -> 5 (+67 % > 20 %)
    b3 = _report(
        _row("", 10.0),
        _row("x", 7.0),
        _row("p", 3.0, module_type="Blk"),
        *(_row(f"p.{k}", 1.0, **flops) for k in "abc"),
    )
    n3 = _report(
        _row("", 12.0), _row("x", 7.0), _row("p", 5.0, module_type="Blk"),
        *(_row(f"p.{k}", 1.0, **flops) for k in "ab"), _row("p.c2", 3.0, fwd_flops=3e6, params_mb=0.25),
    )  # fmt: skip
    g = gate_reports(b3, n3, 0.20)
    assert _verdicts(g)["p"] == "regressed" and not g.passed
    # two big children steady (35 ms each), 60 below min_share (0.5 -> 0.75 ms, 0.65 % of the new step): their sum
    # counts: 100 -> 115 ms (+15 % > 10 %); the root was unconfirmed from big1 and big2 alone
    rows_b = [
        _row("", 100.0),
        _row("big1", 35.0),
        _row("big2", 35.0),
        *(_row(f"t{i}", 0.5, **flops) for i in range(60)),
    ]
    rows_n = [
        _row("", 115.0),
        _row("big1", 35.0),
        _row("big2", 35.0),
        *(_row(f"t{i}", 0.75, **flops) for i in range(60)),
    ]
    g = gate_reports(_report(*rows_b), _report(*rows_n), 0.10)
    assert _verdicts(g)[""] == "regressed" and _verdicts(g)["t0"] == "below_min_share"


def _at_floor(row: ComponentRow, raw: float) -> ComponentRow:
    # the engine's flag: raw - floor <= floor IQR + the pass's own IQR
    row.details["flags"] = ["noisy", "at_floor"]
    row.details["floor_ms"] = {"fwd": 0.005, "bwd": 0.0, "raw_fwd_ms": raw, "fwd_iqr_ms": 0.0005, "at_floor": ["fwd"]}
    return row


def test_a_noisy_pass_far_above_the_floor_is_judged_one_within_the_floors_noise_is_not() -> None:
    # a: 2 ms, its own noise 0.5, flagged at_floor by the engine (its IQR ~1 ms is larger than raw - floor), but
    # 2.005 - 0.005 = 2 ms is far beyond 2 x the floor's IQR (0.001 ms): judged; 2 -> 5 ms is 2.5x, beyond the
    # bound 1 + 2 x 0.5 = 2: regressed. z: raw 0.0058 - 0.005 = 0.0008 <= 0.001: at the floor, not gated.
    # Before, a was not gated, the root unconfirmed (b, c steady) and the gate passed.
    base = _report(
        _row(""), _at_floor(_row("a", 2.0, noise=0.5), 2.005), _row("b", 4.0), _row("c", 4.0),
        _at_floor(_row("z", 0.0008), 0.0058),
    )  # fmt: skip
    base.rows[0].total_ms = 10.0
    new = _report(
        _row("", 13.0), _at_floor(_row("a", 5.0, noise=0.5), 5.005), _row("b", 4.0), _row("c", 4.0),
        _at_floor(_row("z", 0.0009), 0.0059),
    )  # fmt: skip
    g = gate_reports(base, new, 0.10)
    assert _verdicts(g)["a"] == "regressed" and g.regressed[0].path == "a"
    by = {r.path: r for r in g.rows}
    assert (
        by["z"].verdict == "not_gated" and by["z"].reason == "at the harness floor in base; at the harness floor in new"
    )


def test_different_models_could_not_compare_unless_allowed() -> None:
    other = _report(_row("", 10.0, module_type="CNN"), _row("a", 5.0), _row("b", 9.0))  # root Net vs CNN
    g = gate_reports(_three(), other, 0.10)
    assert g.outcome == "inconclusive" and g.inconclusive is not None and "different models" in g.inconclusive
    with pytest.raises(AssertionError, match="different models"):
        assert_no_regression(other, _three())
    g = gate_reports(_three(), other, 0.10, allow_mismatch=True)
    assert g.outcome == "failed" and [r.path for r in g.regressed] == ["b"]  # 5 -> 9 ms


def test_an_estimated_row_takes_its_childrens_noise() -> None:
    # blocks (estimated, no noise) 10 -> 11.2 = blocks.0 + blocks.1, each 5 -> 5.6 (+12 %, noise 0.3: bound 60 %).
    # With UNKNOWN_NOISE (5 %) blocks was regressed (its children's sum +12 % > 10 % confirmed it); its noise is
    # its noisiest child's, 0.3: within noise.
    def rep(k: float) -> Report:
        return _report(
            _row("", 20.0 + 2 * k, noise=0.3), _row("blocks", 10.0 + 2 * k, noise=math.nan, status="estimated"),
            _row("blocks.0", 5.0 + k, noise=0.3), _row("blocks.1", 5.0 + k, noise=0.3),
            _row("x", 5.0, noise=0.3), _row("y", 5.0, noise=0.3),
        )  # fmt: skip

    g = gate_reports(rep(0.0), rep(0.6), 0.10, shift=False)
    by = {r.path: r for r in g.rows}
    assert by["blocks"].verdict == "within_noise" and by["blocks"].noise_bound == pytest.approx(0.6)
    assert g.passed


def test_markdown_escapes_pipes_newlines_and_backticks_in_every_cell() -> None:
    base = _report(_row("", 10.0), _row("a|b", 3.0), _row("x`y", 3.0), _row("c", 3.0), _row("f", 1.0))
    new = _report(
        _row("", 14.0), _row("a|b", 6.0), _row("x`y", 3.0), _row("c", 3.0),
        _row("f", status="failed", error="RuntimeError: boom\nsecond line | with pipe"),
    )  # fmt: skip
    md = format_gate_markdown(gate_reports(base, new, 0.10), labels=("base|dir", "new`dir"))
    assert "| `a\\|b` | Linear |" in md  # GFM splits on | even inside a code span: escaped
    assert "failed in new: RuntimeError: boom second line \\| with pipe |" in md  # one line, the pipe escaped
    assert "base `base|dir`, new ``new`dir``" in md  # not a table: no escape; a fence longer than the backtick
    rows = [ln for ln in md.splitlines() if ln.startswith("| ")]
    assert all(len(ln.replace("\\|", "").split("|")) == 9 for ln in rows), rows  # 7 cells each


def test_the_assertion_says_the_shift_and_the_mismatch() -> None:
    # the leaves b, c, d 2.5 -> 3 ms (1.2: the shift); a 2.5 -> 5.5 ms: 5.5 / 1.2 = 4.58, +83 % after it
    base = _report(_row("", 10.0), *(_row(p, 2.5) for p in "abcd"))
    new = _report(_row("", 14.5, module_type="CNN"), _row("a", 5.5), *(_row(p, 3.0) for p in "bcd"))
    with pytest.raises(AssertionError) as raised:
        assert_no_regression(new, base, allow_mismatch=True)
    lines = str(raised.value).splitlines()
    assert lines[0].startswith("gate: FAILED") and lines[1].startswith("common shift: +20.0 %")
    assert lines[2].startswith("warning: base and new look like different models: root Net vs CNN")
    assert lines[3] == "(change: after the common shift; base and new as measured)"


def test_threshold_types_and_ranges() -> None:
    with pytest.raises(TypeError, match="fail_over=True"):
        gate_reports(_three(), _three(), True)
    with pytest.raises(ValueError, match=r"min_share=1\.5"):
        gate_reports(_three(), _three(), 0.10, min_share=1.5)
    assert gate_reports(_three(), _three(), 1.5).passed  # 1.5 is 150 %
    mem = _report(_row("", peak_mem_mb=100.0), _row("a", peak_mem_mb=50.0), _row("b", peak_mem_mb=50.0))
    more = _report(_row("", peak_mem_mb=130.0), _row("a", peak_mem_mb=80.0), _row("b", peak_mem_mb=50.0))
    text = "\n".join(format_gate_text(gate_reports(mem, more, 0.10, metric="peak_mem_mb")))
    assert "100 MB" in text and "130 MB" in text


def test_a_renamed_and_costlier_parent_is_paired_by_its_childrens_names_and_judged() -> None:
    # p.attn (3 ms, 1 MFLOP) -> p.self_attn (6 ms, 2 MFLOP: other work, so the strict pairing refuses it), its
    # children q and k the same names and types under it: paired, with them. Its own part 1 -> 4 ms: regressed.
    def rep(name: str, t: float, flops: float) -> Report:
        return _report(
            _row("", 4.0 + t), _row("p", 1.0 + t, module_type="Blk"), _row("x", 3.0),
            _row(f"p.{name}", t, module_type="Attn", fwd_flops=flops, params_mb=1.0),
            _row(f"p.{name}.q", 1.0, fwd_flops=1.0, params_mb=1.0),
            _row(f"p.{name}.k", 1.0, fwd_flops=2.0, params_mb=1.0),
        )  # fmt: skip

    base, new = rep("attn", 3.0, 1e6), rep("self_attn", 6.0, 2e6)
    assert rename_pairs(base, new) == {
        "p.attn": "p.self_attn",
        "p.attn.q": "p.self_attn.q",
        "p.attn.k": "p.self_attn.k",
    }
    g = gate_reports(base, new, 0.10)
    by = {r.path: r for r in g.rows}
    assert (by["p.self_attn"].verdict, by["p.self_attn"].renamed_from) == ("regressed", "p.attn")
    assert by["p.self_attn.q"].verdict == "renamed"
    # two siblings of one shape renamed: ambiguous, never guessed
    two = _report(_row(""), _row("a", module_type="Attn"), _row("a.q"), _row("b", module_type="Attn"), _row("b.q"))
    moved = _report(_row(""), _row("c", module_type="Attn"), _row("c.q"), _row("d", module_type="Attn"), _row("d.q"))
    assert rename_pairs(two, moved) == {}
