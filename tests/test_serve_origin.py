"""The `eaglespec` request extension (docs/serving.md): token origins per chunk and drafting off
per request, against a live server on a tiny model; without the extension every response is what
it was. Also the pieces it is built from: TokenSpans, step origins, vanilla rows in a drafting batch."""

from collections import Counter

import httpx
import pytest
from origin_helpers import drafted_marks, extension, gen, server, stream  # noqa: F401 (gen, server: fixtures)
from serve_helpers import one_torch_thread  # noqa: F401 (autouse fixture)
from tiny_tokenizer import tiny_chat_generator

from eaglespec.core.config import SamplingParams
from eaglespec.engine.batch import StepStats
from eaglespec.serve.origin import TokenSpans, step_origins, whole_tokens

CHAT = [{"role": "user", "content": "Why is the sky blue?"}]
ORIGIN = {"token_origin": True}


def content(chunk: dict) -> str:
    choice = chunk["choices"][0]
    return choice["delta"].get("content") or "" if "delta" in choice else choice["text"]


def test_without_the_extension_chunks_are_unchanged(server):
    chunks = stream(server, {"messages": CHAT, "max_tokens": 20})
    assert "eaglespec" not in chunks[0] and chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all("eaglespec" not in c for c in chunks[1:-1]) and all(content(c) for c in chunks[1:-1])
    assert set(chunks[-1]["eaglespec"]) == {"target_forwards", "tau", "accepted_lengths", "accepted_draft_tokens",
                                            "speculative", "elapsed_s", "tokens_per_second", "queue_s"}
    off = stream(server, {"messages": CHAT, "max_tokens": 20, "eaglespec": {"token_origin": False}})
    assert [content(c) for c in off] == [content(c) for c in chunks]
    assert all("eaglespec" not in c for c in off[:-1])


def test_token_origins_match_the_steps(gen, server):
    chunks = stream(server, {"messages": CHAT, "max_tokens": 30, "eaglespec": ORIGIN})
    assert chunks[0]["eaglespec"] == {"tree": "5 draft nodes, depth 3"}
    final = chunks[-1]["eaglespec"]
    spans, steps = extension(chunks, "tokens"), extension(chunks, "steps")
    for c in chunks[1:-1]:  # each chunk's parts spell its text
        assert "".join(s["text"] for s in c["eaglespec"]["tokens"]) == content(c)
    tokens = whole_tokens(spans)
    assert [t["i"] for t in tokens] == list(range(30))
    assert "".join(t["text"] for t in tokens) == gen.generate(messages=CHAT, max_new_tokens=30).text
    assert [t["origin"] == "draft" for t in tokens] == drafted_marks(steps)
    assert [s["emitted"] for s in steps] == final["accepted_lengths"]
    assert sum(s["accepted"] for s in steps) == final["accepted_draft_tokens"]
    assert all(s["tree_size"] in (1, 6) for s in steps)
    assert tokens[0]["origin"] == "target"
    assert {"draft", "bonus", "recovered"} <= {t["origin"] for t in tokens}  # the flaky drafter shows all three
    # every step: its accepted draft tokens, then the target's own (bonus after a full path)
    i = 1
    for s in steps:
        own = [t["origin"] for t in tokens[i + s["accepted"]:i + s["emitted"]]]
        assert own in ([], ["bonus"] if s["accepted"] == 3 else ["recovered"]) or s["tree_size"] == 1
        i += s["emitted"]


def test_a_stop_string_cuts_the_tokens_too(gen, server):
    """Text held back for a possible stop string still reaches its token; tokens past the cut never appear."""
    text = gen.generate(messages=CHAT, max_new_tokens=20).text
    stop = text[6:8]
    chunks = stream(server, {"messages": CHAT, "max_tokens": 20, "stop": [stop], "eaglespec": ORIGIN})
    sent = "".join(content(c) for c in chunks[1:])
    assert sent == text[:text.index(stop)] and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    tokens = whole_tokens(extension(chunks, "tokens"))
    assert "".join(t["text"] for t in tokens) == sent and [t["i"] for t in tokens] == list(range(len(tokens)))


def test_non_streaming_lists_every_token(gen, server):
    r = httpx.post(server + "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 16, "eaglespec": ORIGIN},
                   timeout=60).json()
    ext = r["eaglespec"]
    assert "".join(t["text"] for t in ext["tokens"]) == r["choices"][0]["message"]["content"]
    assert [t["origin"] == "draft" for t in ext["tokens"]] == drafted_marks(ext["steps"])
    assert ext["tree"] == "5 draft nodes, depth 3" and len(ext["tokens"]) == r["usage"]["completion_tokens"]


