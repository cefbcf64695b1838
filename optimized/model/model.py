r"""The optimized hybrid model (Qwen3-Next, Qwen3.5) on the GPU: prefill, decode, batched tree verify and commit.

Same function as :mod:`lumotree.reference.model` (and transformers' classes of every supported model type), computed
in bf16 with fp32 states on the Triton kernels of :mod:`lumotree.optimized.ops`. Every request owns a *slot* of the
caches (:class:`~lumotree.optimized.model.caches.Caches`); the layers run in one loop for every kind of step
(:mod:`~lumotree.optimized.model.layers`).

- ``verify`` = a tree step (logits of every node), caches untouched until ``commit``;
- ``commit`` advances every cache along each request's accepted path: GDN states from the verify's factors, conv
  states from the path's inputs, KV compaction, one launch per kind for all layers. With ``deferred_commits`` (sm_90),
  steps of trees of 64 nodes at batches of at least 8 verify with the fused GDN kernel instead, and their commit only
  records each layer's accepted path (:mod:`~lumotree.optimized.ops.gdn_tree`): the next such verify applies it while
  it streams the state, so a step reads and writes each state once; any other step flushes its slots' records first;
- ``speculate_greedy`` = tree step, greedy acceptance and commit in one call (one graph);
- ``decode`` = one token per request, every cache advanced in place (the GDN state read and written once);
- ``prefill`` = chunks of up to ``max_nodes`` tokens, each a chain tree + commit of its last node (the GDN core runs
  flash-linear-attention's ``chunk_gated_delta_rule`` on the chunk instead when it is importable on a GPU);
- ``hidden_states(slot, count)`` and ``mtp_head()``: what the last step added to a slot, as the LM head read it, and
  the MTP head on these weights (:mod:`~lumotree.optimized.model.mtp`: :class:`~.mtp.HiddenStates`, the head).

CUDA graphs (GPU, ``graphs=True``): the first call of each shape runs eagerly (compiling the kernels) and captures a
graph per ``("verify", B, N, depth)``, ``("commit", ...)``, ``("greedy", B, N, depth)`` and ``("decode", B)``;
later calls copy their inputs into the graph's static buffers and replay (the engine's ``warm_up`` does this for
every shape it will run, at start). Returned logits of a replayed graph are its static output: valid
until the next call of the same shape (clone to keep them). The engine pads B and N to its buckets.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..ops.checks import MAX_NODES, check_tree_rows
from ..ops.conv_tree import tree_conv_commit
from ..ops.greedy import tree_greedy_accept
from ..ops.gdn_tree import FUSED_MIN_BATCH, TreeFactors, gdn_tree_commit
from ..ops.gdn_tree.fused import fused_verify_supported
from ..ops.pdl import pdl_supported
from ..ops.tree_attention import kv_commit
from ..ops.tree_meta import TreeMeta
from .caches import Caches
from .graphs import GraphCache
from .kernels import step_prologue
from .layers import Layers, Residual, StepBuffers, fla_available
from .memory import free_memory, plan_memory
from .mtp import HiddenStates
from .weights import GDNLayerWeights, ModelWeights, load_weights
from ..parallel import shard as sharding  # the module: the parallel package imports the model's weights
from ..parallel.context import SINGLE, Parallel

__all__ = ["OptimizedModel", "HEAD_ROWS"]

#: rows of the LM head computed at once by a greedy step (its logits are reduced to the argmax chunk by chunk; 1024
#: rows of fp32 logits over a 151936-token vocabulary take 622 MB)
HEAD_ROWS = 1024


@dataclass
class StepRecord:
    """What a tree step leaves for its commit (all tensors stay alive and unmodified until the commit)."""

    B: int
    N: int
    slots: torch.Tensor  # [B] int32
    parents: torch.Tensor  # [B, N] int32
    num_nodes: torch.Tensor  # [B] int32
    meta: TreeMeta
    lens: torch.Tensor  # [B] int32 committed lengths at the step
    factors: TreeFactors | None  # every GDN layer's, stacked [G, ...] (None: deferred, or already advanced)
    layer_factors: list[TreeFactors] | None  # deferred commits: each GDN layer's factors
    conv_inputs: torch.Tensor | None  # [G, B, N, C] every GDN layer's conv inputs (strided: projection rows)
    logits: torch.Tensor  # [B, N, V] fp32 (or [B, 1, V] for prefill chunks); greedy steps: argmax [B, N] int64
    hidden: torch.Tensor | None = None  # [B, N, Dm] final-normed hidden states (keep_hidden_states), else None


class OptimizedModel(Layers, HiddenStates):
    """The hybrid model (every supported type) on the optimized kernels, with slot-addressed caches (see the module
    docstring). ``tensors``: canonical HF-named tensors (:func:`~lumotree.optimized.model.weights.load_weights`) or
    :class:`~lumotree.optimized.model.weights.ModelWeights` already on the device in ``dtype`` (a streamed checkpoint,
    :func:`~lumotree.optimized.model.loader.load_checkpoint`; a layer-skip draft sharing the target's).

    API (the engine builds on these):

    - ``prefill(slot, tokens) -> [V]`` fp32 logits after the last token; resets the slot first.
    - ``decode(slots [B], tokens [B]) -> [B, V]``: one token per slot; caches advance by one.
    - ``verify(slots [B], tokens [B, N], parents [B, N], num_nodes [B] | None) -> [B, N, V]``: logits of every
      node (node i at position ``length + depth(i)``); caches untouched.
    - ``commit(slots [B], accepted [B])``: advance every cache of the last ``verify`` along root..accepted.
    - ``speculate_greedy(...)``: verify, greedy acceptance and commit in one call.
    - ``release(slot)``; ``cache_length(slot)``; attributes ``vocab_size, num_slots,
      max_seq_len, max_nodes, device, dtype, config``, ``memory_plan``.

    ``num_slots`` / ``max_seq_len``: None plans the most that fit the memory left after the weights
    (:func:`~lumotree.optimized.model.memory.plan_memory`, keeping ``memory_headroom`` of it back, and
    ``memory_reserved`` bytes for other uses such as a prefix cache; ``eagle_layers`` = 1: an EAGLE head's KV pools
    counted, as the MTP head's always are); a request that does not fit is refused in one line before allocating.

    ``small_batch_linear``: projections of few token rows on the split-K GEMV instead of cuBLAS (default: on for a
    CUDA model in bf16 / fp16); ``pdl`` (default: where supported): the GEMV as a programmatic dependent launch;
    ``deferred_commits`` (off by default; where the fused GDN verify runs: an sm_90 GPU with Gluon and a bf16 / fp16
    model of ``[128, 128]`` GDN states): tree steps of 64 nodes at batches of at least 8 verify with the fused kernel
    and defer their commits (module docstring). The fused kernel takes fp32 q / k / v and returns fp32 outputs, so
    these steps write the tree conv's outputs in fp32 and read fp32 outputs in the gated norm; in the bf16 benchmark
    model on an H100 at B = 64, N = 64 that extra traffic ate the kernel's gain (36.5 against 36.0 ms a step), so it
    stays off until the fused kernel reads bf16 inputs.

    ``parallel`` (:class:`~lumotree.optimized.parallel.Parallel`): this process is one rank of a tensor-parallel group;
    it keeps its part of the weights (:func:`~lumotree.optimized.parallel.shard_weights`) and the caches of its heads,
    and every step makes the group's collectives (:mod:`~lumotree.optimized.model.layers`). Logits are whole.
    """

    def __init__(
        self,
        config: Any,
        tensors: Mapping[str, Any] | ModelWeights,
        *,
        num_slots: int | None = 8,
        max_seq_len: int | None = 4096,
        max_nodes: int = 64,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        graphs: bool | None = None,
        gdn_precision: str | None = None,
        use_fla: bool | None = None,
        small_batch_linear: bool | None = None,
        pdl: bool | None = None,
        deferred_commits: bool | None = None,
        memory_headroom: float = 0.1,
        memory_reserved: int = 0, eagle_layers: int = 0, parallel: Parallel | None = None,
    ):
        from lumotree.reference.config import HybridConfig

        if not isinstance(config, HybridConfig):
            raise TypeError(f"config must be a lumotree.reference.config.HybridConfig, got {type(config).__name__}")
        for name, value, low, high in (("num_slots", num_slots, 1, 1 << 20), ("max_seq_len", max_seq_len, 1, 1 << 24),
                                       ("max_nodes", max_nodes, 1, MAX_NODES), ("eagle_layers", eagle_layers, 0, 64)):
            if value is None and name in ("num_slots", "max_seq_len"):
                continue  # planned from the free memory
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name} = {value!r} must be an integer in [{low}, {high}]")
        self.config = config
        self.parallel = parallel if parallel is not None else SINGLE
        self.device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        if self.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"dtype = {self.dtype} must be float32, bfloat16 or float16")
        self.max_nodes = max_nodes
        self.graphs = bool(graphs if graphs is not None else self.device.type == "cuda")
        if self.graphs and self.device.type != "cuda":
            raise ValueError("graphs=True needs a CUDA device")
        # tf32 tensor cores for bf16/fp16 models (GDN error ~4e-4, far below the model's own rounding), fp32 FMA
        # (ieee, ~3e-7) for fp32 models
        self.gdn_precision = gdn_precision or ("ieee" if self.dtype == torch.float32 else "tf32")
        self.use_fla = fla_available() if use_fla is None else bool(use_fla)
        if self.use_fla and not fla_available():
            raise ValueError("use_fla=True but flash-linear-attention is not importable on a CUDA device")
        self.eps = float(config.rms_norm_eps)
        if small_batch_linear is None:  # decode projections on ops.gemv (see Layers.linear)
            small_batch_linear = self.device.type == "cuda" and self.dtype != torch.float32
        self.small_batch_linear = bool(small_batch_linear)
        self.fused_norms = True  # residual add + RMSNorm inside the GEMVs around them wherever both run on the GEMV
        self.pdl = pdl_supported(self.device) if pdl is None else bool(pdl) and pdl_supported(self.device)

        if isinstance(tensors, ModelWeights):  # already in the kernels' layouts (a streamed checkpoint, a draft)
            where = tensors.embed.device
            if where.type != self.device.type or self.device.index not in (None, where.index) or \
                    tensors.embed.dtype != self.dtype:
                raise ValueError(f"weights are {tensors.embed.dtype} on {tensors.embed.device}; the model asks for "
                                 f"{self.dtype} on {self.device}")
            kinds = ["linear_attention" if isinstance(w, GDNLayerWeights) else "full_attention" for w in tensors.layers]
            if kinds != list(config.layer_types):
                raise ValueError(f"weights have layers {kinds}, config.layer_types = {list(config.layer_types)}")
            self.weights = tensors
        else:
            self.weights = load_weights(config, tensors, self.device, self.dtype)
        if self.parallel.active or self.weights.shard != (0, 1):  # this rank's part of the weights
            self.weights = sharding.rank_weights(self.weights, config, self.parallel)
        gdn = self.weights.gdn_dims
        fusable = (gdn is not None and gdn[2:4] == (128, 128) and max_nodes >= 64 and self.gdn_precision == "tf32"
                   and fused_verify_supported(self.device))
        if deferred_commits is None:  # measured in the bf16 model: no faster (see the class docstring)
            deferred_commits = False
        elif deferred_commits and not fusable:
            raise ValueError("deferred_commits=True needs the fused GDN verify: an sm_90 GPU with Gluon, [128, 128] "
                             "GDN states, max_nodes >= 64 and a bf16 / fp16 model")
        self._fusable = fusable
        self.memory_plan = plan_memory(
            config, gdn, self.weights.attn_dims, free_bytes=self.parallel.least(free_memory(self.device))
            - int(memory_reserved),  # tensor parallel: every rank plans the same pools (the least free memory)
            dtype=self.dtype, num_slots=num_slots, max_seq_len=max_seq_len, max_nodes=max_nodes, graphs=self.graphs,
            speculative=max_nodes > 1, deferred=bool(deferred_commits), headroom=memory_headroom,
            mtp_layers=len(self.weights.mtp.layers) if self.weights.mtp else 0, eagle_layers=eagle_layers)
        self.num_slots, self.max_seq_len = self.memory_plan.num_slots, self.memory_plan.max_seq_len
        num_slots, self.capacity = self.num_slots, self.max_seq_len + max_nodes
        n_gdn = sum(1 for kind in config.layer_types if kind == "linear_attention")
        self.caches = Caches(num_slots, self.capacity, n_gdn, len(config.layer_types) - n_gdn, gdn,
                             self.weights.attn_dims, self.dtype, self.device, bool(deferred_commits))
        self.lens = self.caches.lens  # [P] committed length per slot (the engine resets padding slots through it)
        self._host_lens = [0] * num_slots  # committed lengths on the host (plus the advances below, once settled)
        self._pending_advance: list[tuple[list[int], torch.Tensor]] = []  # commits not yet read back: (slots, [B])
        self._last_slots: list[int] = []  # host copy of the last verify's slots
        self._last: StepRecord | None = None
        self._last_key: tuple | None = None
        self._graphs = GraphCache(self.device)
        self.init_hidden_states()

    # ------------------------------------------------------------------------------------------------ properties
    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def deferred_commits(self) -> bool:
        """Whether tree steps of 64 nodes at batches of at least ``FUSED_MIN_BATCH`` run fused (module docstring)."""
        return self.caches.pending is not None

    def cache_length(self, slot: int) -> int:
        self._settle_lengths()
        return self._host_lens[self._check_slot(slot)]

    def release(self, slot: int) -> None:
        """Free a slot (its caches are reset by the next ``prefill``)."""
        self._settle_lengths()
        self._host_lens[self._check_slot(slot)] = 0

    def set_deferred_commits(self, enabled: bool) -> None:
        """Turn the fused steps with deferred commits on or off (every pending record is applied first); drops the
        captured CUDA graphs."""
        if enabled and not self._fusable:
            raise ValueError("deferred commits need the fused GDN verify: an sm_90 GPU with Gluon, [128, 128] GDN "
                             "states, max_nodes >= 64 and a bf16 / fp16 model")
        self.caches.flush(list(range(self.num_slots)))
        self.caches.set_deferred(bool(enabled))
        self._graphs.clear()

    def set_small_batch_linear(self, enabled: bool, pdl: bool | None = None, fused_norms: bool | None = None
                               ) -> None:
        """Route the projections of steps with few token rows through the split-K GEMV (or cuBLAS), launched with
        PDL or not (``pdl``; None: unchanged; only where supported), with the residual add + RMSNorm between two
        GEMVs inside them or in their own kernel (``fused_norms``); drops the captured CUDA graphs."""
        self.small_batch_linear = bool(enabled)
        if pdl is not None:
            self.pdl = bool(pdl) and pdl_supported(self.device)
        if fused_norms is not None:
            self.fused_norms = bool(fused_norms)
        self._graphs.clear()

    def captured_graph(self, key: tuple) -> torch.cuda.CUDAGraph:
        """The CUDA graph captured for ``key`` (``("decode", B)`` and so on): for timing its replay alone."""
        return self._graphs.entries[key]["graph"]

    def _settle_lengths(self) -> None:
        """Add the advances of earlier commits to the host lengths. A commit leaves its advance on the device (reading
        it back would wait for the commit's kernels); it is read here, when a host length is next needed."""
        for slots_host, advance in self._pending_advance:
            for s, a in zip(slots_host, advance.tolist()):
                self._host_lens[s] += a
        self._pending_advance.clear()

    @staticmethod
    def _host_slots(slots: torch.Tensor) -> list[int]:
        """``slots`` as a host list: free for a CPU tensor (what the engine passes), a device read otherwise."""
        return [int(s) for s in slots.tolist()]

    # ------------------------------------------------------------------------------------------------ checks
    def _check_slot(self, slot: Any) -> int:
        if isinstance(slot, bool) or not isinstance(slot, (int, np.integer)) or not 0 <= int(slot) < self.num_slots:
            raise ValueError(f"slot = {slot!r} is not a slot index in [0, {self.num_slots})")
        return int(slot)

    def _check_slots(self, slots: Any) -> torch.Tensor:
        if not isinstance(slots, torch.Tensor) or slots.ndim != 1 or slots.numel() == 0:
            raise ValueError("slots must be a non-empty 1-D integer tensor")
        if slots.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"slots has dtype {slots.dtype}, expected int32 or int64")
        host = slots.cpu().tolist()
        for b, s in enumerate(host):
            if not 0 <= s < self.num_slots:
                raise ValueError(f"slots[{b}] = {s} is outside [0, {self.num_slots})")
        if len(set(host)) != len(host):
            raise ValueError(f"slots has repeated entries {host}: each request needs its own slot")
        return slots.to(dtype=torch.int32)

    def _check_tokens(self, name: str, tokens: Any, shape: tuple[int, ...]) -> torch.Tensor:
        if not isinstance(tokens, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tokens).__name__}")
        if tuple(tokens.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(tokens.shape)}, expected {shape}")
        if tokens.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} has dtype {tokens.dtype}, expected int32 or int64")
        bad = (tokens < 0) | (tokens >= self.vocab_size)
        if bool(bad.any()):
            idx = torch.nonzero(bad)[0].tolist()
            raise ValueError(f"{name}{idx} = {int(tokens[tuple(idx)])} is outside the vocabulary "
                             f"[0, {self.vocab_size})")
        return tokens.to(dtype=torch.int64)

    def _check_room(self, slots_host: list[int], n: int) -> None:
        """A step of ``n`` nodes needs the committed length below ``max_seq_len`` and ``n`` free cache rows."""
        self._settle_lengths()
        for b, s in enumerate(slots_host):
            if self._host_lens[s] >= self.max_seq_len or self._host_lens[s] + n > self.capacity:
                raise ValueError(f"slot {s} (request {b}) holds {self._host_lens[s]} tokens: no room for {n} more "
                                 f"(max_seq_len = {self.max_seq_len})")

    def _check_tree_step(self, slots, tokens, parents, num_nodes):
        """The arguments of a tree step (:meth:`verify`, :meth:`speculate_greedy`), checked (on their device)."""
        slots = self._check_slots(slots)
        B = slots.shape[0]
        if not isinstance(tokens, torch.Tensor) or tokens.ndim != 2 or tokens.shape[0] != B:
            raise ValueError(f"tokens must be a [B, N] tensor with B = {B}")
        N = tokens.shape[1]
        if not 1 <= N <= self.max_nodes:
            raise ValueError(f"tokens has N = {N} nodes; this model was built for 1 <= N <= {self.max_nodes}")
        tokens = self._check_tokens("tokens", tokens, (B, N))
        if not isinstance(parents, torch.Tensor) or tuple(parents.shape) != (B, N) or \
                parents.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"parents must be an int32/int64 tensor of shape [B, N] = {(B, N)}")
        parents = parents.to(dtype=torch.int32)
        if num_nodes is None:
            num_nodes = torch.full((B,), N, dtype=torch.int32, device=parents.device)
        elif not isinstance(num_nodes, torch.Tensor) or tuple(num_nodes.shape) != (B,):
            raise ValueError(f"num_nodes must be a tensor of shape [B] = ({B},)")
        num_nodes = num_nodes.to(device=parents.device, dtype=torch.int32)
        bad = (num_nodes < 1) | (num_nodes > N)
        if bool(bad.any()):
            b = int(torch.nonzero(bad)[0])
            raise ValueError(f"num_nodes[{b}] = {int(num_nodes[b])} is outside [1, N = {N}]")
        check_tree_rows(parents, num_nodes)
        self._check_room(slots.tolist(), N)
        return slots, tokens, parents, num_nodes

    # ------------------------------------------------------------------------------------------------ steps
    def _fused(self, B: int, N: int) -> bool:
        """Whether a ``[B, N]`` tree step verifies its GDN layers fused, with deferred commits."""
        return self.deferred_commits and N == 64 and B >= FUSED_MIN_BATCH

    def _tree_step(self, tokens, slots, parents, num_nodes, *, prefill: bool = False, argmax: bool = False,
                   fused: bool = False, max_depth: int | None = None) -> StepRecord:
        """A tree step (module docstring). ``tokens, parents: [B, N]``, ``slots, num_nodes: [B]`` (device tensors).
        ``argmax``: the record holds the argmax of every node's logits instead of the logits, computed over at most
        :data:`HEAD_ROWS` rows at a time. ``fused``: the GDN layers verify fused (fp32 conv outputs; the factors
        kept per layer for deferred commits)."""
        B, N = tokens.shape
        h, _, lens, meta = step_prologue(tokens, slots, self.weights.embed, self.lens, False, (parents, num_nodes))
        # h: [B N, Dm], lens: [B], meta: the tree's ancestor words and depths
        step = StepBuffers(B, N, slots, lens, meta, parents, num_nodes, fused=fused, max_depth=max_depth,
                           chunk=prefill and self.use_fla)
        n_gdn = len(self.caches.state_pools)
        if n_gdn:
            H, HV, K, V, _ = self.weights.gdn_dims
            C = 2 * H * K + HV * V
            step.proj_all = torch.empty((n_gdn, B * N, C + HV * V + 2 * HV), dtype=self.dtype,
                                        device=self.device)  # [G, B N, C + HV V + 2 HV] w_in rows
            step.conv_all = torch.empty((n_gdn, B, N, C), dtype=torch.float32 if fused else self.dtype,
                                        device=self.device)  # [G, B, N, C] q | k | v after the tree conv
            if fused:
                step.layer_factors = []
            elif not step.chunk:
                f32 = dict(dtype=torch.float32, device=self.device)
                step.factors = TreeFactors(torch.empty((n_gdn, B, N, HV, V), **f32),  # [G, B, N, HV, V] delta
                                           torch.empty((n_gdn, B, N, HV), **f32),  # [G, B, N, HV] log Gamma
                                           step.conv_all[..., H * K : 2 * H * K].unflatten(-1, (H, K)),
                                           torch.empty((n_gdn, B, N, H), **f32))  # [G, B, N, H] k_rnorm
        res = Residual(h)  # [B N, Dm] residual stream (fresh: updated in place)
        self.run_layers(res, step)
        x = self.normed(res, self.weights.final_norm).view(B, N, -1)  # [B, N, Dm] final-normed
        hidden = x if self.hidden_rows is not None else None  # [B, N, Dm]
        if prefill:  # only the chunk's last real token needs logits
            last = (num_nodes.long() - 1)[:, None, None].expand(B, 1, x.shape[-1])
            x = x.gather(1, last)  # [B, 1, Dm]
        rows = x.shape[1]
        flat = x.reshape(B * rows, -1)  # [B N or B, Dm]
        if argmax:
            out = torch.cat([self.head(flat[r : r + HEAD_ROWS], argmax=True)
                             for r in range(0, B * rows, HEAD_ROWS)]).view(B, rows)  # [B, N]
        else:
            out = self.head(flat).view(B, rows, -1)  # [B, N or 1, V]
        conv_inputs = step.proj_all.view(n_gdn, B, N, -1)[..., :C] if n_gdn else None  # [G, B, N, C]
        return StepRecord(B, N, slots, parents, num_nodes, meta, lens, step.factors, step.layer_factors, conv_inputs,
                          out, hidden)

    def _decode_step(self, tokens: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """One token per request (``tokens, slots: [B]`` integer device tensors, any stride): every cache advances by
        one in place, no tree and no commit. Returns logits ``[B, V]`` fp32."""
        B = slots.shape[0]
        h, slots, lens, _ = step_prologue(tokens, slots, self.weights.embed, self.lens, True)  # lens: before; += 1
        res = Residual(h)  # [B, Dm] residual stream
        self.run_layers(res, StepBuffers(B, 1, slots, lens))
        x = self.normed(res, self.weights.final_norm)  # [B, Dm] final-normed
        self._keep_decode_hidden(slots, x)
        return self.head(x)

    def _commit(self, rec: StepRecord, accepted: torch.Tensor, advance: torch.Tensor | None = None) -> torch.Tensor:
        """Advance every cache of ``rec``'s slots along root..accepted (device tensors only: graph safe), one launch
        per kind of cache for all layers (or, deferred, one record per GDN layer); returns each slot's length advance
        ``[B]`` (depth of the accepted node + 1, computed here unless given) on the device."""
        c = self.caches
        common = dict(parents=rec.parents, state_indices=rec.slots, num_nodes=rec.num_nodes, meta=rec.meta,
                      validate=False)
        if rec.factors is not None:
            gdn_tree_commit(rec.factors, accepted, initial_state=c.state_stack, input_precision=self.gdn_precision,
                            **common)
        for gi, factors in enumerate(rec.layer_factors or ()):
            gdn_tree_commit(factors, accepted, initial_state=c.state_pools[gi], pending=c.pending[gi], **common)
        if rec.conv_inputs is not None:
            tree_conv_commit(c.conv_stack, rec.slots, rec.conv_inputs, rec.parents, accepted,
                             num_nodes=rec.num_nodes, validate=False)
        if rec.N > 1 and c.k_pools:  # a one-node tree is already in place
            kv_commit(c.k_stack, c.v_stack, rec.slots, rec.lens, rec.meta, accepted, validate=False)
        if advance is None:
            advance = rec.meta.depth.gather(1, accepted.long()[:, None])[:, 0] + 1  # [B]
        self.lens.index_copy_(0, rec.slots.long(), rec.lens + advance)
        if rec.hidden is not None:
            self._keep_path_hidden(rec, accepted)
        return advance

    def _plan(self, host_slots: list[int], parents: torch.Tensor, num_nodes: torch.Tensor) -> tuple[bool, int | None]:
        """A tree step's form: ``(fused, max_depth)``. A step that is not fused first flushes its slots' deferred
        commits. A fused one inverts in tf32 (``max_depth`` None): one graph per shape whatever the trees' depth
        (the fp16 inversion of shallow trees would need a second)."""
        B, N = parents.shape
        if not self._fused(B, N):
            self.caches.flush(host_slots)
            return False, None
        return True, None

    def _run(self, key: tuple, inputs: dict[str, torch.Tensor], body: Callable[..., Any]) -> Any:
        """``body(**inputs)`` through the graph of ``key`` (``graphs``), else eagerly on the model's device."""
        if self.graphs:
            return self._graphs.run(key, inputs, body)
        return body(**{name: t.to(self.device) for name, t in inputs.items()})

    # ------------------------------------------------------------------------------------------------ API
    def prefill(self, slot: int, tokens: Sequence[int] | torch.Tensor, start: int = 0) -> torch.Tensor:
        """Run ``tokens`` (chunks of up to ``max_nodes``) in ``slot`` from the empty cache (``start`` 0: the slot is
        reset) or after the ``start`` tokens it holds (:meth:`restore`); returns the last logits ``[V]`` fp32."""
        slot = self._check_slot(slot)
        ids = tokens if isinstance(tokens, torch.Tensor) else torch.tensor(list(tokens), dtype=torch.int64)
        if ids.ndim != 1 or ids.numel() == 0:
            raise ValueError("tokens must be a non-empty sequence of token ids")
        ids = self._check_tokens("tokens", ids, (ids.numel(),)).to(self.device)
        if start + ids.numel() > self.max_seq_len:
            raise ValueError(f"{start + ids.numel()} prompt tokens exceed max_seq_len = {self.max_seq_len}")
        self._settle_lengths()
        if start == 0:
            self.caches.reset(slot)
            self.lens[slot] = 0
            self._host_lens[slot] = 0
        elif self._host_lens[slot] != start:
            raise ValueError(f"start = {start}: slot {slot} holds {self._host_lens[slot]} tokens")
        slots = torch.tensor([slot], dtype=torch.int32, device=self.device)
        logits = None
        kept: list[torch.Tensor] = []  # [T, Dm] per chunk (keep_hidden_states)
        for first in range(0, ids.numel(), self.max_nodes):
            part = ids[first : first + self.max_nodes][None]  # [1, T]
            T = part.shape[1]
            parents = (torch.arange(T, dtype=torch.int32, device=self.device) - 1)[None]  # chain
            num_nodes = torch.full((1,), T, dtype=torch.int32, device=self.device)
            rec = self._tree_step(part, slots, parents, num_nodes, prefill=True)
            self._commit(rec, num_nodes - 1)
            logits = rec.logits[0, 0]
            if self.hidden_rows is not None:
                kept.append(self.hidden_rows[slot, :T].clone())
        if kept:
            self._prompt_hidden[slot] = torch.cat(kept)  # [T, Dm] of the tokens this prefill ran
        self._host_lens[slot] = start + ids.numel()
        self._last = None
        return logits

    def restore(self, slot: int, kv: list, state: Any, length: int) -> None:
        """Make ``slot`` hold ``length`` tokens: their K / V rows ``(start, end, (k, v))`` and the states after them
        (:meth:`~lumotree.optimized.model.caches.Caches.write`); :meth:`prefill` with ``start=length`` goes on."""
        slot = self._check_slot(slot)
        if not 0 < length < self.max_seq_len:
            raise ValueError(f"length = {length} is outside [1, {self.max_seq_len})")
        self._settle_lengths()
        self.caches.write(slot, kv, state)
        self.lens[slot] = length
        self._host_lens[slot] = length
        self._last = None

    def verify(self, slots: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
               num_nodes: torch.Tensor | None = None, *, validate: bool = True) -> torch.Tensor:
        """Logits ``[B, N, V]`` fp32 of every node of every request's tree; caches untouched until :meth:`commit`."""
        if validate:
            slots, tokens, parents, num_nodes = self._check_tree_step(slots, tokens, parents, num_nodes)
        B, N = tokens.shape
        if num_nodes is None:  # whole trees (also without validation)
            num_nodes = torch.full((B,), N, dtype=torch.int32)
        self._last_slots = self._host_slots(slots)  # before the launch: a device read would wait for the step
        fused, max_depth = self._plan(self._last_slots, parents, num_nodes)
        key = ("verify", B, N, fused, max_depth)
        rec = self._run(key, {"tokens": tokens, "slots": slots, "parents": parents, "num_nodes": num_nodes},
                        lambda **kw: self._tree_step(fused=fused, max_depth=max_depth, **kw))
        self._last, self._last_key = rec, key
        return rec.logits

    def speculate_greedy(self, slots: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
                         num_nodes: torch.Tensor | None = None, *, validate: bool = True) -> torch.Tensor:
        """:meth:`verify`, greedy acceptance and :meth:`commit` of the accepted nodes in one call (one CUDA graph per
        shape; nothing is read back). Each request accepts its deepest node whose every inclusive ancestor carries
        the target's argmax at its parent (:func:`~lumotree.optimized.ops.greedy.tree_greedy_accept` on the step's
        own tree metadata), and its caches advance along root..that node. Returns the packed outcome (``[B, 3 + N]``
        int64 on the device: accepted node, its depth, the argmax there = the next pending token, the on-path mask)."""
        if validate:
            slots, tokens, parents, num_nodes = self._check_tree_step(slots, tokens, parents, num_nodes)
        B, N = tokens.shape
        if num_nodes is None:  # whole trees, next to the tokens (joined with them below)
            num_nodes = torch.full((B,), N, dtype=torch.int32, device=tokens.device)
        self._settle_lengths()  # one pending advance at a time: a replay overwrites its graph's static advance
        host_slots = self._host_slots(slots)
        self._forget_prompt_hidden(host_slots)
        self._last = None
        fused, max_depth = self._plan(host_slots, parents, num_nodes)
        step_in = _step_input(B, tokens, parents, num_nodes, slots)  # [B, 2N + 2]
        packed, advance = self._run(("greedy", B, N, fused, max_depth), {"step_in": step_in},
                                    lambda step_in: self._greedy_step(step_in, fused, max_depth))
        if fused:
            self.caches.deferred.update(host_slots)
        self._pending_advance.append((host_slots, advance))
        return packed

    def _greedy_step(self, step_in: torch.Tensor, fused: bool, max_depth: int | None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """The body of :meth:`speculate_greedy` on ``step_in = tokens | parents | num_nodes | slots: [B, 2N + 2]``
        (device tensors only: graph safe): ``(packed outcome [B, 3 + N], length advance [B])``."""
        N = (step_in.shape[1] - 2) // 2
        tokens = step_in[:, :N].contiguous()  # [B, N]
        parents = step_in[:, N : 2 * N].to(torch.int32).contiguous()  # [B, N]
        num_nodes = step_in[:, 2 * N].to(torch.int32).contiguous()  # [B]
        slots = step_in[:, 2 * N + 1].to(torch.int32).contiguous()  # [B]
        rec = self._tree_step(tokens, slots, parents, num_nodes, argmax=True, fused=fused, max_depth=max_depth)
        outcome = tree_greedy_accept(tokens, rec.logits, parents=parents, num_nodes=num_nodes, meta=rec.meta,
                                     validate=False)  # one launch
        advance = self._commit(rec, outcome.accepted, outcome.advance)  # [B]
        return outcome.packed, advance

    def commit(self, slots: torch.Tensor, accepted: torch.Tensor, *, validate: bool = True) -> None:
        """Advance the caches of the last :meth:`verify` along root..``accepted[b]`` for every request. Nothing is
        read back to the host (the host lengths settle at their next use), so a device ``accepted`` never waits."""
        rec = self._last
        if rec is None:
            raise RuntimeError("commit() needs a verify() first (each verify can be committed once)")
        if validate:
            slots = self._check_slots(slots)
            if slots.shape != rec.slots.shape or not torch.equal(slots.to(rec.slots), rec.slots):
                raise ValueError("slots differ from the slots of the last verify()")
            if not isinstance(accepted, torch.Tensor) or tuple(accepted.shape) != (rec.B,) or \
                    accepted.dtype not in (torch.int32, torch.int64):
                raise ValueError(f"accepted must be an int32/int64 tensor of shape [B] = ({rec.B},)")
            accepted = accepted.to(device=self.device, dtype=torch.int32)
            bad = (accepted < 0) | (accepted >= rec.num_nodes)
            if bool(bad.any()):
                b = int(torch.nonzero(bad)[0])
                raise ValueError(f"accepted[{b}] = {int(accepted[b])} is not a node of tree {b}")
        # the earlier commits' advances first (a graph's advance below is its static output, which the replay
        # overwrites): one pending advance at a time
        self._settle_lengths()
        if self.graphs and self._graphs.result(self._last_key) is rec:  # commit the replayed record in a graph too
            advance = self._graphs.run_captured(("commit", *self._last_key[1:]),
                                                {"accepted": accepted.to(self.device)},
                                                lambda accepted: self._commit(rec, accepted))
        else:
            advance = self._commit(rec, accepted.to(self.device))  # [B] on the device
        if rec.layer_factors is not None:
            self.caches.deferred.update(self._last_slots)
        self._forget_prompt_hidden(self._last_slots)
        self._pending_advance.append((self._last_slots, advance))
        self._last = None

    def decode(self, slots: torch.Tensor, tokens: torch.Tensor, *, validate: bool = True) -> torch.Tensor:
        """One token per slot (``tokens: [B]``); returns logits ``[B, V]`` fp32 and advances every cache by one."""
        if validate:
            slots = self._check_slots(slots)
            tokens = self._check_tokens("tokens", tokens, tuple(slots.shape))
            self._check_room(slots.tolist(), 1)
        B = slots.shape[0]
        host_slots = self._host_slots(slots)  # before the launch: a device read would wait for the step
        self.caches.flush(host_slots)
        self._forget_prompt_hidden(host_slots)
        for s in host_slots:
            self._host_lens[s] += 1
        return self._run(("decode", B), {"step_in": _step_input(B, tokens, slots)},  # [B, 2] tokens | slots
                         lambda step_in: self._decode_step(step_in[:, 0], step_in[:, 1]))


def _step_input(B: int, *parts: torch.Tensor) -> torch.Tensor:
    """The inputs of a step side by side, ``[B, sum of widths]`` int64 where the first one lives: one tensor, so
    host inputs take one copy into a graph's static buffer (host parts joined in numpy: cheaper than torch's CPU
    ops)."""
    if all(t.device.type == "cpu" for t in parts):
        return torch.from_numpy(np.concatenate([t.numpy().reshape(B, -1).astype(np.int64) for t in parts], 1))
    return torch.cat([t.reshape(B, -1).to(parts[0].device, torch.int64) for t in parts], 1)

