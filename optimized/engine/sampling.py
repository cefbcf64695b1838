"""Sampling parameters, counter-based coins, and lossless tree verification batched over requests (torch).

Everything here runs on whatever device its tensors live on (the GPU in the engine, the CPU in the tests) and is the
batched counterpart of :mod:`lumotree.reference.verify`:

- **Greedy**: node i is accepted iff its token is the argmax at its parent and its parent is accepted; the deepest
  accepted node wins and the argmax there is the next pending token. All nodes of all requests are checked at once;
  the "parent accepted" chain is read off the inclusive ancestor masks (built once per step on the host).
- **Lossless sampling** (recursive rejection sampling): at an accepted node u with target distribution ``P_u`` the
  residual is ``R = P_u``; each child c (token ``x_c`` drawn from ``Q_c``) is accepted with probability
  ``min(1, R(x_c) / Q_c(x_c))`` and the walk descends; on rejection ``R = norm(max(0, R - Q_c))``. When every child
  is rejected, the next token is drawn from ``R``. The variants differ only in ``Q_c``:
  ``iid`` (children drawn independently from the drafter's ``q_u``), ``without_replacement`` (``q_u`` renormalised
  with the tokens of the earlier-tried siblings removed) and ``deterministic`` (children chosen without randomness:
  ``Q_c`` is a point mass on ``x_c``). Variant names and rules are those of the reference. The walk is batched over
  requests: one iteration tries one draw per request.

Draws: the children of u are tried in draw order (default: index order; an ``iid`` token drawn twice is one node tried
once per draw, as :class:`lumotree.reference.verify.DraftProposal` ``draws``). Coins are passed in (``[B, D + 1]``
uniforms in [0, 1), D = number of draws, ``N - 1`` by default): ``coins[b, 1 + d]`` decides draw d (by default draw
``d`` is node ``d + 1``, so ``coins[b, c]`` tests node c) and ``coins[b, 0]`` draws the next token from the final
residual (inverse CDF). Each draw is tried at most once, so one coin per draw is enough. :func:`counter_uniforms` makes
them from a per-request seed and step counter, so a request's output does not depend on what else is in its batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Integral, Real

import numpy as np
import torch

from ..ops.greedy import greedy_accept_ref

__all__ = [
    "SamplingParams",
    "VARIANTS",
    "TreeBatch",
    "VerifyOutcome",
    "target_probs",
    "counter_uniforms",
    "sample_from",
    "verify_greedy",
    "greedy_accept",
    "verify_sampling",
    "verify_batch",
]

VARIANTS = ("iid", "without_replacement", "deterministic")

_MASK32 = 0xFFFFFFFF


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples.

    ``temperature == 0`` is greedy (argmax). Otherwise logits are divided by ``temperature``, then only the
    ``top_k`` largest (0 = all; ties at the k-th value are kept) and then the smallest set of most likely tokens whose
    mass reaches ``top_p`` are kept (the order and tie rules of transformers' logits warpers). ``seed`` fixes the
    request's coins (None: the engine draws one). Generation stops after ``max_new_tokens`` or at a token of
    ``stop_token_ids`` (which is emitted).
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, Real) or not math.isfinite(float(t)) or float(t) < 0:
            raise ValueError(f"temperature = {t!r} must be a finite number >= 0 (0 means greedy)")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, Real) or not (0.0 < float(p) <= 1.0):
            raise ValueError(f"top_p = {p!r} must be in (0, 1]")
        k = self.top_k
        if isinstance(k, bool) or not isinstance(k, Integral) or int(k) < 0:
            raise ValueError(f"top_k = {k!r} must be an integer >= 0 (0 disables top-k)")
        s = self.seed
        if s is not None and (isinstance(s, bool) or not isinstance(s, Integral) or not 0 <= int(s) < 2**63):
            raise ValueError(f"seed = {s!r} must be None or an integer in [0, 2**63)")
        m = self.max_new_tokens
        if isinstance(m, bool) or not isinstance(m, Integral) or int(m) < 1:
            raise ValueError(f"max_new_tokens = {m!r} must be an integer >= 1")
        stops = tuple(self.stop_token_ids)
        for i, tok in enumerate(stops):
            if isinstance(tok, bool) or not isinstance(tok, Integral) or int(tok) < 0:
                raise ValueError(f"stop_token_ids[{i}] = {tok!r} is not a non-negative token id")
        object.__setattr__(self, "stop_token_ids", tuple(int(x) for x in stops))

    @property
    def greedy(self) -> bool:
        return float(self.temperature) == 0.0


# --------------------------------------------------------------------------------------------------- target P
def target_probs(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """The distribution each node samples from: ``[B, N, V]`` (float32, or float64 for float64 logits).

    ``logits: [B, N, V]``; per-request ``temperature: [B]`` (0 = greedy: a point mass on the first argmax),
    ``top_k: [B]`` int (0 = off), ``top_p: [B]`` in (0, 1]. Rows are processed as in :class:`SamplingParams`.
    """
    if logits.ndim != 3:
        raise ValueError(f"logits has shape {tuple(logits.shape)}, expected [B, N, V]")
    B, N, V = logits.shape
    for name, t in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)):
        if t.shape != (B,):
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected [B] = ({B},)")
    work_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    x = logits.to(work_dtype)  # [B, N, V]
    if not bool(torch.isfinite(x).all()):
        raise ValueError("the target logits hold NaN or inf: no distribution to sample from")
    greedy = temperature <= 0  # [B]
    safe_t = torch.where(greedy, torch.ones_like(temperature), temperature).to(work_dtype)  # [B]
    safe_t = safe_t.clamp(min=torch.finfo(work_dtype).tiny)  # a temperature below the dtype's range: its smallest
    # shifted by the row's largest logit first (softmax does not see the shift): every scaled logit is <= 0, so a
    # temperature too small for the dtype sends the others to -inf (a point mass on the argmax: greedy), never to
    # +inf and NaN
    x = (x - x.amax(-1, keepdim=True)) / safe_t[:, None, None]  # [B, N, V]
    neg_inf = torch.tensor(float("-inf"), dtype=work_dtype, device=x.device)
    k_max = int(top_k.max().item()) if B else 0
    if k_max > 0:
        k_eff = torch.where(top_k > 0, top_k.clamp(max=V), torch.full_like(top_k, V))  # [B]
        kk = min(k_max, V)
        top_vals = torch.topk(x, kk, dim=-1).values  # [B, N, kk]
        idx = (k_eff.clamp(max=kk) - 1).to(torch.long)[:, None, None].expand(B, N, 1)  # [B, N, 1]
        kth = top_vals.gather(-1, idx)  # [B, N, 1]
        use_k = (top_k > 0)[:, None, None]  # [B, 1, 1]
        x = torch.where(use_k & (x < kth), neg_inf, x)
    if bool((top_p < 1).any()):
        sorted_x, order = torch.sort(x, dim=-1, descending=False)  # [B, N, V] ascending
        cum = torch.softmax(sorted_x, dim=-1).cumsum(-1)  # [B, N, V]
        remove_sorted = cum <= (1 - top_p.to(work_dtype))[:, None, None]  # [B, N, V]
        remove_sorted[..., -1] = False  # always keep the most likely token
        remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)  # [B, N, V]
        x = torch.where(remove, neg_inf, x)
    probs = torch.softmax(x, dim=-1)  # [B, N, V]
    if bool(greedy.any()):
        onehot = torch.zeros_like(probs).scatter(-1, logits.argmax(-1, keepdim=True), 1.0)  # [B, N, V]
        probs = torch.where(greedy[:, None, None], onehot, probs)
    return probs


# --------------------------------------------------------------------------------------------------- coins
def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for ``0 <= x < 2**32`` in int64 without overflow (c split in 16-bit halves)."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash with full avalanche (Wellons' ``lowbias32`` structure), on int64 lanes."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = _mul32(x, 0x21F0AAAD)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x735A2D97)
    x = x ^ (x >> 15)
    return x


def counter_uniforms(seed: torch.Tensor, counter: torch.Tensor, n: int, stream: int = 0) -> torch.Tensor:
    """Uniforms in [0, 1) that depend only on ``(seed, counter, index, stream)``: ``[B, n]`` float64.

    ``seed, counter: [B]`` int64 (seed in [0, 2**63)). A counter-based generator: the engine passes a request's step
    counter, so a request draws the same coins whatever else shares its batch. 48 random bits per uniform.
    """
    if seed.shape != counter.shape or seed.ndim != 1:
        raise ValueError(f"seed {tuple(seed.shape)} and counter {tuple(counter.shape)} must both be [B]")
    seed = seed.to(torch.int64)
    counter = counter.to(torch.int64)
    idx = torch.arange(n, dtype=torch.int64, device=seed.device)[None, :]  # [1, n]
    seed_lo = (seed & _MASK32)[:, None]  # [B, 1]
    seed_hi = ((seed >> 32) & _MASK32)[:, None]  # [B, 1]
    ctr_lo = (counter & _MASK32)[:, None]  # [B, 1]
    ctr_hi = ((counter >> 32) & _MASK32)[:, None]  # [B, 1]
    h = _mix32(idx ^ _mix32(ctr_lo ^ _mix32(ctr_hi ^ _mix32(seed_lo ^ _mix32(seed_hi + (stream & _MASK32))))))
    h2 = _mix32(h ^ 0x9E3779B9)  # [B, n] a second, decorrelated word
    bits48 = (h << 16) | (h2 & 0xFFFF)  # [B, n] in [0, 2**48)
    return bits48.to(torch.float64) * (2.0**-48)


def sample_from(probs: torch.Tensor, coins: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: for each row of ``probs: [B, V]`` (unnormalised allowed), the first token whose cumulative
    mass exceeds ``coin * total``. ``coins: [B]``. Zero-mass tokens are never drawn. Returns ``[B]`` int64."""
    if not bool(torch.isfinite(probs).all()):
        raise ValueError("a probability vector holds NaN or inf: nothing is sampled from it")
    cdf = probs.cumsum(-1)  # [B, V]
    target = (coins.to(cdf.dtype) * cdf[:, -1])[:, None]  # [B, 1]
    tok = torch.searchsorted(cdf, target, right=True).squeeze(-1)  # [B]
    return tok.clamp(max=probs.shape[-1] - 1)


