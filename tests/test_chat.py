"""`eaglespec chat` driven through streams: two turns, /reset, /exit; replies equal greedy output."""

import io

import pytest
from serve_helpers import one_torch_thread  # noqa: F401 (autouse fixture)
from tiny_tokenizer import tiny_chat_generator

from eaglespec.cli.chat import chat_loop, register
from eaglespec.core.config import SamplingParams


@pytest.fixture(scope="module")
def gen():
    return tiny_chat_generator()


def run(gen, text: str, max_new_tokens: int = 8):
    out, info = io.StringIO(), io.StringIO()
    rc = chat_loop(gen, SamplingParams(), max_new_tokens, io.StringIO(text), out, info)
    return rc, out.getvalue(), info.getvalue()


def test_two_turns_then_exit(gen):
    rc, out, info = run(gen, "Hello there\n\nWhat next?\n/exit\nnever read\n")
    first = gen.generate(messages=[{"role": "user", "content": "Hello there"}], max_new_tokens=8).text
    history = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": first},
               {"role": "user", "content": "What next?"}]
    second = gen.generate(messages=history, max_new_tokens=8).text
    assert rc == 0
    assert out == f"{first}\n{second}\n"
    summaries = [line for line in info.splitlines() if line.startswith("[") and "tokens/s" in line]
    assert len(summaries) == 2 and summaries[0].startswith("[8 new tokens, tau ")


def test_reset_forgets_and_eof_exits(gen):
    _, out, info = run(gen, "Hi\n/reset\nHi\n")  # no /exit: end of input leaves
    a, b = out.splitlines()
    assert a == b  # after /reset the second turn sees the same (empty) history
    assert "[history cleared]" in info
    _, _, info = run(gen, "/bogus\n/exit\n")
    assert "unknown command /bogus" in info


def test_context_overflow_is_reported_not_fatal(gen):
    _, out, info = run(gen, "x" * 600 + "\nHi\n/exit\n")
    assert "error:" in info and "/reset" in info
    assert out.count("\n") == 1  # the second turn still got a reply


def test_register_adds_the_sub_command():
    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["chat", "--temperature", "0.5", "--system", "Be brief."])
    assert args.func.__name__ == "cmd_chat" and args.temperature == 0.5 and args.system == "Be brief."
