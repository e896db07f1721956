"""The public surface (issue 25 §3): the top level for users, ``cb_callback.plugins`` for plugin authors.

Names that moved out of the top level still resolve there for one release, with a
``DeprecationWarning`` that names their new home, and are the very same objects.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

import cb_callback
import cb_callback.plugins
import cb_callback.reporters


def test_the_top_level_holds_what_a_user_of_the_callback_function_report_and_cli_needs() -> None:
    assert sorted(cb_callback.__all__) == sorted(
        [
            "BenchmarkConfig", "COLUMNS", "Capture", "CheckpointPlan", "Comparison", "ComponentRow", "Report",
            "STATUSES", "compare_components", "plan_checkpointing", "profile_captured", "profile_components",
            "register_device_peaks",
        ]
    )  # fmt: skip
    for name in cb_callback.__all__:
        assert getattr(cb_callback, name) is not None


def test_the_testing_module_holds_the_regression_assertion() -> None:
    # Issue 26 §2: a public module for test suites (pytest), beside the top level.
    import cb_callback.testing

    assert cb_callback.testing.__all__ == ["assert_no_regression"]
    assert callable(cb_callback.testing.assert_no_regression)


def test_every_moved_name_has_one_home_and_every_plugin_name_moved() -> None:
    plugins, reporters = set(cb_callback.plugins.__all__), {"Reporter", "ReportContext"}
    assert set(cb_callback.MOVED) == plugins | reporters
    assert reporters <= set(cb_callback.reporters.__all__)
    assert not set(cb_callback.MOVED) & set(cb_callback.__all__)


@pytest.mark.parametrize("name", sorted(cb_callback.MOVED))
def test_a_moved_name_still_resolves_with_a_warning_naming_its_home(name: str) -> None:
    home = importlib.import_module(cb_callback.MOVED[name])
    with pytest.warns(DeprecationWarning, match=rf"cb_callback\.{name} has moved to {home.__name__}\.{name}"):
        old = getattr(cb_callback, name)
    assert old is getattr(home, name)


def test_the_new_homes_and_the_star_import_warn_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from cb_callback.plugins import MetricPlugin, register_flop_rule  # noqa: F401
        from cb_callback.reporters import ReportContext  # noqa: F401

        namespace: dict[str, object] = {}
        exec("from cb_callback import *", namespace)
    assert set(cb_callback.__all__) <= set(namespace)


def test_an_old_import_line_warns_where_it_is_written() -> None:
    # `from cb_callback import MetricPlugin` in a user's file: the warning points at that file (stacklevel).
    code = "import warnings\nwarnings.simplefilter('always')\nfrom cb_callback import MetricPlugin\n"
    out = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "<string>:3: DeprecationWarning: cb_callback.MetricPlugin has moved to cb_callback.plugins" in out.stderr


def test_one_from_import_warns_once_per_name_and_every_attribute_access_warns() -> None:
    # importlib's from-import looks a package's names up twice (hasattr, then getattr): under an "always"
    # filter, pytest's default, that was two warnings for one line
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from cb_callback import MetricPlugin  # noqa: F401

        line = sys._getframe().f_lineno - 2
        from cb_callback import MetricPlugin as again, register_flop_rule  # noqa: F401, I001 (one statement, two names)

        _ = cb_callback.MetricPlugin
        _ = cb_callback.MetricPlugin
    assert [(str(w.message).split(" has moved")[0], w.filename, w.lineno) for w in caught] == [
        ("cb_callback.MetricPlugin", __file__, line),
        ("cb_callback.MetricPlugin", __file__, line + 3),
        ("cb_callback.register_flop_rule", __file__, line + 3),
        ("cb_callback.MetricPlugin", __file__, line + 5),  # an attribute access: each one warns
        ("cb_callback.MetricPlugin", __file__, line + 6),
    ]
    assert all(issubclass(w.category, DeprecationWarning) for w in caught)
    assert str(caught[0].message) == (
        "cb_callback.MetricPlugin has moved to cb_callback.plugins.MetricPlugin: import it from there (the old "
        "name goes in the next release)"
    )
    assert not set(cb_callback.MOVED) & set(dir(cb_callback))  # nothing cached at the top level


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'MetricPlugins'"):
        _ = cb_callback.MetricPlugins


def test_dir_lists_the_lazy_names_and_not_the_moved_ones() -> None:
    names = dir(cb_callback)
    assert {"ComponentBenchmark", "plugins", "reporters", *cb_callback.__all__} <= set(names)
    assert not set(cb_callback.MOVED) & set(names)  # a moved name is for old code, not for completion
    assert names == sorted(names)


def test_the_callback_module_stays_thin() -> None:
    # Issue 25 §3: the callback is an adapter; its arguments are derived from BenchmarkConfig (test_callback_args).
    from pathlib import Path

    lines = (Path(cb_callback.__file__).parent / "_lightning" / "callback.py").read_text().count("\n")
    assert lines <= 300, f"cb_callback/_lightning/callback.py is {lines} lines"
