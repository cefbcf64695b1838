"""The kernel index checks' parts: the launch read as polynomials, the CPU compile to TTIR, a whole check, and the
launch code's int32 validation. The mutation suite (test_proofs_mutations.py) shows each check refuting a planted
index fault."""

from __future__ import annotations

import pytest
import torch

from lumotree.proofs import run_check


def test_decode_kernels_are_proved_with_their_scope():
    result = run_check("kernels/gdn-decode", quick=True)
    assert result.status == "proved", result.detail
    assert result.ok and result.counterexample is None
    assert "_conv_step_kernel" in result.scope["kernels"] and "_gdn_decode_kernel" in result.scope["kernels"]
    assert "B in [1, " in result.scope["launches"] and result.scope["not covered"] and result.scope["numbers"]


def test_launch_numbers_are_polynomials_in_the_sizes():
    from lumotree.proofs import kernel_index_configs as configs
    from lumotree.proofs.kernel_launch import fit

    config = configs.tree_conv()[0]  # N = 64, C = 8192, width 4; B, P, G and the row width X symbolic
    launches, limits = fit(lambda sizes: config.make(config.fixed | sizes), list(config.dims))
    conv = next(launch for launch in launches if launch.name == "_tree_conv_kernel")
    point = {"B": 11, "P": 13, "G": 2, "X": 9000}
    assert conv.numbers[("grid", 0)].at(point) == 11  # one program row per request
    assert conv.numbers[("arg", "s_xb")].at(point) == 64 * 9000  # x is a slice of [G, B, N, X] rows
    assert conv.numbers[("arg", "s_xn")].at(point) == 9000
    assert conv.numbers[("arg", "x_ptr", "span")].at(point) == (11 - 1) * 64 * 9000 + (64 - 1) * 9000 + 8192
    assert any(what == "x" and poly.at(point) == 63 * 9000 + 8191 for what, poly in limits)


def test_kernels_compile_to_ttir_on_the_cpu_with_their_parameter_names():
    from lumotree.proofs import kernel_index_configs as configs
    from lumotree.proofs.kernel_ir import JitWorld, compile_ttir
    from lumotree.proofs.kernel_launch import fit

    config = configs.attention()[1]  # prepare_qkv: `w_ptr = QW` would otherwise name the argument %w_ptr
    launches, _ = fit(lambda sizes: config.make(config.fixed | sizes), list(config.dims))
    launch = launches[0]
    text, signature = compile_ttir(JitWorld(), launch.kernel, launch.sample.args, launch.sample.kwargs)
    header = next(line for line in text.splitlines() if "tt.func" in line)
    assert "%QW: !tt.ptr<f32>" in header and "%KW: !tt.ptr<f32>" in header and "%w_ptr" not in text
    assert signature["BLOCK_D"] == "constexpr" and signature["sqb"] == "i32"
    assert "arith.extsi" in text and " loc(" not in text  # the request index widened to i64; no locations


def test_launch_code_refuses_offsets_within_a_request_past_int32():
    from lumotree.optimized.ops.checks import INDEX_MAX, check_request_rows, request_extent

    rows = torch.empty_strided((2, 3, 4), (2**33, 2**30, 1), device="meta")  # rows 2^30 elements apart
    assert request_extent(rows) == 2 * 2**30 + 3 > INDEX_MAX
    with pytest.raises(ValueError, match=r"^q \(shape \(2, 3, 4\).*int32"):
        check_request_rows("q", rows)
    check_request_rows("q", torch.empty((2**20, 64, 8192), device="meta"))  # contiguous rows: 2^19 per request
