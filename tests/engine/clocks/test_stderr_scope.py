"""The profiler's start/stop lines leave stderr; nothing any other thread writes does (issue 8)."""

from __future__ import annotations

import os
import threading

import pytest
import torch
from torch import nn

from cb_callback import profile_components
from cb_callback._engine.clocks.stderr import kineto_lines_dropped
from tests.conftest import FAST

KINETO = b"USDT:2026-12-01 16:16:59 17147:17147 SyncActivityProfilerHandler.cpp:52] profiler_start\n"


def test_another_threads_output_in_the_window_reaches_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    go, done = threading.Event(), threading.Event()

    def worker() -> None:
        go.wait(5)
        os.write(2, b"worker: an error that must not vanish\n")
        done.set()

    thread = threading.Thread(target=worker)
    thread.start()
    with kineto_lines_dropped():
        go.set()
        assert done.wait(5)  # the worker wrote while fd 2 pointed at the window
        os.write(2, KINETO)
        os.write(2, b"main: kept too\n")
    thread.join()
    assert capfd.readouterr().err == "worker: an error that must not vanish\nmain: kept too\n"


def test_stderr_is_back_after_an_exception(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(KeyError), kineto_lines_dropped():
        raise KeyError("x")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"


def test_profiling_prints_no_kineto_line(capfd: pytest.CaptureFixture[str]) -> None:
    report = profile_components(nn.Linear(4, 4), (torch.randn(2, 4),), **FAST, peak_flops=1e12, peak_bandwidth=1e11)
    assert report.row("").peak_mem_mb is not None  # the memory metric's profiler did start and stop
    err = capfd.readouterr().err
    assert "profiler_start" not in err and "profiler_stop" not in err, err
