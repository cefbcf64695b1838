"""Fuzzing what a user can hand lumotree: corrupted checkpoints, batch files, sampling parameters and the numeric edges
of the GDN kernels. Every case ends in a clear one-line error (exit code 2 on the command line) or in a correct
answer; never a traceback, never a wrong answer.

The example counts scale with the hypothesis profile: ``pytest --hypothesis-profile=deep tests/test_fuzz.py`` runs
many more (not derandomized) than CI's.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_gdn_kernels import make_case, rel_err

from lumotree.cli import main
from lumotree.optimized.engine import Engine, SamplingParams
from lumotree.optimized.ops.gdn_tree.portable import portable_verify
from lumotree.reference.config import HybridConfig
from lumotree.reference.model import build_random, load_pretrained, save_pretrained

EXAMPLES = max(10, settings().max_examples // 4)  # 25 under CI's profile, more under "deep"
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
CONFIG = HybridConfig(vocab_size=24, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=8, linear_key_head_dim=8, linear_value_head_dim=8,
                      linear_num_key_heads=1, linear_num_value_heads=2, num_experts=0)
PROMPT = [3, 1, 4, 1, 5]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = tmp_path_factory.mktemp("base")
    save_pretrained(build_random(CONFIG, seed=11), path, dtype="float32")
    return path


def generate(capsys, model_dir, *extra: str) -> tuple[int, str, str]:
    try:
        code = main(["generate", "--model", str(model_dir), "--backend", "reference", "--spec", "none", "--quiet",
                     "--max-new-tokens", "3", "--prompt", " ".join(map(str, PROMPT)), *extra])
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def greedy(model, prompt: list[int], n: int) -> list[int]:
    cache = model.new_cache()
    logits = model.forward(prompt, cache)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits[-1])))
        logits = model.forward([out[-1]], cache)
    return out


def assert_clean(code: int, err: str) -> None:
    """Exit 0, or exit 2 with one line ``error: ...``: never a traceback, never exit 1."""
    assert "Traceback" not in err, err
    assert code in (0, 2), (code, err)
    if code == 2:
        assert err.strip().splitlines()[-1].startswith("error: "), err


MUTATIONS = st.one_of(
    st.tuples(st.just("drop_key"), st.integers(0, 100)),
    st.tuples(st.just("set_key"), st.integers(0, 100),
              st.one_of(st.none(), st.booleans(), st.integers(-3, 10**6), st.floats(allow_nan=True),
                        st.text(max_size=5), st.lists(st.integers(-1, 3), max_size=3))),
    st.tuples(st.just("unknown_key"), st.text(min_size=1, max_size=8)),
    st.tuples(st.just("drop_tensor"), st.integers(0, 100)),
    st.tuples(st.just("reshape_tensor"), st.integers(0, 100)),
    st.tuples(st.just("int_tensor"), st.integers(0, 100)),
    st.tuples(st.just("poison_tensor"), st.integers(0, 100), st.sampled_from([np.nan, np.inf, -np.inf])),
    st.tuples(st.just("extra_tensor"), st.text(min_size=1, max_size=8)),
    st.tuples(st.just("truncate"), st.floats(0.0, 0.99)),
    st.tuples(st.just("garbage"), st.floats(0.0, 0.99), st.binary(min_size=1, max_size=64)),
)


def mutate(path, mutation) -> None:
    from safetensors.numpy import load_file, save_file

    kind, *args = mutation
    config_file, weights_file = path / "config.json", path / "model.safetensors"
    if kind in ("drop_key", "set_key", "unknown_key"):
        config = json.loads(config_file.read_text())
        keys = sorted(config)
        if kind == "drop_key":
            config.pop(keys[args[0] % len(keys)])
        elif kind == "set_key":
            config[keys[args[0] % len(keys)]] = args[1]
        else:
            config[args[0]] = 1
        config_file.write_text(json.dumps(config))
    elif kind in ("truncate", "garbage"):
        data = bytearray(weights_file.read_bytes())
        at = int(args[0] * len(data))
        if kind == "truncate":
            data = data[:at]
        else:
            data[at : at + len(args[1])] = args[1]
        weights_file.write_bytes(bytes(data))
    else:
        tensors = load_file(str(weights_file))
        names = sorted(tensors)
        name = names[args[0] % len(names)] if kind != "extra_tensor" else None
        if kind == "drop_tensor":
            del tensors[name]
        elif kind == "reshape_tensor":
            t = tensors[name]
            tensors[name] = t.T.copy() if t.ndim == 2 and t.shape[0] != t.shape[1] else np.concatenate([t, t[:1]])
        elif kind == "int_tensor":
            tensors[name] = tensors[name].astype(np.int32)
        elif kind == "poison_tensor":
            t = tensors[name].copy()
            t.reshape(-1)[0] = args[1]
            tensors[name] = t
        else:
            tensors["model." + args[0]] = np.zeros(3, dtype=np.float32)
        save_file(tensors, str(weights_file))


@FUZZ
@given(mutation=MUTATIONS)
def test_corrupted_checkpoints_error_cleanly_or_decode_correctly(capsys, tmp_path_factory, base, mutation):
    path = tmp_path_factory.mktemp("ckpt")
    shutil.copytree(base, path, dirs_exist_ok=True)
    mutate(path, mutation)
    code, out, err = generate(capsys, path)
    assert_clean(code, err)
    if code == 0:  # the checkpoint still describes a model: the answer is that model's greedy continuation
        want = greedy(load_pretrained(path), PROMPT, 3)
        assert out.split() == [str(t) for t in want], mutation


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-5, 40) | st.floats(allow_nan=True) |
                           st.text(max_size=6), lambda inner: st.lists(inner, max_size=4), max_leaves=6)


@FUZZ
@given(items=st.lists(st.dictionaries(st.sampled_from(["prompt", "max_new_tokens", "temperature", "top_p", "top_k",
                                                       "seed", "stop"]), JSON_VALUES, max_size=4),
                      min_size=1, max_size=3),
       raw=st.sampled_from(["", "not json {", "{\"prompt\": [1, 2]"]))
def test_batch_files_error_cleanly_or_decode(capsys, tmp_path_factory, base, items, raw):
    path = tmp_path_factory.mktemp("batch") / "prompts.jsonl"
    path.write_text("\n".join([json.dumps(item) for item in items] + [raw]) + "\n")
    code, out, err = generate(capsys, base, "--batch-file", str(path), "--no-stream")
    assert_clean(code, err)
    if code == 0:
        assert len([line for line in out.splitlines() if line.startswith("[")]) >= 1


EXTREME = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(
    [0.0, 5e-324, 1e-320, 1e-45, 1e-38, 1e-30, 1e-7, 0.5, 1.0, 2.0, 1e30, 1e300, -0.0, -1.0]))


@FUZZ
@given(temperature=EXTREME, top_p=EXTREME, top_k=st.integers(-2, 30), seed=st.integers(-1, 2**64))
def test_sampling_parameters_are_refused_or_sample_valid_tokens(temperature, top_p, top_k, seed):
    try:
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, max_new_tokens=4)
    except ValueError:
        return  # refused, with a message naming the parameter
    model = build_random(CONFIG, seed=11)
    engine = Engine(model, mode="autoregressive", budget="none")
    tokens = engine.generate([PROMPT], params)[0].tokens
    assert len(tokens) == 4 and all(0 <= t < CONFIG.vocab_size for t in tokens)
    if 0 < temperature < 1e-30 or top_k == 1:  # no spread left: the greedy continuation
        assert tokens == greedy(model, PROMPT, 4)


@settings(max_examples=max(6, EXAMPLES // 4), deadline=None)
@given(log_decay=st.sampled_from([0.0, -1e-6, -1.0, -20.0, -87.0]), beta=st.sampled_from([0.0, 1e-6, 1.0, 2.0]),
       seed=st.integers(0, 2**16))
def test_kernels_at_the_gate_edges_match_float64(log_decay, beta, seed):
    """Decays from 1 to exp(-87) on every node (a path sum far below fp32's smallest normal number) and write
    strengths from 0 to 2: the portable verify against the float64 closed form."""
    from lumotree.optimized.ops.gdn_tree import reference as R

    case = make_case([[-1, 0, 1, 1], [-1, 0]], H=1, group=2, seed=seed)
    case["a"] = torch.full_like(case["a"], log_decay)
    case["b"] = torch.full_like(case["b"], beta)
    o, _ = portable_verify(case["q"], case["k"], case["v"], case["a"], case["b"], case["pool"], case["slots"],
                           case["parents"], num_nodes=case["num_nodes"], use_qk_l2norm_in_kernel=True)
    want, _ = R.gdn_tree_closed_form_ref(*[case[n].double() for n in ("q", "k", "v", "a", "b")],
                                         torch.nan_to_num(case["pool"].double()), case["slots"], case["parents"],
                                         num_nodes=case["num_nodes"], use_qk_l2norm_in_kernel=True)
    n = case["num_nodes"]
    got = torch.cat([o[b, : int(n[b])] for b in range(2)])
    ref = torch.cat([want[b, : int(n[b])] for b in range(2)])
    assert rel_err(got, ref) < 1e-5


@pytest.mark.parametrize("root_gate", [-1e4, -1e8])
def test_a_very_negative_root_gate_keeps_the_decays_below_it(root_gate):
    """A root gate far below fp32's smallest decay: the decays between the root's descendants (ordinary gates) keep
    their accuracy (without the floor, fp32 path sums lose it: 5e-4 at -1e4, 0.4 at -1e8)."""
    from lumotree.optimized.ops.gdn_tree import reference as R

    case = make_case([[-1, 0, 1, 2, 3, 4, 5, 6]], H=1, group=2, seed=9)
    case["a"][0, 0] = root_gate
    o, _ = portable_verify(case["q"], case["k"], case["v"], case["a"], case["b"], case["pool"], case["slots"],
                           case["parents"], num_nodes=case["num_nodes"], use_qk_l2norm_in_kernel=True)
    want, _ = R.gdn_tree_pernode_ref(*[case[n].double() for n in ("q", "k", "v", "a", "b")],
                                     torch.nan_to_num(case["pool"].double()), case["slots"], case["parents"],
                                     num_nodes=case["num_nodes"], use_qk_l2norm_in_kernel=True)
    assert rel_err(o, want) < 1e-5


def _pernode_float64(case, g, beta, accepted):
    """Outputs and each request's accepted state by the per-node recurrence in float64 (``alpha = exp(g)``: a decay
    of 0 needs no path sums)."""
    from lumotree.optimized.ops.gdn_tree import reference as R

    pool = torch.nan_to_num(case["pool"].double())
    o, states = R.gdn_tree_pernode_ref(case["q"].double(), case["k"].double(), case["v"].double(), g, beta, pool,
                                       case["slots"], case["parents"], num_nodes=case["num_nodes"],
                                       use_qk_l2norm_in_kernel=True)
    return o, states[torch.arange(len(accepted)), accepted.long()]


@pytest.mark.parametrize("form", ["gated", "g"])
def test_decays_of_exactly_zero_match_float64(form):
    """A decay of 0 (``A_log`` beyond fp32's ``exp``: ``A_log = 90``; or ``g = -inf`` given directly) and one of
    ``exp(-1000)`` on some nodes, beside ordinary ones: the verify's outputs and the committed states equal the
    float64 recurrence (the kernels hold ``g`` at ``LOG_DECAY_FLOOR``, whose ``exp`` is 0 in fp32 as well)."""
    from lumotree.optimized import gdn_tree_commit, gdn_tree_verify
    from lumotree.optimized.ops.gdn_tree import reference as R

    case = make_case([[-1, 0, 1, 1, 0, 4, 5], [-1, 0, 1]], H=1, group=2, gated=form == "gated", seed=5)
    accepted = torch.tensor([6, 2], dtype=torch.int32)
    kw = dict(parents=case["parents"], initial_state=case["pool"], state_indices=case["slots"],
              num_nodes=case["num_nodes"])
    if form == "gated":
        A_log = case["A_log"].clone()
        A_log[0] = 90.0  # value head 0: every decay exactly 0; head 1 ordinary
        gates = dict(A_log=A_log, dt_bias=case["dt_bias"])
        g, beta = R.gdn_gates_ref(case["a"].double(), case["b"].double(), A_log.double(), case["dt_bias"].double())
        assert torch.isinf(A_log.exp()[0]) and (g[..., 0].exp() == 0).all() and (g[..., 1].exp() > 0).all()
    else:
        case["a"][0, 1, 0] = float("-inf")  # a reset in the middle of request 0's accepted path
        case["a"][0, 4, 1] = -1000.0  # a decay fp32 rounds to 0, on the same path
        case["a"][1, 0, :] = float("-inf")  # the root of request 1
        gates = {}
        g, beta = case["a"].double(), case["b"].double()
    want_o, want_states = _pernode_float64(case, g, beta, accepted)
    o, factors = gdn_tree_verify(case["q"], case["k"], case["v"], case["a"], case["b"], use_qk_l2norm_in_kernel=True,
                                 **gates, **kw)
    assert torch.isfinite(factors.log_gamma[0, : int(case["num_nodes"][0])]).all()
    gdn_tree_commit(factors, accepted, **kw)
    n = case["num_nodes"]
    got = torch.cat([o[b, : int(n[b])] for b in range(2)])
    ref = torch.cat([want_o[b, : int(n[b])] for b in range(2)])
    assert rel_err(got, ref) < 1e-5
    assert rel_err(case["pool"][case["slots"].long()], want_states) < 1e-5


def test_decode_step_with_a_decay_of_exactly_zero_matches_float64():
    """The single-token decode kernel at ``A_log = 90`` (``exp(A_log)`` beyond fp32) and a raw gate of -100 (its
    softplus below fp32's 1 + eps): no ``inf * 0``; the state and output equal float64's."""
    from lumotree.optimized.ops.gdn_decode import gdn_decode
    from lumotree.optimized.ops.gdn_tree import reference as R

    gen = torch.Generator().manual_seed(3)
    B, H, HV, K, V = 2, 1, 2, 16, 16
    q, k = torch.randn(B, H, K, generator=gen), torch.randn(B, H, K, generator=gen)
    v = torch.randn(B, HV, V, generator=gen)
    a, b = torch.randn(B, HV, generator=gen), torch.randn(B, HV, generator=gen)
    a[1, 0] = -100.0  # softplus(-100) = 3.7e-44: g = -exp(90 - 100) = -4.5e-5, a decay near 1
    A_log, dt_bias = torch.tensor([90.0, 0.3]), torch.zeros(HV)
    pool = torch.randn(3, HV, K, V, generator=gen)
    slots = torch.tensor([2, 0], dtype=torch.int32)
    g, beta = R.gdn_gates_ref(a[:, None].double(), b[:, None].double(), A_log.double(), dt_bias.double())
    case = dict(q=q[:, None], k=k[:, None], v=v[:, None], pool=pool.clone(), slots=slots,
                parents=torch.full((B, 1), -1), num_nodes=None)
    want_o, want_states = _pernode_float64(case, g, beta, torch.zeros(B, dtype=torch.int32))
    o = gdn_decode(q, k, v, a, b, A_log, dt_bias, pool, slots)
    assert rel_err(o, want_o[:, 0]) < 1e-5
    assert rel_err(pool[slots.long()], want_states) < 1e-5
