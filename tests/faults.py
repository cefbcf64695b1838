"""Realistic faults a kernel author could make, planted one at a time in the reference's source text.

Each :class:`Fault` edits the source of one or more reference or kernel functions (an exact snippet, which must occur
as often as stated, so a fault can never silently stop applying when the code changes), recompiles them in their
module and installs them everywhere the original object was bound (a function imported by name into another module
is replaced there too, as an edit of the file would). A ``@gluon.jit`` function is installed as the plain Python
function of its edited source, a ``@triton.jit`` one as a kernel again (its edited text registered with
``linecache``, so Triton reads that text): the schedule checks run either on exact numbers
(:mod:`lumotree.proofs.kernel_shim`), the index checks compile the Triton kernel to TTIR on the CPU
(:mod:`lumotree.proofs.kernel_ir`); never a GPU build. ``killers`` are the checks of ``lumotree prove --quick`` that
cover the mistake: each must come out ``refuted`` with the fault installed. ``mistake`` names the class of mistake
the fault stands for.
"""

from __future__ import annotations

import __future__

import importlib
import inspect
import linecache
import pkgutil
import sys
import textwrap
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import lumotree.reference

SHARED = "convention shared by both sides of an identity"
TRANSPOSE = "transpose invisible at key / value dimension 1"
OUTSIDE = "code outside the proved core functions"
PAST_SCOPE = "size just past a bounded scope"
OFF_BY_ONE = "off-by-one / inclusive-exclusive"
SCHEDULE = "solve schedule"
LOSSLESS = "rejection-sampling rule"
INDEX = "kernel index arithmetic (stride, slot, head map, int32 offset)"


@dataclass(frozen=True)
class Edit:
    """Replace ``old`` by ``new`` (``count`` occurrences, all of them) in the source of ``target``
    (``"module.function"`` or ``"module.Class.member"`` under ``lumotree.reference``, or ``"optimized.<module
    path>.function"`` for a kernel module's function)."""

    target: str
    old: str
    new: str
    count: int = 1


@dataclass(frozen=True)
class Fault:
    name: str
    mistake: str
    description: str
    edits: tuple[Edit, ...]
    killers: tuple[str, ...]


def _resolve(target: str) -> tuple[Any, Any, str, Any]:
    if target.startswith("optimized."):
        module_name, _, name = target.rpartition(".")
        module = importlib.import_module(f"lumotree.{module_name}")
        return module, module, name, inspect.getattr_static(module, name)
    module_name, *path = target.split(".")
    module = importlib.import_module(f"lumotree.reference.{module_name}")
    owner = module
    for name in path[:-1]:
        owner = getattr(owner, name)
    return module, owner, path[-1], inspect.getattr_static(owner, path[-1])


def _function_of(member: Any) -> Any:
    if isinstance(member, cached_property):
        return member.func
    if isinstance(member, property):
        return member.fget
    return getattr(member, "fn", member)  # a kernel function: its Python function


def mutated(target: str, edits: list[Edit]) -> tuple[Any, Any, str, Any, Any]:
    """``(module, owner, name, original, mutant)``: ``target`` with ``edits`` applied in order to its source, compiled
    in its module's globals."""
    module, owner, name, original = _resolve(target)
    function = _function_of(original)
    source = textwrap.dedent(inspect.getsource(function))
    if hasattr(original, "fn"):  # a kernel function: its source without the decorator, a plain function
        source = source[source.index("def "):]
    for edit in edits:
        found = source.count(edit.old)
        if found != edit.count:
            raise AssertionError(f"{target}: {edit.old!r} occurs {found} times, the fault expects {edit.count}")
        source = source.replace(edit.old, edit.new)
    namespace: dict[str, Any] = {}
    filename = inspect.getsourcefile(function) or "<fault>"
    triton_kernel = type(original).__name__ in ("JITFunction", "InterpretedFunction")  # not Gluon's subclass
    if triton_kernel:  # Triton reads a kernel's source with inspect: the edited text, under a name of its own
        filename = f"<fault {target} {hash(source) & 0xFFFFFFFF:08x}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    code = compile(source, filename, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, module.__dict__, namespace)
    mutant = namespace[function.__name__]
    if triton_kernel:  # a kernel again (the interpreter's under TRITON_INTERPRET=1), as the launch code calls it
        import triton

        options = {k: v for k, v in (getattr(original, "kwargs", None) or {}).items()
                   if k in ("do_not_specialize", "do_not_specialize_on_alignment", "noinline") and v}
        mutant = triton.jit(mutant, **options)
    if isinstance(mutant, cached_property):
        mutant.__set_name__(owner, name)
    return module, owner, name, original, mutant