def test_drafting_off_per_request_is_vanilla(gen, server):
    body = {"messages": CHAT, "max_tokens": 24}
    eagle = httpx.post(server + "/v1/chat/completions", json=body, timeout=60).json()
    vanilla = httpx.post(server + "/v1/chat/completions", json={**body, "eaglespec": {"speculative": False, **ORIGIN}},
                         timeout=60).json()
    assert vanilla["choices"][0]["message"]["content"] == eagle["choices"][0]["message"]["content"]
    assert eagle["eaglespec"]["speculative"] is True and eagle["eaglespec"]["accepted_draft_tokens"] > 0
    ext = vanilla["eaglespec"]
    assert ext["speculative"] is False and ext["accepted_draft_tokens"] == 0 and ext["tree"].startswith("none")
    assert ext["target_forwards"] == 24 and {s["tree_size"] for s in ext["steps"]} == {1}
    assert {t["origin"] for t in ext["tokens"]} == {"target"}


def test_completions_stream_names_the_tree_first(server):
    chunks = stream(server, {"prompt": "Once upon", "max_tokens": 8, "eaglespec": ORIGIN}, "/v1/completions")
    assert chunks[0]["eaglespec"]["tree"] and chunks[0]["choices"][0]["text"] == ""
    assert sum(len(c["eaglespec"]["steps"]) for c in chunks[1:-1]) == len(chunks[-1]["eaglespec"]["accepted_lengths"])


@pytest.mark.parametrize("ext", [{"token_origin": 1}, {"speculative": "no"}, {"colour": True}, []])
def test_bad_extension_gets_400_naming_the_field(server, ext):
    r = httpx.post(server + "/v1/chat/completions", json={"messages": CHAT, "eaglespec": ext})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("eaglespec"), r.text
    ok = httpx.post(server + "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2, "eaglespec": None})
    assert ok.status_code == 200 and "tokens" not in ok.json()["eaglespec"]


def test_token_spans():
    text = "ab<|>c"  # tokens: "a", "b<", "" (a special token), "|>c"
    spans = TokenSpans()
    for end, origin in [(1, "target"), (3, "draft"), (3, "bonus"), (6, "recovered")]:
        spans.add(end, origin)
    got = [spans.spans(0, text[:2]), spans.spans(2, text[2:3]), spans.spans(3, "")]  # "<" was held back
    got.append(spans.spans(3, text[3:]))
    assert got == [[{"i": 0, "text": "a", "origin": "target"}, {"i": 1, "text": "b", "origin": "draft"}],
                   [{"i": 1, "text": "<", "origin": "draft"}, {"i": 2, "text": "", "origin": "bonus"}],
                   [],
                   [{"i": 3, "text": "|>c", "origin": "recovered"}]]
    assert [t["text"] for t in whole_tokens([s for g in got for s in g])] == ["a", "b<", "", "|>c"]


def test_step_origins():
    assert step_origins(StepStats(2, 3, 6, bonus=False)) == ["draft", "draft", "recovered"]
    assert step_origins(StepStats(3, 4, 6, bonus=True)) == ["draft"] * 3 + ["bonus"]
    assert step_origins(StepStats(3, 2, 6, bonus=True)) == ["draft", "draft"]  # cut by a stop token
    assert step_origins(StepStats(0, 1, 1)) == ["target"]


def test_a_vanilla_row_in_a_drafting_batch():
    """A sequence added with speculative=False verifies its root alone beside one that drafts;
    both give their greedy text (a random head: its drafts are computed and dropped)."""
    gen = tiny_chat_generator()
    prompts = [gen.encode(messages=CHAT), gen.encode("Name three rivers.")]
    want = [gen.generate(input_ids=p, max_new_tokens=12, speculative=False).token_ids for p in prompts]
    batch = gen.new_batch()
    seqs = {}
    for p, spec in zip(prompts, (True, False)):
        seq, first = batch.add(p, 12, SamplingParams(), set(), speculative=spec)
        seqs[id(seq)] = (spec, list(first.tokens), [])
    while len(batch):
        for seq, out in batch.step():
            seqs[id(seq)][1].extend(out.tokens)
            seqs[id(seq)][2].append(out.stats)
    (spec, got, stats), (vspec, vgot, vstats) = seqs.values()
    assert [got, vgot] == want
    assert spec and any(s.tree_size > 1 for s in stats) and Counter(s.tree_size for s in vstats) == {1: 11}
