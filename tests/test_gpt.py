"""The GPT example: the NanoGPT view (blocks, attention, MLP, norms, LM head), attention FLOPs exact."""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from cb_callback import Report, profile_components
from tests._figures import blank_figures
from tests.conftest import FAST, load_example

PEAKS: dict[str, Any] = dict(peak_flops=1e12, peak_bandwidth=1e11)
B, T, C, H, V, L = 2, 16, 32, 4, 50, 2
HD = C // H


@pytest.fixture(scope="module")
def ex() -> ModuleType:
    return load_example("gpt")


@pytest.fixture(scope="module")
def report(ex: ModuleType) -> Report:
    model = ex.build_gpt(ex.GPTConfig(vocab_size=V, block_size=T, n_layer=L, n_head=H, n_embd=C))
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(0))
    # descend="all": every row replayed, whatever the machine's load makes of the in-situ shares and of the
    # groups' members (the triage's decisions follow the times; its own tests pin them)
    return profile_components(model, (idx,), descend="all", **FAST, **PEAKS)


def _linear(fin: int, fout: int) -> int:
    return 2 * B * T * fin * fout  # one multiply-add per (token, in, out)


# Attention per block, forward:
#   QK^T: [B*H, T, hd] @ [B*H, hd, T] -> 2*B*H*T*T*hd; P @ V: the same -> SDPA = 4*B*H*T*T*hd
# backward (torch's flash formula): recompute QK^T, dP = dO V^T, dV = P^T dO, dQ = dS K,
#   dK = dS^T Q: five bmms of 2*B*H*T*T*hd = 10*B*H*T*T*hd. The causal mask is not discounted.
SDPA_FWD = 4 * B * H * T * T * HD
SDPA_BWD = 10 * B * H * T * T * HD


def test_nanogpt_rows_are_present(report: Report) -> None:
    paths = {r.path for r in report}
    for i in range(L):
        for part in (
            "",
            ".ln_1",
            ".attn",
            ".attn.qkv",
            ".attn.proj",
            ".ln_2",
            ".mlp",
            ".mlp.fc",
            ".mlp.act",
            ".mlp.proj",
        ):
            assert f"blocks.{i}{part}" in paths
    assert {"tok_emb", "pos_emb", "ln_f", "lm_head", "blocks"} <= paths
    assert {r.status for r in report} <= {"ok", "estimated"}
    assert report.row("blocks").status == "estimated"  # a ModuleList is never called itself


def test_attention_flops_are_exact_on_cpu(report: Report) -> None:
    attn = report.row("blocks.0.attn")
    # qkv (C -> 3C), SDPA, proj (C -> C); backward: dX and dW of both Linears (the
    # block's input requires grad), and SDPA's backward
    assert attn.fwd_flops == _linear(C, 3 * C) + SDPA_FWD + _linear(C, C)
    assert attn.bwd_flops == 2 * _linear(C, 3 * C) + SDPA_BWD + 2 * _linear(C, C)
    assert "aten._scaled_dot_product_flash_attention_for_cpu" not in attn.details.get("uncounted_ops", [])


def test_block_mlp_head_and_model_flops_are_exact(report: Report) -> None:
    mlp = _linear(C, 4 * C) + _linear(4 * C, C)
    assert report.row("blocks.1.mlp").fwd_flops == mlp
    assert report.row("blocks.1.mlp").bwd_flops == 2 * mlp
    block = _linear(C, 3 * C) + SDPA_FWD + _linear(C, C) + mlp
    assert report.row("blocks.1").fwd_flops == block
    assert report.row("lm_head").fwd_flops == _linear(C, V)
    for norm in ("blocks.0.ln_1", "blocks.0.ln_2", "ln_f"):
        row = report.row(norm)
        assert row.fwd_flops == 0 and row.bytes > 0 and row.details["roofline"]["roof"] == "memory"  # norms: no formula
    # the whole model: L blocks and the head; embeddings and norms count no FLOPs.
    # backward of the first Linear of block 0 also takes dX: the embeddings' sum requires grad
    assert report.row("").fwd_flops == L * block + _linear(C, V)
    assert report.row("").bwd_flops == L * (2 * block + SDPA_BWD - 2 * SDPA_FWD) + 2 * _linear(C, V)


def test_corpus_and_batches_are_deterministic(ex: ModuleType) -> None:
    corpus = ex.CharCorpus(block_size=T)
    assert len(corpus) > 1_000 and corpus.vocab_size < 100
    x, y = corpus.batch(4, seed=1)
    assert x.shape == (4, T) and torch.equal(x[:, 1:], y[:, :-1])  # next-character targets
    assert torch.equal(corpus.batch(4, seed=1)[0], x)


def test_gpt_lightning_module_trains_with_the_callback(
    ex: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blank_figures(monkeypatch)  # reads no image
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    from cb_callback import ComponentBenchmark

    corpus = ex.CharCorpus(block_size=T)
    cfg = ex.GPTConfig(vocab_size=corpus.vocab_size, block_size=T, n_layer=1, n_head=H, n_embd=C)
    loader = DataLoader(corpus, batch_size=B, shuffle=False)
    bench = ComponentBenchmark(capture_step=1, output_dir=str(tmp_path), log_to_tensorboard=False, **FAST, **PEAKS)
    trainer = pl.Trainer(
        max_steps=3, callbacks=[bench], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    trainer.fit(ex.GPTModule(cfg), train_dataloaders=loader)
    assert bench.report is not None
    attn = bench.report.row("model.blocks.0.attn")
    assert attn.fwd_flops == _linear(C, 3 * C) + SDPA_FWD + _linear(C, C)


def test_whatif_example_runs_its_three_checks(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blank_figures(monkeypatch)  # reads no image
    whatif = load_example("whatif")
    argv = ["--backend", "eager", "--compile-top", "2", "--lengths", "8,16", "--batch-size", "2", "--min-run-time", "0"]
    assert whatif.main([*argv, "--out", str(tmp_path)]) == 0  # the hand LayerNorm is equivalent, the tanh-GELU MLP not
    out = capsys.readouterr().out
    assert f"report.html:  {tmp_path.resolve() / 'report.html'}" in out  # the page it wrote, by its path
    assert (tmp_path / "report.html").is_file()
    # the what-if of the compile_top=2 components that cost the most as measured (the root on a quiet machine,
    # not always beside two CPU hogs: a child's times can read above the root's) and of the blocks that take a
    # compiled representative's rows; the summary prints the line of each (of its top 5)
    compiled = [r.path for r in Report.load(tmp_path) if "compile" in r.details and math.isfinite(r.compiled_ms)]
    assert 2 <= len(compiled) <= 5, compiled
    for path in compiled:
        assert f"compiling {path or 'root'} whole:" in out
    assert "p90 ms" in out
    assert "equivalent: all 4 compared tensors are allclose" in out
    assert "NOT equivalent" in out and "grad[fc.weight]" in out