def install(fault: Fault, monkeypatch: Any) -> None:
    """Plant ``fault`` (undone by ``monkeypatch`` at the end of the test)."""
    reference_modules = [importlib.import_module(f"lumotree.reference.{info.name}")
                         for info in pkgutil.iter_modules(lumotree.reference.__path__)]
    targets: dict[str, list[Edit]] = {}
    for edit in fault.edits:
        targets.setdefault(edit.target, []).append(edit)
    for target, edits in targets.items():
        module, owner, name, original, mutant = mutated(target, edits)
        monkeypatch.setattr(owner, name, mutant)
        # the kernel modules imported by now (resolving the target imports its package)
        kernel_modules = [m for key, m in list(sys.modules.items()) if key.startswith("lumotree.optimized.")]
        if owner is module:  # every `from .module import name` binding too
            for other in (kernel_modules if target.startswith("optimized.") else reference_modules):
                if other is not module and getattr(other, name, None) is original:
                    monkeypatch.setattr(other, name, mutant)


F = Fault
E = Edit

FAULTS: tuple[Fault, ...] = (
    # ------------------------------------------------------------------ conventions shared by both sides
    F("gva-head-map-modulo", SHARED,
      "value head h reads q/k head h % H instead of h // (HV // H), in every GDN function alike",
      (E("gdn.chain", "h // group", "h % H", 2), E("gdn.tree_recurrent", "h // group", "h % H", 2),
       E("gdn.tree_closed_form", "h // group", "h % H", 2), E("gdn.commit", "h // group", "h % H")),
      ("heads/sympy", "chunk/sympy")),
    F("gqa-head-map-modulo", SHARED, "attention query head h reads kv head h % Hkv instead of h // (Hq // Hkv)",
      (E("attention.tree_attention_core", "h // group", "h % Hkv", 2),),
      ("attention/sympy",)),
    F("path-drops-the-root", SHARED,
      "TokenTree.path stops before the root (while node > 0): both sides of the conv and KV checks read paths",
      (E("tree.TokenTree.path", "while node >= 0:", "while node > 0:"),),
      ("tree/structure", "commit/sympy")),
    F("depth-counts-from-one", SHARED, "TokenTree.depth gives the root depth 1, shifting every position alike",
      (E("tree.TokenTree.depth", "d = np.zeros(self.num_nodes, dtype=np.int64)",
         "d = np.ones(self.num_nodes, dtype=np.int64)"),),
      ("tree/structure", "index/positions", "layers/attention")),
    F("position-one-past", SHARED, "node_position = prefix_len + depth + 1 (the pending token counted twice)",
      (E("tree.node_position", "return prefix_len + depth", "return prefix_len + depth + 1"),),
      ("index/positions", "layers/attention")),
    # ------------------------------------------------------------------ transposes (invisible at K = V = 1)
    F("recurrence-reads-state-transposed", TRANSPOSE, "one recurrence step forms S k instead of k^T S",
      (E("gdn.step", "kS = k_t @ S", "kS = S @ k_t"),),
      ("closed-form/z3", "closed-form/sympy")),
    F("commit-outer-product-transposed", TRANSPOSE, "the commit adds delta_j k_j^T instead of k_j delta_j^T",
      (E("gdn.commit", "np.outer(k[j, h // group], delta[j, h])", "np.outer(delta[j, h], k[j, h // group])"),),
      ("commit/z3", "commit/sympy")),
    F("output-reads-S0-transposed", TRANSPOSE, "the closed form's output term Q S0 uses S0^T",
      (E("gdn.tree_closed_form", "(Qh @ S0[h])", "(Qh @ S0[h].T)"),),
      ("closed-form/z3",)),
    # ------------------------------------------------------------------ code outside the proved core functions
    F("word-fold-copies-previous-row", OUTSIDE, "ancestor_words copies node i - 1's row instead of its parent's",
      (E("tree.ancestor_words", "words[p] if p >= 0", "words[i - 1] if p >= 0"),),
      ("index/ancestor-words",)),
    F("word-fold-word-count", OUTSIDE, "ancestor_words allocates n // 32 + 1 words (one too many when 32 divides N)",
      (E("tree.ancestor_words", "n_words = (n + word_bits - 1) // word_bits", "n_words = n // word_bits + 1"),),
      ("index/ancestor-words",)),
    F("rope-at-node-index", OUTSIDE, "the attention layer rotates node i at prefix + i (its slot) instead of its depth",
      (E("attention.attention_layer_tree", "node_position(cache.length, tree.depth)",
         "node_position(cache.length, np.arange(tree.num_nodes))"),),
      ("layers/attention",)),
    F("rope-without-prefix", OUTSIDE, "the attention layer rotates from position 0 each step (cache length ignored)",
      (E("attention.attention_layer_tree", "node_position(cache.length, tree.depth)",
         "node_position(0, tree.depth)"),),
      ("layers/attention",)),
    F("kv-compaction-reads-depth-slot", OUTSIDE, "KV compaction reads slot prefix + depth(j) instead of prefix + j",
      (E("attention.kv_commit", "tree_slot(length, j)", "tree_slot(length, int(depth[j]))"),),
      ("attention/sympy", "commit/layers")),
    F("layer-commit-keeps-conv-state", OUTSIDE, "the GDN layer commit leaves the conv state as it was",
      (E("gdn.gdn_layer_commit", "conv_state=conv_state_commit(record.conv_inputs, cache.conv_state, tree, node)",
         "conv_state=cache.conv_state.copy()"),),
      ("commit/layers", "layers/gdn")),
    F("layer-commit-state-of-parent", OUTSIDE, "the GDN layer commit rebuilds the state of the accepted node's parent",
      (E("gdn.gdn_layer_commit", "state=commit(cache.state, record.factors, tree, node)",
         "state=commit(cache.state, record.factors, tree, max(tree.parents[node], 0))"),),
      ("commit/layers", "layers/gdn")),
    F("model-commit-length-short", OUTSIDE, "the model commit advances the length by the path minus the pending root",
      (E("model.HybridModel.commit_pass", "cache.length + path_len", "cache.length + path_len - 1"),),
      ("commit/layers", "model/tree-pass")),
    F("model-commit-records-reversed", OUTSIDE, "the model commit pairs layer caches with the records in reverse",
      (E("model.HybridModel.commit_pass", "zip(cache.layers, tree_pass.records)",
         "zip(cache.layers, tree_pass.records[::-1])"),),
      ("commit/layers",)),
    F("greedy-float-argmax-axis", OUTSIDE, "greedy verification on float logits takes the argmax over nodes",
      (E("verify.verify_greedy", "np.argmax(target, axis=1)", "np.argmax(target, axis=0)"),),
      ("greedy/exhaustive",)),
    F("greedy-float-ties-high", OUTSIDE, "greedy verification on float logits breaks ties to the highest token id",
      (E("verify.verify_greedy", "np.argmax(target, axis=1).tolist()",
         "(target.shape[1] - 1 - np.argmax(target[:, ::-1], axis=1)).tolist()"),),
      ("greedy/exhaustive",)),
    F("conv-commit-of-last-drafted-node", OUTSIDE,
      "the conv state after a commit is the window of the last node in index order, not of the accepted one",
      (E("gdn.conv_state_commit", "conv_window_index(tree, kernel)[node, 1:]",
         "conv_window_index(tree, kernel)[tree.num_nodes - 1, 1:]"),),
      ("conv/sympy", "commit/layers")),
    # ------------------------------------------------------------------ sizes just past the bounded scopes
    F("residual-buffer-of-four-draws", PAST_SCOPE,
      "the residual lives in a buffer of four draws: after the fourth rejection it restarts from the target",
      (E("verify._recursive_rejection", "for child, Q in proposal.child_proposals(node, vocab_size):",
         "for index, (child, Q) in enumerate(proposal.child_proposals(node, vocab_size)):"),
       E("verify._recursive_rejection", "R = on_reject(R, Q)", "R = on_reject(R, Q) if index % 4 != 3 else P[node]")),
      ("lossless/iid",)),
    F("solve-window-16", PAST_SCOPE, "the triangular solve subtracts only the 16 nearest ancestors",
      (E("solve.forward_substitution", "for j in tree.path(i)[:-1]:", "for j in tree.path(i)[-17:-1]:"),),
      ("deep/fractions",)),
    F("commit-window-64", PAST_SCOPE, "the commit sums the last 64 nodes of the path only (one kernel tile)",
      (E("gdn.commit", "path = tree.path(node)", "path = tree.path(node)[-64:]"),),
      ("deep/fractions",)),
    F("doubling-rounds-capped", PAST_SCOPE, "the doubling solve runs at most four rounds (depth 15)",
      (E("solve.doubling_levels", "return int(max_depth).bit_length()",
         "return min(int(max_depth).bit_length(), 4)"),),
      ("nilpotent/deep",)),
    F("conv-window-one-ancestor-short", PAST_SCOPE,
      "the tree convolution takes W - 2 ancestors and one conv-state row too many (depths past the window)",
      (E("gdn.conv_window_index", "while node >= 0 and len(lineage) < kernel:",
         "while node >= 0 and len(lineage) < kernel - 1:"),),
      ("conv/sympy", "layers/gdn")),
    # ------------------------------------------------------------------ off-by-one, inclusive / exclusive
    F("decay-misses-own-alpha", OFF_BY_ONE, "D_ij for a strict ancestor j misses alpha_i",
      (E("gdn.path_decay", "D[i, j] = D[p, j] * alpha[i]", "D[i, j] = D[p, j]"),),
      ("closed-form/sympy", "closed-form/z3")),
    F("output-mask-exclusive", OFF_BY_ONE, "the output term uses the strict mask: a node does not see its own delta",
      (E("gdn.tree_closed_form", "((Qh @ Kh.T) * D)", "((Qh @ Kh.T) * np.where(strict, D, 0))"),),
      ("closed-form/sympy", "chunk/sympy")),
    F("commit-weight-includes-own-alpha", OFF_BY_ONE,
      "the commit weighs k_j delta_j^T with Gamma_a / Gamma_parent(j) (alpha_j once too often)",
      (E("gdn.commit", """            acc = acc + np.outer(k[j, h // group], delta[j, h]) * below
            below = alpha[j, h] * below""", """            below = alpha[j, h] * below
            acc = acc + np.outer(k[j, h // group], delta[j, h]) * below"""),),
      ("commit/sympy", "commit/z3", "commit/fractions")),
    F("recurrence-decays-after-write", OFF_BY_ONE, "one recurrence step decays the state after the write",
      (E("gdn.step", "S_new = (S - np.outer(k_t, kS) * beta_t) * alpha_t + np.outer(k_t, v_t) * beta_t",
         "S_new = (S - np.outer(k_t, kS) * beta_t + np.outer(k_t, v_t) * beta_t) * alpha_t"),),
      ("closed-form/sympy", "chunk/sympy")),
    F("attention-mask-exclusive", OFF_BY_ONE, "tree attention leaves out the node itself",
      (E("attention.tree_attention_core", "tree.ancestor_mask], axis=1)",
         "tree.ancestor_mask & ~np.eye(N, dtype=bool)], axis=1)"),),
      ("attention/sympy",)),
    F("depth-assumes-a-chain", OFF_BY_ONE, "TokenTree.depth counts one more than the previous node, not the parent",
      (E("tree.TokenTree.depth", "d[i] = child_depth(d[self.parents[i]])", "d[i] = child_depth(d[i - 1])"),),
      ("tree/structure", "index/positions")),
    # ------------------------------------------------------------------ solve schedules
    F("solve-mask-keeps-diagonal", SCHEDULE,
      "A is built on the inclusive mask: forward substitution never reads the diagonal, the doubling does",
      (E("gdn.tree_closed_form", "strict = tree.ancestor_mask & ~np.eye(N, dtype=bool)",
         "strict = tree.ancestor_mask"),),
      ("closed-form/fractions",)),
    F("halves-lower-block-sign", SCHEDULE, "the inverse by halves adds T_22 A_21 T_11 instead of subtracting it",
      (E("solve.inverse_by_halves", "inverse[split:, :split] = -(t22 @ A[split:, :split] @ t11)",
         "inverse[split:, :split] = t22 @ A[split:, :split] @ t11"),),
      ("nilpotent/sympy", "nilpotent/deep")),
    F("doubling-starts-with-plus-a", SCHEDULE, "the doubling's first factor is I + A instead of I - A",
      (E("solve.inverse_by_doubling", "power = -A  # [n, n] P_0", "power = A  # [n, n] P_0"),),
      ("nilpotent/sympy", "nilpotent/blocks")),
    # ------------------------------------------------------------------ the kernels' schedules and launch constants
    F("kernel-levels-strict-comparison", OFF_BY_ONE,
      "the Triton kernels count doubling factors for depths > 2^e instead of >= 2^e (one factor short at 2^e)",
      (E("optimized.ops.gdn_tree.primitives._levels_of", "(depth_max >= (1 << e))", "(depth_max > (1 << e))"),),
      ("kernel-solve/sympy", "kernel-solve/deep")),
    F("kernel-factor-cap-one-short", PAST_SCOPE,
      "the launch passes LOG_NP = log2 NP - 1: the doubling stops one factor short on trees deeper than NP / 2",
      (E("optimized.ops.gdn_tree.config.tile_constants", "NP.bit_length() - 1", "NP.bit_length() - 2"),),
      ("kernel-solve/deep",)),
    F("kernel-overlap-skips-a-factor", SCHEDULE, "the overlapped doubling starts its loop one round late",
      (E("optimized.ops.gdn_tree.primitives._inverse_unit_lower", "for _ in range(2, levels):",
         "for _ in range(3, levels):"),),
      ("kernel-solve/sympy", "kernel-solve/deep")),
    F("kernel-halves-drop-lower-block", SCHEDULE, "the kernels' inverse by halves leaves its lower-left block zero",
      (E("optimized.ops.gdn_tree.primitives._inverse_unit_lower_halves",
         "tl.join(tl.join(t11, t21), tl.join(zero, t22))", "tl.join(tl.join(t11, zero), tl.join(zero, t22))"),),
      ("kernel-solve/sympy", "kernel-solve/deep")),
    F("fused-count-at-least-one", OFF_BY_ONE, "the fused kernel runs one round for trees two deep (at least 1, not 2)",
      (E("optimized.ops.gdn_tree.fused_kernel._doubling_count", "gl.maximum(levels, 2)", "gl.maximum(levels, 1)"),),
      ("kernel-solve/sympy",)),
    F("fused-last-square-dropped", SCHEDULE, "the fused doubling leaves out the last round's square P^(2^L)",
      (E("optimized.ops.gdn_tree.fused_kernel._doubling_rounds", "return inv + gl.where(levels > 1, power, 0.0)",
         "return inv"),),
      ("kernel-solve/sympy", "kernel-solve/deep")),
    F("fused-b-operand-untransposed", TRANSPOSE,
      "the fused doubling stores P row-major into the buffer it reads through the transposed (K-major) view",
      (E("optimized.ops.gdn_tree.fused_kernel._doubling_rounds",
         "cols_smem.permute((1, 0)).store(power.to(rows_smem.dtype))", "cols_smem.store(power.to(rows_smem.dtype))",
         2),),
      ("kernel-solve/sympy", "kernel-solve/deep")),
    # ------------------------------------------------------------------ the kernels' index arithmetic (TTIR, Z3)
    F("conv-step-state-row-stride", INDEX,
      "the decode conv step strides pool slots by W C instead of (W - 1) C: the last slot reads past the pool",
      (E("optimized.ops.gdn_decode._conv_step_kernel", "slot * ((WIDTH - 1) * C)", "slot * (WIDTH * C)"),),
      ("kernels/gdn-decode",)),
    F("conv-step-shift-mask-inclusive", OFF_BY_ONE,
      "the decode conv step's state rows are masked rows <= W - 1: one row past the slot's W - 1 rows",
      (E("optimized.ops.gdn_decode._conv_step_kernel", "row_ok = rows < WIDTH - 1", "row_ok = rows <= WIDTH - 1"),),
      ("kernels/gdn-decode",)),
    F("prepare-batch-offset-int32", INDEX,
      "prepare_qkv forms the request offset b * sqb in int32 (overflows past 2^31 elements, 2^31 / (N X) requests)",
      (E("optimized.ops.tree_attention.prepare._prepare_qkv_kernel", "b = tl.program_id(0).to(tl.int64)",
         "b = tl.program_id(0)"),),
      ("kernels/attention",)),
    F("tree-conv-output-input-stride", INDEX,
      "the tree convolution writes its output rows with the input's row stride (a view's X) instead of C",
      (E("optimized.ops.conv_tree.kernels._tree_conv_kernel", "(b64 * N + nodes[:, None]) * C",
         "(b64 * N + nodes[:, None]) * s_xn"),),
      ("kernels/tree-conv",)),
    F("pending-key-head-unmapped", INDEX,
      "the pending flush reads value head hv's keys at key row hv, not at its key head hv // (HV / H)",
      (E("optimized.ops.gdn_tree.pending._apply_pending", "(slot * H + hv // (HV // H))", "(slot * H + hv)"),),
      ("kernels/gdn-commit",)),
    F("apply-state-by-request", INDEX,
      "the verify's apply kernel reads the state of request b instead of its pool slot (past the pool for B > P)",
      (E("optimized.ops.gdn_tree.apply._gdn_tree_apply_kernel", "slot * HV + hv", "b * HV + hv", 2),),
      ("kernels/gdn-verify",)),
    # ------------------------------------------------------------------ the rejection-sampling rule
    F("residual-not-renormalised", LOSSLESS, "after a rejection the residual max(0, R - Q) is not renormalised",
      (E("verify.verify_sampling", "_recursive_rejection(proposal, target, coins, residual)",
         "_recursive_rejection(proposal, target, coins, _unnormalised_excess)"),),
      ("lossless/iid",)),
    F("tried-token-not-removed", LOSSLESS, "without replacement, Q keeps the tokens already tried",
      (E("verify.DraftProposal.child_proposals", "remaining[tokens[c]] = 0 * remaining[tokens[c]]", "pass"),),
      ("lossless/without-replacement",)),
    F("accept-with-joint-probability", LOSSLESS, "accepts with probability min(R(x), Q(x)) instead of min(1, R/Q)",
      (E("verify._recursive_rejection", "min(1, R[x] / Q[x])", "min(R[x], Q[x])"),),
      ("lossless/iid", "lossless/symbolic")),
    F("bonus-token-from-target", LOSSLESS, "after every draft is rejected, samples from the target, not the residual",
      (E("verify._recursive_rejection", "coins.categorical([r / total for r in R])", "coins.categorical(P[node])"),),
      ("lossless/top-k", "lossless/symbolic")),
    F("top-k-verified-as-sampled", LOSSLESS, "deterministic (top-k) drafts verified as if drawn from the drafter's Q",
      (E("verify.DraftProposal.child_proposals", "out.append((c, point))",
         "out.append((c, list(self.proposals[node]) if self.proposals[node] is not None else point))"),),
      ("lossless/top-k",)),
    F("greedy-compares-with-root-argmax", OFF_BY_ONE, "greedy verification compares every level with the root's argmax",
      (E("verify.verify_greedy", "child = tree.child_with_token(path[-1], best[path[-1]])",
         "child = tree.child_with_token(path[-1], best[path[0]])"),),
      ("greedy/exhaustive",)),
)
