"""A report's images drawn once: the PNG files and TensorBoard's images share the pixels.

A capture publishes each image twice, as a PNG beside ``report.json``
(:class:`~cb_callback._report.files.FileReporter`) and as a TensorBoard image
(:class:`~cb_callback._report.tensorboard.TensorBoardReporter`), and drawing one
1600x900 matplotlib figure costs a few tenths of a second, while training waits.
:func:`rendered` keeps what it draws, while a :func:`sharing` scope is open, until
it is asked for once more: the second reporter takes the pixels the first drew.
At most :data:`KEEP` images (5.8 MB each) wait; when the outermost scope closes
(the capture is published) every one left is let go, and outside a scope nothing
is kept at all.

The key is the drawing function, its arguments and a digest of everything in
the report (its metadata and every row's fields): a report changed in any way
between two writes is drawn again, so a kept image is never one of another
report, nor another function's. Pixels are identical to
``Figure.savefig(path, dpi=...)``'s at the figure's own dpi, and
:func:`write_png` writes the same PNG bytes, under matplotlib's default
``savefig.*`` settings; where a user changed one (a transparent or coloured
background, a tight bounding box), :func:`save_png` lets ``savefig`` write the
file, as before, and keeps nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import pickle
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from cb_callback._report.model import Report

__all__ = ["KEEP", "figure_pixels", "rendered", "save_png", "sharing", "write_png"]

#: Images kept for their second use: a capture's three icicles and its roofline.
KEEP = 4

_scopes = 0  # open sharing() scopes, all threads together
_kept: OrderedDict[tuple[bytes, Callable[..., Figure], tuple[Hashable, ...]], np.ndarray] = OrderedDict()
_lock = threading.Lock()


@contextlib.contextmanager
def sharing() -> Iterator[None]:
    """A scope in which images drawn by :func:`rendered` wait for their second use (the files' pixels for
    TensorBoard's image); when the outermost scope closes, every image still waiting is let go."""
    global _scopes
    with _lock:
        _scopes += 1
    try:
        yield
    finally:
        with _lock:
            _scopes -= 1
            if _scopes == 0:
                _kept.clear()


def _digest(report: Report) -> bytes | None:
    """A digest of the report's content, or ``None`` when some value cannot be pickled (then nothing is kept)."""
    try:
        data = pickle.dumps((report.metadata, [vars(r) for r in report.rows]), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # an odd value in the metadata: draw every time
        return None
    return hashlib.blake2b(data, digest_size=20).digest()


def figure_pixels(fig: Figure) -> np.ndarray:
    """``fig`` drawn with Agg at its own dpi: an ``(H, W, 4)`` uint8 RGBA array, read-only."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    pixels = np.array(canvas.buffer_rgba(), dtype=np.uint8)
    pixels.flags.writeable = False
    return pixels


def rendered(report: Report, draw: Callable[..., Figure], *args: Hashable) -> np.ndarray:
    """The pixels of ``draw(report, *args)`` (:func:`figure_pixels`).

    Drawn, and kept while a :func:`sharing` scope is open; the next call with the same ``draw`` and
    ``args`` for a report with the same content takes the kept pixels (and they are let go), so the
    files and TensorBoard draw each image once between them. Only the last :data:`KEEP` images drawn
    are kept.
    """
    digest = _digest(report) if _scopes else None
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
    """Write RGBA ``pixels`` as the PNG ``Figure.savefig(path, dpi=dpi)`` writes under the default
    ``savefig.*`` settings (same bytes; the first row at the top whatever ``image.origin`` says);
    returns ``path``."""
    from matplotlib.image import imsave

    target = Path(path)
    imsave(target, pixels, format="png", dpi=dpi, origin="upper")
    return target


def _plain_savefig() -> bool:
    """Whether ``savefig`` would write exactly the pixels the canvas draws (matplotlib's defaults)."""
    import matplotlib as mpl

    rc = mpl.rcParams
    return (
        rc["savefig.transparent"] is False
        and rc["savefig.facecolor"] == "auto"
        and rc["savefig.edgecolor"] == "auto"
        and rc["savefig.bbox"] in (None, "standard")
    )


def save_png(path: str | Path, dpi: float, report: Report, draw: Callable[..., Figure], *args: Hashable) -> Path:
    """Write ``draw(report, *args)`` as the PNG ``path``: from :func:`rendered`'s pixels (shared with
    TensorBoard) under the default ``savefig.*`` settings, else through ``savefig`` itself; returns ``path``."""
    if not _plain_savefig():  # a setting of the user's that savefig applies and the canvas does not
        target = Path(path)
        draw(report, *args).savefig(target, dpi=dpi)
        return target
    return write_png(rendered(report, draw, *args), path, dpi)
