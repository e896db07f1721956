"""The built-in reporters and renderers: the last layer, over a finished ``Report``.

Each reporter follows the :class:`Reporter` contract, ``write(report,
ctx) -> list[Path]`` with a :class:`ReportContext` (``output_dir``,
``step``, ``writer``); pass them as ``reporters=[...]`` to
:func:`cb_callback.profile_components` or call them yourself::

    from cb_callback import profile_components
    from cb_callback.reporters import FileReporter, ReportContext, format_table

    report = profile_components(model, (x,))
    FileReporter().write(report, ReportContext(output_dir=Path("cb_out")))
    print(format_table(report))

- :class:`FileReporter`: ``report.json``, ``components.csv``, ``report.html`` and
  ``icicle_<metric>.png`` in ``ctx.output_dir`` (nothing when it is ``None``);
  :func:`cb_callback.profile_components` adds one when given an ``output_dir``
  and no ``reporters`` of the user's own.
- :class:`TensorBoardReporter`: at ``ctx.step``, scalars
  ``component_benchmark/<metric>/<path>`` (the root as ``root``), texts
  ``component_benchmark/table`` and ``component_benchmark/summary``, images
  ``component_benchmark/icicle/<metric>``; to ``ctx.writer``, else to a
  ``SummaryWriter`` of its own on ``ctx.output_dir``.
- :func:`format_summary`: the plain-text summary (``Report.summary()``).
- :func:`format_table`: a markdown table of every row.

The Lightning callback publishes through the same two reporters, with the
``TensorBoardLogger``'s writer in ``ctx.writer``. Nothing here imports the
engine or Lightning.
"""

from __future__ import annotations

from cb_callback._report.context import ReportContext, Reporter
from cb_callback._report.files import FileReporter
from cb_callback._report.table import format_summary, format_table
from cb_callback._report.tensorboard import TensorBoardReporter

__all__ = ["FileReporter", "ReportContext", "Reporter", "TensorBoardReporter", "format_summary", "format_table"]
