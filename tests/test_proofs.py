"""lumotree.proofs: the registry, results, the CLI, and that cheap checks prove the real reference.

The mutation tests (each check refutes a subtly wrong reference) are in test_proofs_mutations.py. The full quick
scope of every check runs in CI as ``lumotree prove --quick``.
"""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from lumotree.cli import main as cli_main
from lumotree.proofs import REGISTRY, STATUSES, default_reference, run_check, run_checks, select_checks
from lumotree.proofs.core import Context, Outcome
from lumotree.proofs.exact import all_parent_arrays, count_parent_arrays, random_parent_array

EXPECTED_CHECKS = {
    "closed-form/sympy": "proved",
    "closed-form/z3": "proved",
    "closed-form/fractions": "checked",
    "commit/sympy": "proved",
    "commit/z3": "proved",
    "commit/fractions": "checked",
    "deep/fractions": "checked",
    "heads/sympy": "proved",
    "chunk/sympy": "proved",
    "nilpotent/sympy": "proved",
    "nilpotent/deep": "checked",
    "induction/sympy": "proved",
    "nilpotent/blocks": "proved",
    "kernel-solve/sympy": "proved",
    "kernel-solve/deep": "checked",
    "kernels/gdn-verify": "proved",
    "kernels/gdn-commit": "proved",
    "kernels/gdn-decode": "proved",
    "kernels/attention": "proved",
    "kernels/tree-conv": "proved",
    "index/ancestor-words": "proved",
    "index/positions": "proved",
    "tree/structure": "proved",
    "conv/sympy": "proved",
    "attention/sympy": "proved",
    "commit/layers": "proved",
    "layers/attention": "checked",
    "layers/gdn": "checked",
    "model/tree-pass": "checked",
    "lossless/iid": "proved",
    "lossless/without-replacement": "proved",
    "lossless/top-k": "proved",
    "lossless/lossy-residual": "refuted",
    "greedy/exhaustive": "proved",
    "lossless/symbolic": "proved",
}


def test_registry_holds_every_check_with_its_expected_status():
    select_checks()
    assert {name: spec.expected for name, spec in REGISTRY.items()} == EXPECTED_CHECKS
    for spec in REGISTRY.values():
        assert spec.claim and spec.docs.endswith(".md")


def test_select_checks_by_family_and_unknown_names():
    assert [s.name for s in select_checks("closed-form")] == [
        "closed-form/sympy",
        "closed-form/z3",
        "closed-form/fractions",
    ]
    assert [s.name for s in select_checks("index/positions")] == ["index/positions"]
    with pytest.raises(ValueError, match="matches no check"):
        select_checks("closed")
    with pytest.raises(ValueError, match="no check named"):
        run_check("no-such-check")


def test_every_parent_array_is_enumerated_once():
    for n in range(1, 7):
        arrays = list(all_parent_arrays(n))
        assert len(arrays) == len(set(arrays)) == count_parent_arrays(n, n)
        assert all(a[0] == -1 and all(0 <= a[i] < i for i in range(1, n)) for a in arrays)
    assert count_parent_arrays(5) == 34
    rng = random.Random(0)
    assert all(len(random_parent_array(7, rng)) == 7 for _ in range(10))


@pytest.mark.parametrize("name", ["index/ancestor-words", "index/positions", "conv/sympy", "nilpotent/sympy",
                                  "kernel-solve/sympy"])
def test_cheap_checks_prove_the_reference(name):
    result = run_check(name, quick=True)
    assert result.status == "proved", result.detail
    assert result.ok and result.counterexample is None
    assert result.seconds >= 0 and result.scope["trees"] and result.scope["numbers"]


def test_missing_reference_part_is_unknown_not_proved():
    ref = dataclasses.replace(default_reference(), verify=None)
    result = run_check("lossless/iid", ref=ref, quick=True)
    assert result.status == "unknown" and "verify" in result.detail
    assert not result.ok


def test_a_reference_that_raises_is_unknown_with_the_error():
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    result = run_check("closed-form/fractions", ref=dataclasses.replace(default_reference(), tree_closed_form=broken))
    assert result.status == "unknown" and "RuntimeError: boom" in result.detail


def test_outcome_rejects_unknown_status():
    with pytest.raises(ValueError, match="status"):
        Outcome("maybe", {})
    assert set(STATUSES) == {"proved", "checked", "refuted", "unknown"}


def test_progress_callback_sees_every_case():
    seen = []
    run_checks("index/positions", quick=True, on_progress=lambda done, total, note: seen.append((done, total)))
    assert seen and seen[-1][0] == seen[-1][1] == len(seen)
    ctx = Context(ref=default_reference())
    assert list(ctx.cases(iter(range(3)), total=3)) == [0, 1, 2]


