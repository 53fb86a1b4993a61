"""`eaglespec bench --methods ...,llama.cpp,llama.cpp-f32` (issue 18's one table): the parts that
need no llama.cpp build, with fakes for llama-server and llama-quantize. The real servers and the
real F32 copy are tested in tests/interop (`make interop-test`)."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from eaglespec.bench import methods as M
from eaglespec.core.config import SamplingParams
from eaglespec.errors import EagleError
from eaglespec.interop import build_llamacpp
from eaglespec.interop.llamacpp import Completion, LlamaCppMethod, LlamaServer, f32_gguf, f32_path


def _tool(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    """An empty llama.cpp folder: nothing built."""
    monkeypatch.setenv(build_llamacpp.ROOT_ENV, str(tmp_path / "llamacpp"))
    return tmp_path / "llamacpp"


def test_no_llamacpp_method_needs_nothing(root):
    assert M.check_llamacpp("vanilla,auto,eager", None) is None


@pytest.mark.parametrize("name", ["llama.cpp", "llamacpp-f32"])
def test_an_unbuilt_llamacpp_is_named_before_the_model_loads(root, name):
    with pytest.raises(EagleError, match="build_llamacpp"):
        M.check_llamacpp(f"vanilla,{name}", None)


def test_a_hugging_face_target_is_refused_for_llamacpp(root, tmp_path):
    _tool(build_llamacpp.binary("llama-server", root), "exit 0\n")
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    with pytest.raises(EagleError, match="--target FILE.gguf"):
        M.check_llamacpp("llama.cpp", str(folder))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(16))
    assert M.check_llamacpp("llama.cpp", str(gguf)) == gguf


def test_the_f32_copy_is_made_once_atomically_by_llama_quantize(root, tmp_path):
    source = tmp_path / "model.Q4_1.gguf"
    source.write_bytes(b"GGUF" + b"q" * 60)
    with pytest.raises(EagleError, match="llama-quantize.*not built"):
        f32_gguf(source)
    calls = tmp_path / "calls"
    # a fake llama-quantize: records its arguments, writes "F32" + the source into the output
    _tool(build_llamacpp.binary("llama-quantize", root),
          f'echo "$@" >> {calls}\n{{ printf F32; cat "$2"; }} > "$3"\n')
    out = f32_gguf(source)
    assert out.read_bytes() == b"F32" + source.read_bytes()
    assert out == f32_path(source) and out.parent == root / "gguf"
    assert f32_gguf(source) == out  # kept: the tool is not run again
    (args,) = calls.read_text().splitlines()
    assert args.startswith("--allow-requantize ") and args.endswith(" F32")
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".tmp")]


def test_two_sources_of_one_name_and_size_get_their_own_copies(root, tmp_path):
    """Two fine-tunes quantized alike: same file name, same size, other weights."""
    a, b = tmp_path / "a" / "model.gguf", tmp_path / "b" / "model.gguf"
    for path, byte in ((a, b"a"), (b, b"b")):
        path.parent.mkdir()
        path.write_bytes(b"GGUF" + byte * 16)
    _tool(build_llamacpp.binary("llama-quantize", root), 'cat "$2" > "$3"\n')
    assert f32_gguf(a).read_bytes() == a.read_bytes() and f32_gguf(b).read_bytes() == b.read_bytes()
    assert f32_path(a) != f32_path(b)
    os.utime(a, ns=(1, 1))  # rewritten in place: a new copy
    assert f32_path(a) != f32_gguf(b) and not f32_path(a).exists()


def test_the_f32_method_needs_llama_quantize_unless_its_copy_exists(root, tmp_path):
    _tool(build_llamacpp.binary("llama-server", root), "exit 0\n")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(16))
    assert M.check_llamacpp("llama.cpp", str(gguf)) == gguf  # the Q4_1 method alone: no llama-quantize needed
    with pytest.raises(EagleError, match="llama-quantize"):
        M.check_llamacpp("llama.cpp-f32", str(gguf))
    f32_path(gguf).parent.mkdir(parents=True)
    f32_path(gguf).write_bytes(b"GGUF")
    assert M.check_llamacpp("llama.cpp-f32", str(gguf)) == gguf


def test_no_check_when_the_llamacpp_methods_are_skipped(root):
    """At temperature > 0 they are skipped (greedy only): an unbuilt llama.cpp is no error."""
    assert M.check_llamacpp("vanilla,llama.cpp,llama.cpp-f32", None, greedy=False) is None


def test_a_failing_llama_quantize_leaves_no_copy(root, tmp_path):
    source = tmp_path / "other.gguf"
    source.write_bytes(b"GGUF" + bytes(8))
    _tool(build_llamacpp.binary("llama-quantize", root), 'echo "unknown tensor type" >&2\nexit 3\n')
    with pytest.raises(EagleError, match="unknown tensor type"):
        f32_gguf(source)
    assert not list((root / "gguf").iterdir())


class FakeServer:
    """llama-server's client surface: complete(), pause(), resume(), cmd."""

    def __init__(self):
        self.cmd = ["llama-server", "-m", "m.gguf", "--port", "1234"]
        self.events: list[str] = []
        self.entered = self.exited = False

    def pause(self):
        self.events.append("pause")

    def resume(self):
        self.events.append("resume")

    def complete(self, ids, n):
        self.events.append(f"complete {len(ids)} {n}")
        return Completion(list(range(n)), "text", "limit", prompt_ms=100.0, predicted_ms=400.0, wall_s=0.7,
                          drafted=0, accepted=0, steps=0, decodes=n + 1)

    def __enter__(self):
        self.entered = True
        return self

    def __exit__(self, *exc):
        self.exited = True


