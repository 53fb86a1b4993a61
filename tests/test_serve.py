"""The OpenAI-compatible server against a live uvicorn on 127.0.0.1, with the official `openai`
client: outputs equal the engine's own greedy output; errors are OpenAI-style JSON 4xx."""

import httpx
import pytest
from serve_helpers import SlowGenerator, live_server, one_torch_thread  # noqa: F401 (autouse fixture)
from tiny_tokenizer import tiny_chat_generator

from eaglespec.engine.text import TextStream
from eaglespec.errors import EagleError
from eaglespec.serve import ServeConfig, create_app

openai = pytest.importorskip("openai")

MODEL = "tiny-llama"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}]


@pytest.fixture(scope="module")
def gen():
    return tiny_chat_generator()


@pytest.fixture(scope="module")
def server(gen):
    app = create_app(gen, ServeConfig(max_tokens=64, default_max_tokens=12, queue_timeout=60))
    with live_server(app) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=60)


def greedy(gen, n, **kw):
    return gen.generate(max_new_tokens=n, **kw)


def test_chat_non_streaming_equals_engine(gen, client):
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10, temperature=0)
    want = greedy(gen, 10, messages=CHAT)
    assert r.choices[0].message.content == want.text
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == want.finish_reason
    assert r.usage.prompt_tokens == len(gen.encode(messages=CHAT))
    assert r.usage.completion_tokens == len(want.token_ids) == 10
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    stats = r.model_extra["eaglespec"]
    assert stats["target_forwards"] == want.target_forwards
    assert stats["tau"] == pytest.approx(want.tau, abs=1e-3)
    assert sum(stats["accepted_lengths"]) + 1 == 10 and stats["speculative"] is True


def test_chat_streaming_equals_engine(gen, client):
    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == greedy(gen, 10, messages=CHAT).text
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert finals[0].model_extra["eaglespec"]["target_forwards"] >= 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


def test_default_max_tokens_and_omitted_model(gen, server):
    r = httpx.post(server + "/v1/chat/completions", json={"messages": CHAT}, timeout=60).json()
    assert r["choices"][0]["message"]["content"] == greedy(gen, 12, messages=CHAT).text
    assert r["model"] == MODEL and r["object"] == "chat.completion"


def test_completion_equals_engine(gen, client):
    prompt = "Once upon a time"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=9)
    want = greedy(gen, 9, prompt=prompt, chat_template=False)
    assert r.choices[0].text == want.text and r.usage.completion_tokens == 9
    streamed = "".join(c.choices[0].text for c in client.completions.create(model=MODEL, prompt=prompt, max_tokens=9, stream=True))
    assert streamed == want.text
    ids = gen.encode(prompt, chat_template=False)
    assert client.completions.create(model=MODEL, prompt=ids, max_tokens=9).choices[0].text == want.text


PROMPTS = ["Once upon a time", "The sky is", "1, 2, 3,", "Hello"]


def test_a_list_of_prompts_is_decoded_together_one_choice_each(gen, client):
    alone = [client.completions.create(model=MODEL, prompt=p, max_tokens=9).choices[0].text for p in PROMPTS]
    assert alone == [greedy(gen, 9, prompt=p, chat_template=False).text for p in PROMPTS]
    r = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=9)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert [c.text for c in r.choices] == alone
    assert r.usage.completion_tokens == 4 * 9
    assert r.usage.prompt_tokens == sum(len(gen.encode(p, chat_template=False)) for p in PROMPTS)
    stats = r.model_extra["eaglespec"]
    assert stats["target_forwards"] == sum(c.model_extra["eaglespec"]["target_forwards"] for c in r.choices)
    ids = [gen.encode(p, chat_template=False) for p in PROMPTS]
    assert [c.text for c in client.completions.create(model=MODEL, prompt=ids, max_tokens=9).choices] == alone

    texts, finished = [""] * 4, []
    for chunk in client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=9, stream=True,
                                           stream_options={"include_usage": True}):
        for c in chunk.choices:
            texts[c.index] += c.text
            if c.finish_reason:
                finished.append(c.index)
        if not chunk.choices:
            assert chunk.usage.completion_tokens == 4 * 9
    assert texts == alone and sorted(finished) == [0, 1, 2, 3]