# --------------------------------------------------------------------------------------------------- trees
class TreeBatch:
    """B padded draft trees on one device, with the order in which verification tries children.

    ``tokens: [B, N]`` (node 0 = the pending token), ``parents: [B, N]`` (``parents[b, 0] == -1``, topological),
    ``num_nodes: [B]`` (nodes at or past ``num_nodes[b]`` are padding and ignored). Derived (on the host, placed next
    to ``tokens``, when first read; :meth:`to` builds them first so that they move along):
    ``depth: [B, N]``, ``ancestor: [B, N, N]`` (inclusive ancestor mask), ``valid: [B, N]``. Draw lists (a linked list
    per node): ``first_draw: [B, N]``, ``draw_child: [B, D]``, ``draw_next: [B, D]`` (-1 = none). By default the draws
    are the children in index order and draw d is node d + 1 (D = N - 1); ``draws`` (per tree, per node, the children
    in draw order, repeats allowed for ``iid``) overrides that, as the reference's ``DraftProposal.draws``. The
    default draw lists are built when first read (on the host, then placed next to ``tokens``: read them before
    moving the batch with :meth:`to` to move them along).
    """

    def __init__(
        self,
        tokens: torch.Tensor,
        parents: torch.Tensor,
        num_nodes: torch.Tensor,
        draws: list[list[list[int]] | None] | None = None,
    ):
        if tokens.ndim != 2 or parents.shape != tokens.shape:
            raise ValueError(f"tokens {tuple(tokens.shape)} and parents {tuple(parents.shape)} must both be [B, N]")
        B, N = tokens.shape
        if num_nodes.shape != (B,):
            raise ValueError(f"num_nodes has shape {tuple(num_nodes.shape)}, expected [B] = ({B},)")
        self.tokens = tokens  # [B, N]
        self.parents = parents  # [B, N]
        self.num_nodes = num_nodes  # [B]
        par_np = parents.cpu().numpy()  # [B, N]
        num_np = num_nodes.cpu().numpy()  # [B]
        node = np.arange(N)
        valid = node[None, :] < num_np[:, None]  # [B, N]
        child = valid & (node[None, :] > 0)  # [B, N] valid non-root nodes
        par = np.where(child, par_np, 0)  # [B, N] the root and padding point at the root: a fixed point
        self._structure_source = (par, child, valid)  # depth / ancestor / valid are built when first read
        if draws is None or all(d is None for d in draws):
            self._draw_source = (par, child)  # the default draw lists are built when first read (sampling only)
        else:
            self._explicit_draws(draws)

    def _structure(self, par: np.ndarray, child: np.ndarray, valid: np.ndarray) -> None:
        """``valid``, ``depth`` and the inclusive ``ancestor`` masks, built on the host in numpy by pointer jumping
        (ceil(log2 N) rounds of gathers: a few dozen vector ops, far cheaper than device launches or multi-threaded
        torch on tiny tensors), then placed next to ``tokens``."""
        B, N = par.shape
        node = np.arange(N)
        rows = np.arange(B)[:, None]  # [B, 1]
        depth = child.astype(np.int64)  # [B, N]
        ancestor = np.zeros((B, N, N), dtype=bool)  # [B, N, N]
        ancestor[:, node, node] = True
        jump = par.copy()  # [B, N] the ancestor at distance 2^k (clamped at the root)
        for _ in range(max(1, math.ceil(math.log2(max(N, 2))))):
            depth = depth + depth[rows, jump]
            ancestor |= ancestor[rows, jump]
            jump = jump[rows, jump]
        ancestor &= valid[:, :, None] & valid[:, None, :]
        dev = self.tokens.device
        self.valid = torch.from_numpy(valid).to(dev)  # [B, N]
        self.depth = torch.from_numpy(depth).to(dev)  # [B, N]
        self.ancestor = torch.from_numpy(ancestor).to(dev)  # [B, N, N]
        self._structure_source = None

    _STRUCTURE_FIELDS = ("valid", "depth", "ancestor")
    _DRAW_FIELDS = ("first_draw", "draw_child", "draw_next")

    def __getattr__(self, name: str):
        """Derived fields on first use: the structure (a model that verifies and accepts in one call never reads
        it) and the default draw lists (greedy verification never reads them): no host work for what is not read."""
        if name in TreeBatch._STRUCTURE_FIELDS and self.__dict__.get("_structure_source") is not None:
            self._structure(*self.__dict__["_structure_source"])
            return self.__dict__[name]
        if name in TreeBatch._DRAW_FIELDS and self.__dict__.get("_draw_source") is not None:
            self._default_draws(*self.__dict__["_draw_source"])
            return self.__dict__[name]
        raise AttributeError(f"'TreeBatch' object has no attribute {name!r}")

    def _default_draws(self, par: np.ndarray, child: np.ndarray) -> None:
        """Children in index order; draw d = node d + 1. Sorting the non-root nodes by (parent, index) puts every
        sibling list in one run: the next entry of a run is the next sibling, the first entry the first child."""
        B, N = par.shape
        node = np.arange(N)
        big = N + 1
        key = np.where(child, par * big + node[None, :], big * big)  # [B, N] padding and root sort last
        order = np.argsort(key, axis=1, kind="stable")  # [B, N]
        sorted_key = np.take_along_axis(key, order, 1)  # [B, N]
        live = sorted_key < big * big  # [B, N]
        sorted_par = sorted_key // big  # [B, N]
        same_next = np.zeros_like(live)
        same_next[:, :-1] = (sorted_par[:, :-1] == sorted_par[:, 1:]) & live[:, 1:]
        next_sorted = np.full_like(order, -1)
        next_sorted[:, :-1] = np.where(same_next[:, :-1], order[:, 1:], -1)
        next_sibling = np.full_like(order, -1)  # [B, N] in node space
        np.put_along_axis(next_sibling, order, next_sorted, 1)
        is_first = np.ones_like(live)
        is_first[:, 1:] = sorted_par[:, 1:] != sorted_par[:, :-1]
        is_first &= live
        first_child = np.full((B, N + 1), -1, dtype=np.int64)  # column N collects the non-first entries
        np.put_along_axis(first_child, np.where(is_first, sorted_par, N), np.where(is_first, order, -1), 1)
        first_child = first_child[:, :N]  # [B, N]
        nxt = next_sibling[:, 1:]  # [B, N - 1]: nodes 1..N-1 are draws 0..N-2
        dev = self.tokens.device
        self.first_draw = torch.from_numpy(np.where(first_child > 0, first_child - 1, -1)).to(dev)  # [B, N]
        self.draw_next = torch.from_numpy(np.where(nxt > 0, nxt - 1, -1)).to(dev)  # [B, D]
        self.draw_child = torch.from_numpy(np.tile(np.arange(1, N, dtype=np.int64), (B, 1))).to(dev)  # [B, D]
        self._draw_source = None

    def _explicit_draws(self, draws: list[list[list[int]] | None]) -> None:
        """Draw lists built on the host from per-node child orders (``None`` for a tree: index order)."""
        B, N = self.tokens.shape
        if len(draws) != B:
            raise ValueError(f"draws has {len(draws)} entries, expected one per tree (B = {B})")
        parents = self.parents.cpu().tolist()  # at construction: still where the caller built them
        counts = self.num_nodes.cpu().tolist()
        per_tree: list[list[list[int]]] = []
        for b in range(B):
            n = counts[b]
            kids: list[list[int]] = [[] for _ in range(n)]
            for c in range(1, n):
                kids[parents[b][c]].append(c)
            d = draws[b]
            if d is None:
                per_tree.append(kids)
                continue
            if len(d) != n:
                raise ValueError(f"draws[{b}] has {len(d)} entries but tree {b} has {n} nodes")
            for u in range(n):
                if set(d[u]) != set(kids[u]):
                    raise ValueError(f"draws[{b}][{u}] = {list(d[u])} must list exactly the children {kids[u]}")
            per_tree.append([list(x) for x in d])
        D = max(1, max(sum(len(x) for x in t) for t in per_tree))
        first_draw = torch.full((B, N), -1, dtype=torch.int64)
        draw_child = torch.zeros((B, D), dtype=torch.int64)  # [B, D]
        draw_next = torch.full((B, D), -1, dtype=torch.int64)  # [B, D]
        for b, lists in enumerate(per_tree):
            d = 0
            for u, kids_u in enumerate(lists):
                for j, c in enumerate(kids_u):
                    if j == 0:
                        first_draw[b, u] = d
                    draw_child[b, d] = c
                    if j + 1 < len(kids_u):
                        draw_next[b, d] = d + 1
                    d += 1
        dev = self.tokens.device
        self.first_draw = first_draw.to(dev)  # [B, N]
        self.draw_child = draw_child.to(dev)  # [B, D]
        self.draw_next = draw_next.to(dev)  # [B, D]

    def to(self, device: torch.device | str) -> TreeBatch:
        """The same trees with every tensor (derived ones included) on ``device``; no recomputation. One copy per
        dtype (the tensors travel packed): call it before launching work that the copy must not wait for (a copy
        from pageable host memory is ordered after the work already queued)."""
        device = torch.device(device)
        if self.tokens.device == device:
            return self
        for name in TreeBatch._STRUCTURE_FIELDS:  # every verification reads them: built here, moved in the pack
            getattr(self, name)
        moved = object.__new__(TreeBatch)
        for name, value in vars(self).items():
            if not isinstance(value, torch.Tensor):
                setattr(moved, name, value)
        for name, value in moved_together({k: v for k, v in vars(self).items() if isinstance(v, torch.Tensor)},
                                           device).items():
            setattr(moved, name, value)
        return moved

    @property
    def batch_size(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def width(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def num_coins(self) -> int:
        """Coins per tree: one per draw plus one for the final token (``N`` with default draws)."""
        return int(self.draw_child.shape[1]) + 1

    @classmethod
    def pack(
        cls,
        tokens: list[list[int]],
        parents: list[list[int]],
        width: int | None = None,
        device: torch.device | str = "cpu",
        draws: list[list[list[int]] | None] | None = None,
    ) -> TreeBatch:
        """Pad per-request trees (python lists) to a common width ``N`` (default: the largest) and move them."""
        if len(tokens) != len(parents):
            raise ValueError(f"tokens has {len(tokens)} trees but parents has {len(parents)}")
        B = len(tokens)
        N = max((len(t) for t in tokens), default=1) if width is None else int(width)
        tok = np.zeros((B, N), dtype=np.int64)  # [B, N] rows written in place: no padded row lists
        par = np.zeros((B, N), dtype=np.int64)
        num: list[int] = []
        for b, (t, p) in enumerate(zip(tokens, parents)):
            n = len(t)
            if len(p) != n:
                raise ValueError(f"tree {b}: {n} tokens but {len(p)} parents")
            if not 1 <= n <= N:
                raise ValueError(f"tree {b} has {n} nodes; expected 1..{N}")
            tok[b, :n] = t
            par[b, :n] = p
            num.append(n)
        node = np.arange(N)  # topological parent arrays: parents[0] = -1, 0 <= parents[i] < i (all trees at once)
        real = node[None, :] < np.array(num)[:, None]  # [B, N]
        bad = real & np.where(node[None, :] == 0, par != -1, (par < 0) | (par >= node[None, :]))  # [B, N]
        if bad.any():
            b = int(np.nonzero(bad.any(1))[0][0])
            raise ValueError(f"tree {b}: parents {list(parents[b])} are not a topological parent array")
        tok_t, par_t = torch.from_numpy(tok), torch.from_numpy(par)
        num_t = torch.from_numpy(np.array(num, dtype=np.int64))
        if torch.device(device).type != "cpu":
            tok_t, par_t, num_t = (x.pin_memory().to(device, non_blocking=True) for x in (tok_t, par_t, num_t))
        return cls(tok_t, par_t, num_t, draws)


def moved_together(tensors: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """``tensors`` on ``device``, moved with one copy per dtype (flattened, concatenated, split again)."""
    out: dict[str, torch.Tensor] = {}
    by_dtype: dict[torch.dtype, list[str]] = {}
    for name, t in tensors.items():
        by_dtype.setdefault(t.dtype, []).append(name)
    for names in by_dtype.values():
        flat = torch.cat([tensors[n].reshape(-1) for n in names]).to(device)  # one transfer
        for name, part in zip(names, flat.split([tensors[n].numel() for n in names])):
            out[name] = part.view(tensors[name].shape)
    return out


@dataclass
class VerifyOutcome:
    """Result of verifying B trees: ``accepted_node: [B]`` (deepest accepted node, the commit target),
    ``accepted_len: [B]`` (its depth = drafted tokens accepted), ``next_token: [B]`` (the new pending token),
    ``on_path: [B, N]`` (nodes on the root-to-accepted path)."""

    accepted_node: torch.Tensor
    accepted_len: torch.Tensor
    next_token: torch.Tensor
    on_path: torch.Tensor

    def to(self, device: torch.device | str) -> VerifyOutcome:
        """The outcome on ``device`` (one copy per dtype: a single wait when read back to the host)."""
        device = torch.device(device)
        if self.accepted_node.device == device:
            return self
        fields = {"accepted_node": self.accepted_node, "accepted_len": self.accepted_len.to(self.accepted_node.dtype),
                  "next_token": self.next_token.to(self.accepted_node.dtype), "on_path": self.on_path}
        return VerifyOutcome(**moved_together(fields, device))

    def packed(self) -> torch.Tensor:
        """``[B, 3 + N]`` int64: accepted node, accepted length, next token, then the on-path mask (one tensor: one
        copy to the host)."""
        columns = [self.accepted_node[:, None], self.accepted_len[:, None], self.next_token[:, None], self.on_path]
        return torch.cat([c.long() for c in columns], 1)

    @classmethod
    def from_packed(cls, packed: torch.Tensor) -> VerifyOutcome:
        """The inverse of :meth:`packed` (on ``packed``'s device)."""
        return cls(packed[:, 0], packed[:, 1], packed[:, 2], packed[:, 3:].bool())

    def emitted(self, trees: TreeBatch) -> list[list[int]]:
        """Per request, the new tokens in order: the accepted drafted tokens (root excluded) then ``next_token``."""
        on_path = self.on_path.cpu().numpy()[:, 1:]  # [B, N - 1]
        flat = trees.tokens.cpu().numpy()[:, 1:][on_path].tolist()  # every request's accepted tokens, row by row
        counts = on_path.sum(1)  # [B]
        ends = np.cumsum(counts).tolist()
        nxt = self.next_token.cpu().tolist()
        return [flat[end - c : end] + [nxt[b]] for b, (end, c) in enumerate(zip(ends, counts.tolist()))]


def verify_greedy(trees: TreeBatch, target_argmax: torch.Tensor) -> VerifyOutcome:
    """Greedy tree verification. ``target_argmax: [B, N]`` = argmax of the target logits at every node."""
    return greedy_accept(trees.tokens, trees.parents, trees.valid, trees.ancestor, trees.depth, target_argmax)


def greedy_accept(tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor, ancestor: torch.Tensor,
                  depth: torch.Tensor, target_argmax: torch.Tensor) -> VerifyOutcome:
    """Greedy acceptance of B trees from their structure (``tokens, parents, valid, depth: [B, N]``, inclusive
    ``ancestor: [B, N, N]``) and the target's argmax at every node ``[B, N]``: node i matches iff its token is the
    argmax at its parent (the root always matches); it is accepted iff every inclusive ancestor matches; the deepest
    accepted node wins (:func:`~lumotree.optimized.ops.greedy.greedy_accept_ref`). Device tensors only, no host reads
    (CUDA-graph safe)."""
    return VerifyOutcome(*greedy_accept_ref(tokens, parents, valid, ancestor, depth, target_argmax))


def residual_after_rejection(residual: torch.Tensor, proposal: torch.Tensor) -> torch.Tensor:
    """``norm(max(0, R - Q))`` row-wise (``[B, V]``); a row whose mass vanishes (only by rounding when R == Q, where
    rejection has probability 0) keeps R."""
    r = (residual - proposal).clamp(min=0)  # [B, V]
    total = r.sum(-1, keepdim=True)  # [B, 1]
    return torch.where(total > 0, r / torch.where(total > 0, total, torch.ones_like(total)), residual)


def verify_sampling(
    trees: TreeBatch,
    probs: torch.Tensor,
    coins: torch.Tensor,
    variant: str,
    proposal: torch.Tensor | None = None,
) -> VerifyOutcome:
    """Lossless recursive rejection sampling on B trees, batched over requests.

    ``probs: [B, N, V]`` the target distribution at every node (see :func:`target_probs`); ``coins: [B, D + 1]``
    uniforms (``coins[b, 1 + d]`` tests draw d, ``coins[b, 0]`` draws the final token); ``variant`` in
    :data:`VARIANTS`; ``proposal: [B, N, V]`` the drafter's distribution at every node (what its children were drawn
    from; required for ``iid`` and ``without_replacement``, ignored for ``deterministic``).
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant = {variant!r}; expected one of {VARIANTS}")
    B, N = trees.tokens.shape
    if probs.ndim != 3 or probs.shape[:2] != (B, N):
        raise ValueError(f"probs has shape {tuple(probs.shape)}, expected [B, N, V] with B, N = {B}, {N}")
    V = probs.shape[-1]
    if coins.shape != (B, trees.num_coins):
        raise ValueError(f"coins has shape {tuple(coins.shape)}, expected [B, D + 1] = ({B}, {trees.num_coins})")
    if variant != "deterministic":
        if proposal is None or proposal.shape != probs.shape:
            raise ValueError(
                f"variant {variant!r} needs proposal [B, N, V] = {tuple(probs.shape)}, got "
                f"{None if proposal is None else tuple(proposal.shape)}"
            )
    dev = probs.device
    rows = torch.arange(B, device=dev)  # [B]
    coins = coins.to(probs.dtype)
    current = torch.zeros(B, dtype=torch.int64, device=dev)  # [B] the accepted node the walk stands on
    residual = probs[:, 0].clone()  # [B, V]
    tried = torch.zeros(B, V, dtype=torch.bool, device=dev)  # [B, V] tokens of rejected draws (w/o replacement)
    draw = trees.first_draw[:, 0].clone()  # [B] next draw to try (-1: none left)
    while True:
        active = draw >= 0  # [B]
        if not bool(active.any()):
            break
        d = draw.clamp(min=0)  # [B]
        c = trees.draw_child[rows, d]  # [B] the child under test
        x = trees.tokens[rows, c]  # [B] its token
        if variant == "deterministic":
            q_row = torch.zeros_like(residual).scatter(1, x[:, None], 1.0)  # [B, V] point mass
        else:
            assert proposal is not None
            q_row = proposal[rows, current]  # [B, V]
            if variant == "without_replacement":
                q_row = torch.where(tried, torch.zeros_like(q_row), q_row)
                mass = q_row.sum(-1, keepdim=True)  # [B, 1]
                q_row = q_row / torch.where(mass > 0, mass, torch.ones_like(mass))
        r_x = residual.gather(1, x[:, None]).squeeze(1)  # [B]
        q_x = q_row.gather(1, x[:, None]).squeeze(1)  # [B]
        # accept iff coin < R(x) / Q(x), written without the division (Q(x) = 0 means always accept)
        accept = active & (coins[rows, d + 1] * q_x < r_x)  # [B]
        reject = active & ~accept  # [B]
        residual = torch.where(
            accept[:, None],
            probs[rows, c],
            torch.where(reject[:, None], residual_after_rejection(residual, q_row), residual),
        )
        tried = torch.where(accept[:, None], torch.zeros_like(tried), tried)
        tried = tried | (reject[:, None] & torch.zeros_like(tried).scatter(1, x[:, None], True))
        current = torch.where(accept, c, current)
        draw = torch.where(accept, trees.first_draw[rows, c], torch.where(reject, trees.draw_next[rows, d], draw))
    next_token = sample_from(residual, coins[:, 0])  # [B]
    on_path = trees.ancestor[rows, current]  # [B, N]
    return VerifyOutcome(current, trees.depth[rows, current], next_token, on_path)


def verify_batch(
    trees: TreeBatch,
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    coins: torch.Tensor | None,
    variant: str = "deterministic",
    proposal: torch.Tensor | None = None,
) -> VerifyOutcome:
    """Verify B trees from the target's logits ``[B, N, V]``.

    Greedy when every request is greedy: only the argmax ``[B, N]`` leaves the logits' device and the rest runs where
    ``trees`` live (the host, in the engine: a handful of tiny ops). Otherwise lossless sampling on the logits' device,
    where greedy rows use a point mass on the argmax (which makes the sampling walk reduce to greedy verification for
    them). ``temperature, top_k, top_p: [B]`` on any device.
    """
    if bool((temperature <= 0).all()):
        return verify_greedy(trees, logits.argmax(-1).to(trees.tokens.device))
    if coins is None:
        raise ValueError("coins are required when some request samples (temperature > 0)")
    dev = logits.device
    probs = target_probs(logits, temperature.to(dev), top_k.to(dev), top_p.to(dev))  # [B, N, V]
    return verify_sampling(trees.to(dev), probs, coins.to(dev), variant, None if proposal is None else proposal.to(dev))
