"""``lumotree serve`` on the CPU: live servers (child processes on free ports, the exact reference backend) called with
the ``openai`` client and raw HTTP; the engine loop and the output text on their own; ``lumotree bench serve`` end to
end at a low rate.

Models: a tiny Qwen3-Next checkpoint with a byte-level tokenizer and a chat template (text prompts, chat, stop strings),
and ``--random tiny`` (no tokenizer: prompts and outputs are token ids).
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from lumotree.cli import main
from lumotree.optimized.engine import Engine, ReferenceTarget, SamplingParams
from lumotree.reference.config import HybridConfig
from lumotree.reference.model import build_random, save_pretrained
from lumotree.server.loadgen import LaunchedServer
from lumotree.server.loop import EngineLoop, QueueFull
from lumotree.server.metrics import ServerMetrics
from lumotree.server.text import OutputText

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
#: the options of the checkpoint's server and of `lumotree generate` runs that must agree with it
MODEL_OPTIONS = ["--backend", "reference", "--spec", "tree", "--budget", "fixed", "--max-nodes", "8", "--num-slots",
                 "4", "--max-seq-len", "256", "--prefix-cache", "16", "--prefix-block", "8"]
RANDOM_OPTIONS = ["--random", "tiny", "--backend", "reference", "--budget", "fixed", "--max-nodes", "8",
                  "--num-slots", "1", "--max-seq-len", "4096"]


def byte_tokenizer():
    """A byte-level BPE tokenizer without merges (256 byte tokens + 3 special tokens) with a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=TEMPLATE)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    tokenizer = byte_tokenizer()
    config = HybridConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_key_head_dim=8,
                          linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4, num_experts=0)
    path = tmp_path_factory.mktemp("chat_ckpt")
    save_pretrained(build_random(config, seed=5), path, dtype="float32")
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def server(checkpoint):
    """The checkpoint served with tree speculation on 4 slots."""
    launched = LaunchedServer(["--model", str(checkpoint), *MODEL_OPTIONS, "--served-model-name", "tiny-chat"], 120)
    yield launched
    assert launched.stop() == 0  # SIGINT: a graceful shutdown
    assert "Traceback" not in "".join(launched.log), "".join(launched.log)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def one_slot():
    """``--random tiny`` on one slot with one waiting place: slots, cancellation and admission."""
    launched = LaunchedServer([*RANDOM_OPTIONS, "--max-waiting", "1"], 120)
    yield launched
    launched.stop()
    assert "Traceback" not in "".join(launched.log), "".join(launched.log)


def generate_tokens(tmp_path, *argv: str) -> list[int]:
    out = tmp_path / "generate.json"
    assert main(["generate", "--quiet", "--json", str(out), *argv]) == 0
    return json.loads(out.read_text())["results"][0]["tokens"]


def metric_samples(url: str) -> dict[str, float]:
    """``/metrics`` as ``{sample name{labels}: value}``."""
    out = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k != "le")
            le = sample.labels.get("le")
            out[sample.name + (f"{{{labels}}}" if labels else "") + (f"[{le}]" if le else "")] = sample.value
    return out


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