def test_cli_prove_only_json_and_table(tmp_path, capsys):
    out = tmp_path / "results.json"
    page = tmp_path / "results.md"
    code = cli_main(["prove", "--quick", "--only", "index", "--json", str(out), "--markdown", str(page)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "index/ancestor-words" in printed and "proved" in printed and "2/2 checks as expected" in printed
    payload = json.loads(out.read_text())
    assert payload["scope"] == "quick"
    assert [r["name"] for r in payload["results"]] == ["index/ancestor-words", "index/positions"]
    assert all(r["status"] == "proved" and r["ok"] for r in payload["results"])
    assert "## index/positions" in page.read_text()


def test_cli_exit_status_reflects_unexpected_results(monkeypatch, capsys):
    from lumotree.proofs import core

    broken = dataclasses.replace(default_reference(), mask_bit=lambda words, i, j, word_bits=32: 0)
    monkeypatch.setattr(core, "default_reference", lambda: broken)
    assert cli_main(["prove", "--quick", "--only", "index/ancestor-words"]) == 1
    printed = capsys.readouterr().out
    assert "refuted" in printed and "NO (expected proved)" in printed
    assert cli_main(["prove", "--only", "nonsense"]) == 2


def test_cli_list(capsys):
    assert cli_main(["prove", "--list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in EXPECTED_CHECKS)


def test_z3_checks_do_not_depend_on_earlier_queries_in_the_process():
    """Each case gets a fresh Z3 context and each query a one-shot solver: commit/z3 once timed out after
    closed-form/z3 in the same process (reused context, push/pop switching Z3 to its incremental core)."""
    assert run_check("closed-form/z3", quick=True).status == "proved"
    result = run_check("commit/z3", quick=True)
    assert result.status == "proved", result.detail
    assert result.seconds < 60


def test_z3_verdicts_use_a_resource_limit_not_a_clock(monkeypatch):
    """Deterministic verdicts: the checks' Z3 solvers come from ``exact.z3_solver`` (rlimit: a count of solver steps),
    none sets a wall-clock timeout, so a loaded machine cannot turn a proof into unknown; a tiny rlimit gives unknown
    every time."""
    import inspect

    import z3

    from lumotree.proofs import exact, gdn_checks, index_checks, lossless_symbolic

    x, y = z3.Reals("x y")
    query = (x + y) ** 3 != x**3 + 3 * x * x * y + 3 * x * y * y + y**3
    solver = exact.z3_solver()
    solver.add(query)
    assert solver.check() == z3.unsat
    monkeypatch.setattr(exact, "Z3_RLIMIT", 50)
    verdicts = set()
    for _ in range(3):
        tight = exact.z3_solver()
        tight.add(query)
        verdicts.add(str(tight.check()))
    assert verdicts == {"unknown"}
    for module in (gdn_checks, index_checks, lossless_symbolic):
        source = inspect.getsource(module)
        assert '"timeout"' not in source and "z3.Solver(" not in source


# ---------------------------------------------------------------------------------------------------- kernel shim
def test_shared_memory_views_store_and_read_the_transpose():
    import numpy as np

    from lumotree.proofs.kernel_shim import NotModelled, SharedTile, Tile

    buffer = SharedTile((2, 2))
    with pytest.raises(NotModelled, match="never written"):
        buffer.read()
    p = np.array([[1, 0], [5, 1]], dtype=object)
    buffer.permute((1, 0)).store(Tile(p, None))  # as a K-major B operand is stored
    assert (buffer.read() == p.T).all() and (buffer.permute((1, 0)).read() == p).all()
    with pytest.raises(NotModelled, match="store of"):
        buffer.store(Tile(np.zeros((3, 2), dtype=object), None))


def test_exact_tiles_refuse_what_they_do_not_model():
    from lumotree.proofs.kernel_shim import ExactTiles, NotModelled, Polynomials, PrimeField, executable

    tiles = ExactTiles(Polynomials())
    with pytest.raises(NotModelled, match="not exact"):
        tiles.tl.where(tiles.tl.arange(0, 2) == 0, 0.5, 0)
    with pytest.raises(NotModelled, match="bit cast"):
        tiles.tl.arange(0, 2).to("int32", bitcast=True)
    with pytest.raises(NotModelled, match="global memory"):
        tiles.tl.load(None)
    with pytest.raises(TypeError, match="not a function of the kernels"):
        executable(len, tiles)
    with pytest.raises(ValueError, match="prime below 2"):
        PrimeField(2**27)
    field = ExactTiles(PrimeField(7))
    product = field.tl.dot(field.tile([[3, 4], [0, 5]]), field.tile([[6, 0], [1, 2]]))
    assert product.a.tolist() == [[(18 + 4) % 7, 8 % 7], [5, 10 % 7]]
