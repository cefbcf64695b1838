"""bench/gdn_tree.py's command line and its choice of the other verify form beside a small batch's default (no GPU:
the kernels do not run)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest
import torch

from lumotree.optimized import gdn_tree as G

BENCH = Path(__file__).resolve().parents[1] / "bench"
_spec = importlib.util.spec_from_file_location("bench_gdn_tree", BENCH / "gdn_tree.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_shapes_option_parses_batch_by_nodes():
    assert bench.batch_and_nodes("64x128") == (64, 128)
    assert bench.batch_and_nodes("1X8") == (1, 8)
    for bad in ("64", "64x", "ax8", "0x8", "1x0", f"1x{G.MAX_NODES + 1}", "1x2x3"):
        with pytest.raises(argparse.ArgumentTypeError, match="shape"):
            bench.batch_and_nodes(bad)


@pytest.mark.parametrize("N", [64, 128])
def test_other_form_beside_the_small_batch_split_is_the_old_fused_default(N):
    """Where a small batch's default is the split pipeline (from N = 64 in tf32), the benchmark's other form is the
    fused kernel in the shape that was the default before: 32 columns, 4 warps, 3 stages at N = 64; 64 columns,
    8 warps, 2 stages, descriptors past it."""
    x = dict(q=torch.zeros(1, N, 1, 128), v=torch.zeros(1, N, 2, 128))  # [B, N, H, K], [B, N, HV, V] on the CPU
    assert bench.row_config(x, "tf32").split
    name, config = bench.other_config(x, "tf32")
    assert name == "fused" and not config.split
    want = (64, 8, 2, True) if N == 128 else (32, 4, 3, False)
    assert (config.block_v, config.num_warps, config.num_stages, config.tma) == want
