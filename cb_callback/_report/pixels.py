"""A report's images drawn once: the PNG files and TensorBoard's images share the pixels.

A capture publishes each image twice, as a PNG beside ``report.json``
(:class:`~cb_callback._report.files.FileReporter`) and as a TensorBoard image
(:class:`~cb_callback._report.tensorboard.TensorBoardReporter`), and drawing one
1600x900 matplotlib figure costs a few tenths of a second, while training waits.
:func:`rendered` keeps what it draws until it is asked for once more: the second
reporter takes the pixels the first drew, and nothing stays held after (at most
:data:`KEEP` images, 5.8 MB each, wait for their second use).

The key is the drawing function, its arguments and a digest of everything in
the report (its metadata and every row's fields): a report changed in any way
between two writes is drawn again, so a kept image is never one of another
report, nor another function's. Pixels are identical to
``Figure.savefig(path, dpi=...)``'s at the figure's own dpi, and
:func:`write_png` writes the same PNG bytes.
"""

from __future__ import annotations

import hashlib
import pickle
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

if TYPE_CHECKING:
    from cb_callback._report.model import Report

__all__ = ["KEEP", "figure_pixels", "rendered", "write_png"]

#: Images kept for their second use: a capture's three icicles and its roofline.
KEEP = 4

_kept: OrderedDict[tuple[bytes, Callable[..., Figure], tuple[Hashable, ...]], np.ndarray] = OrderedDict()
_lock = threading.Lock()


def _digest(report: Report) -> bytes | None:
    """A digest of the report's content, or ``None`` when some value cannot be pickled (then nothing is kept)."""
    try:
        data = pickle.dumps((report.metadata, [vars(r) for r in report.rows]), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # an odd value in the metadata: draw every time
        return None
    return hashlib.blake2b(data, digest_size=20).digest()


def figure_pixels(fig: Figure) -> np.ndarray:
    """``fig`` drawn with Agg at its own dpi: an ``(H, W, 4)`` uint8 RGBA array, read-only."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    pixels = np.array(canvas.buffer_rgba(), dtype=np.uint8)
    pixels.flags.writeable = False
    return pixels


def rendered(report: Report, draw: Callable[..., Figure], *args: Hashable) -> np.ndarray:
    """The pixels of ``draw(report, *args)`` (:func:`figure_pixels`).

    Drawn, and kept; the next call with the same ``draw`` and ``args`` for a report with the same
    content takes the kept pixels (and they are let go), so the files and TensorBoard draw each
    image once between them. Only the last :data:`KEEP` images drawn are kept.
    """
    digest = _digest(report)
    key = None if digest is None else (digest, draw, args)
    if key is not None:
        with _lock:
            kept = _kept.pop(key, None)
            if kept is not None:
                return kept
    pixels = figure_pixels(draw(report, *args))
    if key is not None:
        with _lock:
            _kept[key] = pixels
            while len(_kept) > KEEP:
                _kept.popitem(last=False)
    return pixels


def write_png(pixels: np.ndarray, path: str | Path, dpi: float) -> Path:
    """Write RGBA ``pixels`` as the PNG ``Figure.savefig(path, dpi=dpi)`` writes (same bytes); returns ``path``."""
    from matplotlib.image import imsave

    target = Path(path)
    imsave(target, pixels, format="png", dpi=dpi)
    return target