def test_stop_strings_are_cut(gen, client):
    want = greedy(gen, 20, messages=CHAT).text
    stop = want[5:7]
    cut = want[: want.find(stop)]
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=20, stop=[stop, "never-seen"])
    assert r.choices[0].message.content == cut and r.choices[0].finish_reason == "stop"
    chunks = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=20, stop=stop, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == cut


def test_sampling_with_seed_is_reproducible(client):
    kw = dict(model=MODEL, messages=CHAT, max_tokens=8, temperature=0.9, top_p=0.9, seed=7)
    assert client.chat.completions.create(**kw).choices[0].message.content == \
        client.chat.completions.create(**kw).choices[0].message.content


def test_models_and_health(client, server):
    assert [m.id for m in client.models.list().data] == [MODEL]
    h = httpx.get(server + "/health").json()
    assert h["status"] == "ok" and h["model"] == MODEL


BAD = [  # (name, method, path, body (dict / raw str), status, param)
    ("malformed json", "POST", "/v1/chat/completions", '{"messages": [', 400, None),
    ("body is a list", "POST", "/v1/chat/completions", "[1, 2]", 400, None),
    ("no messages", "POST", "/v1/chat/completions", {"model": MODEL}, 400, "messages"),
    ("empty messages", "POST", "/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("messages not a list", "POST", "/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("message without role", "POST", "/v1/chat/completions", {"messages": [{"content": "hi"}]}, 400, "messages.0.role"),
    ("unknown role", "POST", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role"),
    ("content is a number", "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "messages.0.content"),
    ("max_tokens is a string", "POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": "ten"}, 400, "max_tokens"),
    ("max_tokens zero", "POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens over the limit", "POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 65}, 400, "max_tokens"),
    ("negative temperature", "POST", "/v1/chat/completions", {"messages": CHAT, "temperature": -0.5}, 400, "temperature"),
    ("temperature is a string", "POST", "/v1/chat/completions", {"messages": CHAT, "temperature": "hot"}, 400, "temperature"),
    ("top_p zero", "POST", "/v1/chat/completions", {"messages": CHAT, "top_p": 0}, 400, "top_p"),
    ("seed is a float", "POST", "/v1/chat/completions", {"messages": CHAT, "seed": 1.5}, 400, "seed"),
    ("stream is a string", "POST", "/v1/chat/completions", {"messages": CHAT, "stream": "yes"}, 400, "stream"),
    ("five stop strings", "POST", "/v1/chat/completions", {"messages": CHAT, "stop": list("abcde")}, 400, "stop"),
    ("n = 2", "POST", "/v1/chat/completions", {"messages": CHAT, "n": 2}, 400, "n"),
    ("unknown model", "POST", "/v1/chat/completions", {"model": "gpt-9", "messages": CHAT}, 404, "model"),
    ("prompt too long", "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 600}]}, 400, "messages"),
    ("context overflow", "POST", "/v1/completions", {"prompt": "y" * 480, "max_tokens": 40}, 400, "max_tokens"),
    ("no prompt", "POST", "/v1/completions", {"max_tokens": 4}, 400, "prompt"),
    ("empty prompt", "POST", "/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("an empty prompt in a list", "POST", "/v1/completions", {"prompt": ["a", ""]}, 400, "prompt"),
    ("more prompts than the queue", "POST", "/v1/completions", {"prompt": ["a"] * 65}, 400, "prompt"),
    ("more prompts than one batch holds", "POST", "/v1/completions", {"prompt": ["a"] * 17}, 400, "prompt"),
    ("a list prompt too long", "POST", "/v1/completions", {"prompt": ["a", "y" * 600]}, 400, "prompt.1"),
    ("mixed prompt list", "POST", "/v1/completions", {"prompt": ["a", [5, 6]]}, 400, "prompt.0"),
    ("token id out of vocab", "POST", "/v1/completions", {"prompt": [5, 100000]}, 400, "prompt"),
    ("GET on a POST route", "GET", "/v1/chat/completions", None, 405, None),
    ("unknown route", "GET", "/v1/engines", None, 404, None),
    ("unknown model card", "GET", "/v1/models/gpt-9", None, 404, "model"),
]


@pytest.mark.parametrize("name,method,path,body,status,param", BAD, ids=[b[0] for b in BAD])
def test_bad_requests_get_json_4xx(server, name, method, path, body, status, param):
    kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, str) else {"json": body}
    r = httpx.request(method, server + path, timeout=30, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"] == "invalid_request_error"
    assert err["param"] == param


def test_server_survives_bad_requests(server, client):
    assert httpx.get(server + "/health").status_code == 200
    assert client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2).usage.completion_tokens == 2


def test_api_key(gen):
    app = create_app(gen, ServeConfig(api_key="s3cret", max_tokens=16))
    with live_server(app) as url:
        assert httpx.get(url + "/health").status_code == 200  # open to probes
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            r = httpx.get(url + "/v1/models", headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = httpx.post(url + "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2})
        assert r.status_code == 401
        good = openai.OpenAI(base_url=url + "/v1", api_key="s3cret", max_retries=0)
        assert good.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2).usage.completion_tokens == 2
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="nope", max_retries=0).models.list()


def test_queue_timeout_503_and_disconnect_frees_the_worker(gen):
    slow = SlowGenerator(gen, delay=0.05)  # 200 tokens take >= 10 s
    app = create_app(slow, ServeConfig(max_tokens=200, queue_timeout=0.5, max_batch=1))  # a full batch: others queue
    with live_server(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        long = {"messages": CHAT, "max_tokens": 200, "stream": True}
        with http.stream("POST", "/v1/chat/completions", json=long) as hog:
            assert hog.status_code == 200
            lines = hog.iter_lines()
            assert next(lines).startswith("data: ")  # the worker is busy with it now
            r = http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2})
            assert r.status_code == 503
            assert r.json()["error"]["code"] == "queue_timeout" and r.json()["error"]["type"] == "server_error"
            assert http.get("/health").json()["busy"] is True
        # the client hung up mid-stream: the worker stops at its next step and serves the next request
        r = http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        assert r.json()["eaglespec"]["queue_s"] < 0.5


def test_a_request_joins_the_running_batch(gen):
    """Continuous batching: a short request sent while a long one streams starts at the next
    step (no queueing) and finishes first, and its text is what it gets alone."""
    slow = SlowGenerator(gen, delay=0.05)
    app = create_app(slow, ServeConfig(max_tokens=200, queue_timeout=0.5, max_batch=2))
    short = {"messages": CHAT, "max_tokens": 4}
    with live_server(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        alone = http.post("/v1/chat/completions", json=short).json()
        with http.stream("POST", "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 200, "stream": True}) as hog:
            lines = hog.iter_lines()
            assert next(lines).startswith("data: ")
            r = http.post("/v1/chat/completions", json=short)
            assert r.status_code == 200 and r.json()["eaglespec"]["queue_s"] < 0.5
            assert r.json()["choices"][0]["message"]["content"] == alone["choices"][0]["message"]["content"]
            assert http.get("/health").json()["busy"] is True  # the long one is still running


def test_create_app_needs_a_tokenizer(gen):
    from conftest import tiny_target

    from eaglespec.engine.decoding import EagleGenerator

    with pytest.raises(EagleError, match="tokenizer"):
        create_app(EagleGenerator(tiny_target("llama", check=False)), ServeConfig())
    with pytest.raises(EagleError, match="queue_timeout"):
        ServeConfig(queue_timeout=0)


@pytest.mark.parametrize("pieces,stop,want", [
    (["Hel", "lo wor", "ld"], [], ["Hel", "lo wor", "ld"]),
    (["Hel", "lo, S", "TOP here"], ["STOP"], ["Hel", "lo, ", ""]),   # "S" held back, then cut
    (["a", "b", "c"], ["bd"], ["a", "", "bc"]),                       # a held prefix released by flush
    (["xSTOPy"], ["STOP", "xS"], [""]),                               # the earliest stop wins
])
def test_text_stream(pieces, stop, want):
    stream = TextStream(lambda ids: "".join(pieces[i] for i in ids), stop)  # token i decodes to pieces[i]
    got = [stream.push([i]) for i in range(len(pieces))]
    got[-1] += stream.flush()
    assert got == want


def test_serve_cli_options(monkeypatch):
    import argparse

    from eaglespec.serve.cli import config_from_args, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "--port", "9001", "--queue-timeout", "5", "--max-new-tokens", "32"])
    monkeypatch.setenv("EAGLESPEC_API_KEY", "from-env")
    config = config_from_args(args)
    assert args.func.__name__ == "cmd_serve"
    assert (config.host, config.port, config.queue_timeout, config.default_max_tokens) == ("127.0.0.1", 9001, 5.0, 32)
    assert config.api_key == "from-env"
    assert config_from_args(parser.parse_args(["serve", "--api-key", "flag"])).api_key == "flag"
    assert (config.header_timeout, config.max_connections) == (10.0, 256)
    config = config_from_args(parser.parse_args(["serve", "--header-timeout", "2.5", "--max-connections", "8"]))
    assert (config.header_timeout, config.max_connections) == (2.5, 8)
    for flag, value, message in (("--header-timeout", "0", "header_timeout must be > 0"),
                                 ("--max-connections", "0", "--max-connections must be >= 1, got 0"),
                                 ("--max-batch", "0", "--max-batch must be >= 1, got 0")):
        with pytest.raises(EagleError, match=message):
            config_from_args(parser.parse_args(["serve", flag, value]))
    with pytest.raises(EagleError, match="temperature"):
        config_from_args(parser.parse_args(["serve", "--temperature", "-1"]))


def test_serve_builds_its_batch_steps_before_it_listens(monkeypatch, capsys):
    """cmd_serve warms the batch buckets up to --max-batch (EagleGenerator.warm_batches) after
    loading and before the server runs, and says so on stderr."""
    import argparse

    from eaglespec.cli import options
    from eaglespec.serve import app as app_module
    from eaglespec.serve.cli import register

    events = []

    class FakeGen:
        def warm_batches(self, max_batch, say=None):
            events.append(("warm_batches", max_batch))
            say("batch steps for 2 rows ready: 3 step(s) in 1 s")

    class FakeServer:
        def run(self):
            events.append(("run",))

    monkeypatch.setattr(options, "load_generator", lambda args, max_batch=1: FakeGen())
    monkeypatch.setattr(app_module, "create_app", lambda gen, config: argparse.Namespace(
        state=argparse.Namespace(model_name="fake")))
    monkeypatch.setattr(app_module, "server", lambda app, **kw: FakeServer())
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "--max-batch", "8"])
    assert args.func(args) == 0
    assert events == [("warm_batches", 8), ("run",)]
    assert "[eaglespec] batch steps for 2 rows ready" in capsys.readouterr().err


def test_the_load_test_reads_peak_memory_of_itself_or_of_a_server_pid():
    """memory.peak_rss_mb: this process's, by pid or not, is its VmHWM; reset_peak_rss starts it
    afresh below an earlier peak; a pid that is no process is a one-line EagleError, and the load
    test names its flag before it sends any load."""
    import os

    from eaglespec.memory import peak_rss_mb, reset_peak_rss

    block = bytearray(200 * 2**20)  # 200 MB resident, then freed
    block[::4096] = b"x" * len(block[::4096])
    del block
    high = peak_rss_mb()
    assert high > 200 and abs(high - peak_rss_mb(os.getpid())) <= 2
    if reset_peak_rss():
        assert peak_rss_mb() < high - 100
    with pytest.raises(EagleError, match="cannot read the peak memory of process 999999999") as info:
        peak_rss_mb(999999999)
    assert "\n" not in str(info.value)
    from eaglespec.serve.loadtest import main

    # before any load: a request to port 9 would fail, and the old check ran only after the load
    with pytest.raises(SystemExit, match=r"--server-pid 999999999: cannot read the peak memory of process 999999999 .*leave --server-pid out"):
        main(["--url", "http://127.0.0.1:9", "--server-pid", "999999999", "--clients", "1", "--requests", "1"])