# ================================================================================================== the checkpoint
def test_completion_equals_generate_whole_and_streamed(server, client, checkpoint, tmp_path):
    tokenizer = byte_tokenizer()
    prompt = "The tree speculates; the tree speculates"
    tokens = generate_tokens(tmp_path, "--model", str(checkpoint), *MODEL_OPTIONS, "--prompt", prompt,
                             "--max-new-tokens", "12", "--stop", str(tokenizer.eos_token_id))
    expected = tokenizer.decode(tokens, skip_special_tokens=True)
    whole = client.completions.create(model="tiny-chat", prompt=prompt, max_tokens=12, temperature=0)
    assert whole.choices[0].text == expected
    assert whole.usage.prompt_tokens == len(tokenizer.encode(prompt)) and whole.usage.completion_tokens == len(tokens)
    assert whole.choices[0].finish_reason == ("stop" if tokens[-1] == tokenizer.eos_token_id else "length")
    chunks = list(client.completions.create(model="tiny-chat", prompt=prompt, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(tokens)


def test_seeded_sampling_equals_generate(server, client, checkpoint, tmp_path):
    batch = tmp_path / "prompts.jsonl"
    batch.write_text(json.dumps({"prompt": "sample me", "seed": 7, "temperature": 0.9, "top_p": 0.8, "top_k": 40})
                     + "\n")
    tokens = generate_tokens(tmp_path, "--model", str(checkpoint), *MODEL_OPTIONS, "--batch-file", str(batch),
                             "--max-new-tokens", "10")
    got = client.completions.create(model="tiny-chat", prompt="sample me", max_tokens=10, temperature=0.9, top_p=0.8,
                                    seed=7, extra_body={"top_k": 40, "ignore_eos": True})
    assert got.choices[0].text == byte_tokenizer().decode(tokens, skip_special_tokens=True)


def test_chat_renders_the_template(server, client, checkpoint, tmp_path):
    tokenizer = byte_tokenizer()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    tokens = generate_tokens(tmp_path, "--model", str(checkpoint), *MODEL_OPTIONS, "--prompt", rendered,
                             "--max-new-tokens", "10", "--stop", str(tokenizer.eos_token_id))
    reply = client.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=10, temperature=0)
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == tokenizer.decode(tokens, skip_special_tokens=True)
    assert reply.usage.prompt_tokens == len(tokenizer.encode(rendered))
    chunks = list(client.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=10, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == reply.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == reply.choices[0].finish_reason


def test_stop_strings_cut_the_output(server, client):
    full = client.completions.create(model="tiny-chat", prompt="abc abc abc", max_tokens=40, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    start = next(i for i in range(3, len(full) - 2) if "\ufffd" not in full[i:i + 2] and full[i:i + 2].strip())
    stop = full[start:start + 2]
    cut = full[: full.find(stop)]
    for stream in (False, True):
        got = client.completions.create(model="tiny-chat", prompt="abc abc abc", max_tokens=40, temperature=0,
                                        stop=[stop], stream=stream, extra_body={"ignore_eos": True})
        if stream:
            chunks = list(got)
            text, reason = "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
        else:
            text, reason = got.choices[0].text, got.choices[0].finish_reason
        assert (text, reason) == (cut, "stop")


def test_twenty_concurrent_clients_all_complete(server, client):
    def ask(i: int) -> str:
        reply = client.completions.create(model="tiny-chat", prompt=f"client {i}", max_tokens=8, temperature=0.7,
                                          seed=i, extra_body={"ignore_eos": True})
        assert reply.usage.completion_tokens == 8 and reply.choices[0].finish_reason == "length"
        return reply.choices[0].text

    with ThreadPoolExecutor(20) as pool:
        together = list(pool.map(ask, range(20)))
    assert [ask(i) for i in (0, 13)] == [together[0], together[13]]  # a seeded text does not depend on the batch


@pytest.mark.parametrize("body,status,param", [
    ("{not json", 400, None),
    ([1, 2], 400, None),
    ({"model": "gpt-4", "prompt": "hi"}, 404, "model"),
    ({"prompt": "hi"}, 400, "model"),
    ({"model": "tiny-chat", "prompt": "hi", "max_tokens": -5}, 400, "max_tokens"),
    ({"model": "tiny-chat", "prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens"),
    ({"model": "tiny-chat", "prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    ({"model": "tiny-chat", "prompt": "hi", "temperature": -1}, 400, "temperature"),
    ({"model": "tiny-chat", "prompt": "hi", "n": 2}, 400, "n"),
    ({"model": "tiny-chat", "prompt": "x" * 300}, 400, "prompt"),
    ({"model": "tiny-chat", "prompt": "hi", "max_tokens": 255}, 400, "max_tokens"),
    ({"model": "tiny-chat", "prompt": ""}, 400, "prompt"),
    ({"model": "tiny-chat", "prompt": ["a", "b"]}, 400, "prompt"),
    ({"model": "tiny-chat", "prompt": [1, 999]}, 400, "prompt"),
    ({"model": "tiny-chat", "prompt": "hi", "stop": [""]}, 400, "stop"),
    ({"model": "tiny-chat", "prompt": "hi", "logprobs": 2}, 400, "logprobs"),
    ({"model": "tiny-chat", "prompt": "hi", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({"model": "tiny-chat", "messages": []}, 400, "messages"),
    ({"model": "tiny-chat", "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages"),
])
def test_malformed_requests_get_openai_error_objects(server, body, status, param):
    chat = "messages" in body if isinstance(body, dict) else False
    url = f"{server.url}/v1/{'chat/completions' if chat else 'completions'}"
    response = httpx.post(url, content=body if isinstance(body, str) else json.dumps(body),
                          headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param


def test_the_openai_client_sees_errors_as_its_own(client):
    with pytest.raises(openai.BadRequestError, match="n = 2"):
        client.completions.create(model="tiny-chat", prompt="hi", n=2)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="hi")


def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list()] == ["tiny-chat"]
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
    assert httpx.get(f"{server.url}/v2/nothing").json()["error"]["code"] == "not_found"
    client.completions.create(model="tiny-chat", prompt="metrics metrics metrics", max_tokens=6, temperature=0,
                              extra_body={"ignore_eos": True})
    samples = metric_samples(server.url)
    for histogram in ("time_to_first_token_seconds", "time_per_output_token_seconds", "queue_time_seconds",
                      "request_latency_seconds", "accepted_tokens_per_step"):
        assert samples[f"lumotree_{histogram}_count"] >= 1, histogram
        assert f"lumotree_{histogram}_bucket[+Inf]" in samples
    assert samples["lumotree_generation_tokens_total"] >= 6 and samples["lumotree_prompt_tokens_total"] >= 23
    assert samples["lumotree_requests_finished_total{finish_reason=max_new_tokens}"] >= 1
    assert samples["lumotree_requests_running"] == 0 and samples["lumotree_requests_waiting"] == 0
    assert "lumotree_generation_tokens_per_second" in samples


# ================================================================================================== one slot
def test_random_model_serves_ids_like_generate(one_slot, tmp_path):
    tokens = generate_tokens(tmp_path, *RANDOM_OPTIONS, "--prompt", "5 6 7 5 6 7", "--max-new-tokens", "9")
    reply = httpx.post(f"{one_slot.url}/v1/completions", json={"model": "random-tiny", "prompt": [5, 6, 7, 5, 6, 7],
                                                               "max_tokens": 9, "temperature": 0}).json()
    assert reply["choices"][0]["text"] == " ".join(map(str, tokens))
    chat = httpx.post(f"{one_slot.url}/v1/chat/completions",
                      json={"model": "random-tiny", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "chat_template_missing"


def long_stream(url: str):
    """A streamed request far longer than any test waits for, its first chunk read: it holds the slot."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    stream = client.completions.create(model="random-tiny", prompt="1 2 3", max_tokens=4000, temperature=0,
                                       stream=True)
    next(iter(stream))
    return stream


def test_a_client_gone_mid_stream_frees_its_slot(one_slot):
    before = metric_samples(one_slot.url).get("lumotree_requests_finished_total{finish_reason=abort}", 0)
    stream = long_stream(one_slot.url)
    assert httpx.get(f"{one_slot.url}/health").json()["running"] == 1
    stream.close()  # the connection drops, as when the client is killed
    wait_for(lambda: httpx.get(f"{one_slot.url}/health").json()["running"] == 0, timeout=5)
    samples = metric_samples(one_slot.url)
    assert samples["lumotree_requests_finished_total{finish_reason=abort}"] == before + 1
    reply = httpx.post(f"{one_slot.url}/v1/completions", json={"model": "random-tiny", "prompt": "4 5",
                                                               "max_tokens": 3}, timeout=30)
    assert reply.status_code == 200 and len(reply.json()["choices"][0]["text"].split()) == 3


def test_past_the_waiting_bound_requests_get_503(one_slot):
    stream = long_stream(one_slot.url)
    waiting: dict[str, httpx.Response] = {}
    thread = threading.Thread(target=lambda: waiting.setdefault("reply", httpx.post(
        f"{one_slot.url}/v1/completions", json={"model": "random-tiny", "prompt": "8 9", "max_tokens": 4},
        timeout=30)))
    thread.start()
    wait_for(lambda: httpx.get(f"{one_slot.url}/health").json()["waiting"] == 1)
    refused = httpx.post(f"{one_slot.url}/v1/completions", json={"model": "random-tiny", "prompt": "1",
                                                                 "max_tokens": 2})
    assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
    assert refused.json()["error"]["code"] == "queue_full"
    stream.close()
    thread.join(30)
    assert waiting["reply"].status_code == 200 and waiting["reply"].json()["usage"]["completion_tokens"] == 4
    assert metric_samples(one_slot.url)["lumotree_requests_rejected_total"] >= 1


def test_time_limit_and_graceful_shutdown():
    """A running request past ``--request-timeout`` ends with finish_reason length; SIGTERM closes the port at once and
    lets the running request finish before the process exits."""
    launched = LaunchedServer([*RANDOM_OPTIONS, "--spec", "none", "--request-timeout", "2", "--shutdown-timeout",
                               "10"], 120)
    try:
        start = time.monotonic()
        stream = long_stream(launched.url)
        launched.process.send_signal(signal.SIGTERM)
        with pytest.raises(httpx.ConnectError):
            wait_for(lambda: httpx.get(f"{launched.url}/health") is None, timeout=5)
        chunks = list(stream)
        assert chunks[-1].choices[0].finish_reason == "length" and time.monotonic() - start < 8
        assert 1 < sum(len(c.choices[0].text.split()) for c in chunks) < 3999
        assert launched.process.wait(20) in (0, -signal.SIGTERM)
        assert "Traceback" not in "".join(launched.log), "".join(launched.log)
    finally:
        launched.stop(signal.SIGKILL)


# ================================================================================================== parts
@pytest.fixture(scope="module")
def tiny_engine_parts():
    config = HybridConfig(vocab_size=48, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=2,
                          linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8, num_experts=0)
    return build_random(config, seed=3)


def test_engine_loop_time_limits_bounds_and_stop(tiny_engine_parts):
    """A request that waits past its time limit ends without tokens while the running one goes on; the queue bound
    refuses the next; stopping aborts what runs between two steps and frees every slot."""
    engine = Engine(ReferenceTarget(tiny_engine_parts, num_slots=1, max_seq_len=4096), mode="autoregressive")
    loop = EngineLoop(engine, max_waiting=1, metrics=ServerMetrics())
    loop.start()

    async def scenario():
        running = loop.submit([1, 2, 3], SamplingParams(max_new_tokens=4000), timeout=None)
        first = await running.events.get()
        assert first.tokens and not first.finished
        waiting = loop.submit([4, 5], SamplingParams(max_new_tokens=3), timeout=0.3)
        with pytest.raises(QueueFull):
            loop.submit([6], SamplingParams(), timeout=None)
        event = await asyncio.wait_for(waiting.events.get(), 10)
        assert (event.tokens, event.finished, event.finish_reason, waiting.emitted) == ([], True, "timeout", 0)
        assert loop.counts == {"running": 1, "waiting": 0}
        await asyncio.to_thread(loop.stop)
        while not (event := await running.events.get()).finished:
            pass
        assert event.finish_reason == "abort" and running.emitted < 4000

    asyncio.run(scenario())
    assert engine.running == [] and sorted(engine.free_slots) == [0] and engine.finished == {}


def test_output_text_holds_back_what_may_change():
    pieces = {1: "ab", 2: "c", 3: "X", 4: "YZ"}
    text = OutputText(lambda ids: "".join(pieces[i] for i in ids), stop=["cX"])
    assert text.add([1], final=False) == "ab"
    assert text.add([2], final=False) == ""  # "c" may begin the stop string
    assert text.add([3, 4], final=False) == "" and text.stopped and text.text == "ab"
    utf8 = OutputText(lambda ids: bytes(ids).decode("utf-8", errors="replace"))
    assert utf8.add([111, 107], final=False) == "ok"
    assert utf8.add([0xC3], final=False) == ""  # the first byte of "é"
    assert utf8.add([0xA9, 33], final=False) == "é!"
    assert utf8.add([0xE2], final=True) == "\ufffd"  # an output that ends mid-character keeps what it has


def test_output_text_is_the_whole_decode_in_any_chunking():
    """The windowed detokenization gives the text of decoding every token at once, however the tokens arrive."""
    rng = np.random.default_rng(0)
    alphabet = list("ab é€😀\n")
    for _ in range(200):
        data = list("".join(rng.choice(alphabet, 12)).encode())
        if rng.random() < 0.3:
            data.insert(int(rng.integers(0, len(data))), int(rng.integers(128, 256)))  # a stray byte
        text = OutputText(lambda ids: bytes(ids).decode("utf-8", errors="replace"))
        cuts = sorted(rng.choice(np.arange(1, len(data)), 4, replace=False).tolist())
        chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
        got = "".join(text.add(c, final=i == len(chunks) - 1) for i, c in enumerate(chunks))
        assert got == bytes(data).decode("utf-8", errors="replace")


def test_load_benchmark_runs_end_to_end(server, tmp_path):
    out = tmp_path / "serve.json"
    assert main(["bench", "serve", "--url", server.url, "--rates", "4", "--conversations", "2", "--turns", "2",
                 "--tool-words", "6", "--system-words", "5", "--max-tokens", "4", "--out", str(out)]) == 0
    run = json.loads(out.read_text())["runs"][0]
    summary = run["summary"]
    assert (summary["requests"], summary["completed"], summary["failed"]) == (4, 4, 0)
    assert 0 < summary["ttft_p50_s"] <= summary["ttft_p99_s"] and summary["goodput_requests_per_s"] > 0
    second_turns = [r for r in run["requests"] if r["turn"] == 1]
    first_turns = {r["conversation"]: r for r in run["requests"] if r["turn"] == 0}
    assert all(r["prompt_tokens"] > first_turns[r["conversation"]]["prompt_tokens"] + 4 for r in second_turns)
    assert summary["prefix_cache_hit_share"] > 0 and summary["ttft_turn2_p50_s"] > 0  # turn 2 extends turn 1
    page = httpx.get(f"{server.url}/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(page)}
    hits = families["lumotree_prefix_cache_hit_tokens"].samples[0].value
    assert hits > 0 and families["lumotree_prefix_cache_bytes"].samples[0].value <= 16 << 20


def test_load_benchmark_launches_autoregressive_and_tree_servers(tmp_path):
    out = tmp_path / "serve.json"
    assert main(["bench", "serve", "--launch", "--random tiny --backend reference --budget fixed --max-nodes 4",
                 "--specs", "none", "tree", "--prefix-caches", "0", "16MiB", "--rates", "4", "--conversations", "1",
                 "--turns", "2", "--tool-words", "4", "--max-tokens", "3", "--out", str(out),
                 "--plot", str(tmp_path / "serve.png")]) == 0
    assert (tmp_path / "serve.png").stat().st_size > 0
    runs = json.loads(out.read_text())["runs"]
    assert [r["server"] for r in runs] == ["none", "none+prefix 16MiB", "tree", "tree+prefix 16MiB"]
    assert all(r["summary"]["completed"] == 2 for r in runs)
    assert runs[0]["summary"]["mean_accepted_per_step"] == 0  # autoregressive: no speculative step
    shares = [r["summary"]["prefix_cache_hit_share"] for r in runs]
    assert shares[0] == shares[2] == 0 and shares[1] > 0 and shares[3] > 0  # the second turn extends the first


@pytest.mark.parametrize("argv,words", [
    (["serve", "--random", "tiny", "--max-waiting", "-1"], ["--max-waiting"]),
    (["serve", "--random", "tiny", "--port", "70000"], ["--port"]),
    (["serve", "--random", "tiny", "--request-timeout", "nan"], ["--request-timeout"]),
    (["serve", "--random", "tiny", "--num-slots", "0"], ["--num-slots"]),
    (["serve", "--random", "tiny", "--port", "TAKEN"], ["--port", "cannot listen"]),
    (["bench", "serve", "--url", "http://127.0.0.1:9", "--rates", "0"], ["--rates"]),
    (["bench", "serve", "--url", "http://127.0.0.1:9", "--copy-fraction", "2"], ["--copy-fraction"]),
    (["bench", "serve", "--url", "http://127.0.0.1:9", "--system-words", "-1"], ["--system-words"]),
    (["bench", "serve", "--url", "http://127.0.0.1:9", "--prefix-caches", "big"], ["--prefix-caches"]),
])
def test_option_errors_are_one_line(capsys, argv, words):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        argv = [str(taken.getsockname()[1]) if a == "TAKEN" else a for a in argv]
        code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and err.startswith("error: ") and all(w in err for w in words), err