def test_the_method_runs_only_its_own_requests_and_times_llamacpp_itself():
    srv = FakeServer()
    m = LlamaCppMethod(srv, "llama.cpp")
    assert srv.events == ["pause"]  # stopped from the start: idle, its threads would poll on every core
    rec = m.run([1, 2, 3], 5, SamplingParams())
    assert srv.events == ["pause", "resume", "complete 3 5", "pause"]
    assert rec.token_ids == [0, 1, 2, 3, 4] and rec.elapsed == pytest.approx(0.5)  # llama.cpp's own timings
    with pytest.raises(EagleError, match="greedy only"):
        m.run([1], 4, SamplingParams(temperature=0.7))


def test_build_methods_starts_one_server_per_llamacpp_method_and_stops_them(root, tmp_path, monkeypatch):
    started = []

    def fake_server(model, **kw):
        srv = FakeServer()
        srv.model = Path(model)
        started.append(srv)
        return srv

    monkeypatch.setattr("eaglespec.interop.llamacpp.LlamaServer", fake_server)
    monkeypatch.setattr("eaglespec.interop.llamacpp.f32_gguf", lambda g: Path(str(g) + ".F32.gguf"))
    _tool(build_llamacpp.binary("llama-server", root), "exit 0\n")
    gguf = tmp_path / "m.Q4_1.gguf"

    class Gen:  # what build_methods reads of a generator for these methods
        head = drafter = None
        tree = None

    with contextlib.ExitStack() as servers:
        methods, notes = M.build_methods(Gen(), "llamacpp,llama.cpp-f32", [], greedy=True, servers=servers,
                                         gguf=gguf)
        assert [m.name for m in methods] == [M.BASELINE, M.LLAMA_CPP, M.LLAMA_CPP_F32]
        assert [s.model.name for s in started] == ["m.Q4_1.gguf", "m.Q4_1.gguf.F32.gguf"]
        assert all(s.entered and not s.exited for s in started)
        assert all("--port" not in m.spec for m in methods[1:])  # a resumed run compares specs
    assert all(s.exited for s in started)
    skipped, notes = M.build_methods(Gen(), "llama.cpp", [], greedy=False, servers=contextlib.ExitStack(), gguf=gguf)
    assert [m.name for m in skipped] == [M.BASELINE] and any("greedy only" in n for n in notes)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads process states from Linux's /proc")
def test_pause_stops_the_server_and_close_resumes_it_to_end_it(tmp_path):
    """pause / resume / close on a real child process (sleep standing in for llama-server)."""
    srv = LlamaServer(tmp_path / "m.gguf", binary=Path("/bin/true"))
    srv.proc = subprocess.Popen(["sleep", "30"])
    try:
        srv.pause()
        assert _wait_state(srv.proc.pid, "T") == "T"
        srv.resume()
        assert _wait_state(srv.proc.pid, "SR") in "SR"
        srv.pause()
        assert _wait_state(srv.proc.pid, "T") == "T"
        srv.close()  # SIGCONT, then SIGTERM: a stopped process would not act on SIGTERM alone
        assert srv.proc.wait(timeout=10) is not None
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()


def _wait_state(pid: int, wanted: str, timeout: float = 5.0) -> str:
    """The process's state letter once it is one of `wanted` (signals arrive asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state in wanted or time.monotonic() > deadline:
            return state
        time.sleep(0.02)


def test_a_server_that_crashes_while_loading_is_started_again_without_repacking(tmp_path, capsys):
    """llama-server's repacked AMX kernels segfault while loading on the Intel AMX kind: a server
    killed by a signal before it answers is started once more with --no-repack, said so; one that
    exits with an error code, or crashes again, is an EagleError naming the code."""
    import sys

    fake = tmp_path / "fake_server.py"
    fake.write_text(
        "import http.server, os, signal, sys\n"
        "if '--no-repack' not in sys.argv:\n"
        "    os.kill(os.getpid(), signal.SIGSEGV)\n"
        "port = int(sys.argv[sys.argv.index('--port') + 1])\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers(); self.wfile.write(b'{}')\n"
        "    def log_message(self, *a):\n"
        "        pass\n"
        "http.server.HTTPServer(('127.0.0.1', port), H).serve_forever()\n")
    binary = _tool(tmp_path / "llama-server", f'exec {sys.executable} {fake} "$@"\n')
    with LlamaServer(tmp_path / "m.gguf", binary=binary, startup_s=30) as srv:
        assert srv.cmd[-1] == "--no-repack" and srv.proc.poll() is None
    assert "crashed while loading (signal 11); starting it again with --no-repack" in capsys.readouterr().err
    with pytest.raises(EagleError, match="exited with code -11 while loading"):
        with LlamaServer(tmp_path / "m.gguf", binary=_tool(tmp_path / "always", "kill -SEGV $$\n"), startup_s=30):
            pass
    with pytest.raises(EagleError, match="exited with code 3 while loading"):
        with LlamaServer(tmp_path / "m.gguf", binary=_tool(tmp_path / "fails", "exit 3\n"), startup_s=30):
            pass
