"""The public entry layer: wires the engine and the results model to the renderers.

Above every other layer, this module is the one place that knows all of them
(the engine may not import reporters, and the results model may not import its
renderers; nor may the engine import its metric plugins or the what-ifs), so it
does the joins:

- :func:`profile_components` is the engine's, with a file reporter added when
  an ``output_dir`` is named and the user gave no ``reporters`` of their own:
  the report is where the user asked for it.
- :class:`~cb_callback._report.model.Report`'s renderers (:data:`RENDERERS`): its
  ``summary()`` is :func:`~cb_callback._report.table.format_summary` and its ``save()``
  writes ``report.html`` with :func:`~cb_callback._report.html.write_html`.
- the page's :data:`~cb_callback._report.html.PAGE_DATA`: the checkpointing plan's curve
  (:func:`cb_callback._whatif.checkpoint.page_data`) that report.html draws.
- the engine's :data:`~cb_callback._engine.run.extensions.EXTENSIONS`: the built-in
  metric and artifact plugins (``cb_callback._metrics``) and the compile what-if
  (``cb_callback._whatif.compile``).

``cb_callback/__init__.py`` imports this module, so all of them hold whenever the
package is imported. The file reporter (matplotlib, for its icicles) is
imported only when it is used.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path

from torch import nn

from cb_callback._engine.run import profile as _engine
from cb_callback._engine.run.config import BenchmarkConfig
from cb_callback._engine.run.extensions import EXTENSIONS
from cb_callback._metrics.artifacts import artifact_plugins
from cb_callback._metrics.builtin import builtin_metrics
from cb_callback._report.html import PAGE_DATA, write_html
from cb_callback._report.model import RENDERERS, Report
from cb_callback._report.table import format_summary
from cb_callback._types import OptionValue, UserValue
from cb_callback._whatif.checkpoint import page_data as checkpoint_page_data
from cb_callback._whatif.compile import compile_speedup, compile_what_if, fill_children_separately

__all__ = ["profile_components"]

RENDERERS.summary = format_summary
RENDERERS.page = write_html
PAGE_DATA["checkpoint"] = checkpoint_page_data  # report.html's checkpointing curve (the page may not import it)
EXTENSIONS.builtin_metrics = builtin_metrics
EXTENSIONS.artifact_plugins = artifact_plugins
EXTENSIONS.compile_what_if = compile_what_if
EXTENSIONS.compile_speedup = compile_speedup
EXTENSIONS.fill_children_separately = fill_children_separately


@functools.wraps(_engine.profile_components)
def profile_components(
    model: nn.Module,
    args: UserValue = (),
    kwargs: Mapping[str, UserValue] | None = None,
    *,
    batches: Sequence[UserValue] | None = None,
    config: BenchmarkConfig | None = None,
    **options: OptionValue,
) -> Report:
    # The docstring is the engine's (functools.wraps). What this adds: with an output_dir and
    # no reporters of the user's own (neither the `reporters=` option, even empty, nor a
    # non-empty config.reporters), a FileReporter writes report.json, components.csv,
    # report.html and the icicle PNGs there, beside the artifacts.
    output_dir = options.get("output_dir", getattr(config, "output_dir", None))
    own = "reporters" in options or bool(getattr(config, "reporters", ()))
    if output_dir is not None and not own:
        from cb_callback._report.files import FileReporter

        options = {**options, "reporters": (FileReporter(),)}
    from cb_callback._report.pixels import sharing

    with sharing():  # reporters that draw the same images (files, TensorBoard) draw each once
        report = _engine.profile_components(model, args, kwargs, batches=batches, config=config, **options)
    if output_dir is not None and report.source_dir is None:
        report.source_dir = Path(output_dir).absolute()  # where the engine wrote the artifacts
    return report
