"""The slim tree for device calls: only what runs there travels, and the index comes back exactly."""

import subprocess

import pytest

from eaglespec.errors import EagleError
from eaglespec.tools import device_tree as dt
from eaglespec.tools.gpu_recipe import part_sizes


def git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path):
    files = {"src/eaglespec/engine.py": "x = 1\n", "src/eaglespec/heads/h/model.safetensors": "w" * 5000,
             "tests/test_a.py": "def test(): pass\n", "docs/a[1] b.md": "doc\n", "README.md": "readme\n",
             "pyproject.toml": "[project]\n", "Makefile": "all:\n", "scripts/call.sh": "echo\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    git(tmp_path, "init", "-q")
    (tmp_path / ".git" / "info").mkdir(exist_ok=True)
    (tmp_path / ".git" / "info" / "exclude").write_text("# mine\n/local/\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init")
    (tmp_path / "src/eaglespec/engine.py").write_text("x = 2\n")
    git(tmp_path, "add", "src/eaglespec/engine.py")  # a staged change survives slim and unslim
    return tmp_path


def test_slim_carries_only_what_runs_and_unslim_restores_the_index(repo):
    index, exclude = git(repo, "ls-files", "-s"), (repo / ".git/info/exclude").read_text()
    staged = git(repo, "diff", "--cached", "--name-only")
    everything = dt.tree_bytes(repo)
    assert dt.slim_bytes(repo) == dt.tree_bytes(repo, ["Makefile", "pyproject.toml", "scripts/call.sh",
                                                      "src/eaglespec/engine.py", "tests/test_a.py"])
    carried = dt.slim(repo)
    assert dt.travelling(repo) == ["Makefile", "pyproject.toml", "scripts/call.sh", "src/eaglespec/engine.py",
                                   "tests/test_a.py"]
    assert carried == dt.slim_bytes(repo) < everything and dt.is_slim(repo)
    assert (repo / "docs/a[1] b.md").is_file() and (repo / "src/eaglespec/heads/h/model.safetensors").is_file()
    with pytest.raises(EagleError, match="slim already"):
        dt.slim(repo)
    dt.unslim(repo)
    assert git(repo, "ls-files", "-s") == index and (repo / ".git/info/exclude").read_text() == exclude
    assert git(repo, "diff", "--cached", "--name-only") == staged == "src/eaglespec/engine.py\n"
    assert git(repo, "status", "--porcelain") == "M  src/eaglespec/engine.py\n" and not dt.is_slim(repo)
    with pytest.raises(EagleError, match="not slim"):
        dt.unslim(repo)


def test_the_cli_reports_each_calls_size_and_fails_when_one_is_too_big(repo, capsys):
    bundle = repo / ".device"
    for part, size in (("a", 1000), ("b", dt.CALL_BYTES)):
        (bundle / part).mkdir(parents=True)
        (bundle / part / "model.part").write_bytes(b"\0" * size)
    (repo / ".gitignore").write_text(".device/\n")
    assert dt.main(["slim", "--repo", str(repo)]) == 1  # part b alone fills a call: said, exit 1
    out = capsys.readouterr().out
    assert "call b" in out and "too big" in out and "call a" in out
    assert dt.main(["unslim", "--repo", str(repo)]) == 0
    assert dt.main(["size", "--repo", str(repo / "src")]) == 1  # from a subfolder: the checkout's root


def test_part_a_is_what_the_slim_tree_and_the_wheels_leave_of_a_call(repo, tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle")
    (out / "a" / "whl").mkdir(parents=True)
    (out / "a" / "whl" / "x.whl").write_bytes(b"\0" * 12345)
    first, sizes = part_sizes(98_000_000, out, repo)
    assert sizes["tree"] == dt.slim_bytes(repo) + 2 ** 20 and sizes["wheels"] == 12345
    assert first + sizes["tree"] + sizes["wheels"] == dt.CALL_BYTES
    assert sizes["model_first"] + sizes["model_rest"] == 98_000_000
    assert part_sizes(1000, out, repo)[0] == 1000  # a small model goes whole in part a


def test_slim_is_undone_on_failure_and_guards_commits(repo, monkeypatch):
    (repo / ".git/info/exclude").unlink()  # absent before: absent after
    (repo / "README.md").write_text("staged\n")
    git(repo, "add", "README.md")
    (repo / "README.md").write_text("on disk\n")  # staged content differs from both HEAD and the file
    (repo / "docs/trail ").write_text("x")
    git(repo, "add", "docs/trail ")
    index = git(repo, "ls-files", "-s")
    dt.slim(repo)
    assert "docs/trail " not in dt.travelling(repo) and "README.md" not in dt.travelling(repo)
    hook = subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x"], cwd=repo,
                          capture_output=True, text=True)
    assert hook.returncode != 0 and "unslim" in hook.stderr  # the pre-commit hook refuses
    assert dt.unslim(repo) == ""
    assert git(repo, "ls-files", "-s") == index and not (repo / ".git/info/exclude").exists()
    assert not (repo / ".git/hooks/pre-commit").exists() and git(repo, "show", ":README.md") == "staged\n"
    real = dt._git

    def failing(path, *args, **kw):
        if "rm" in args:
            raise EagleError("git rm failed")
        return real(path, *args, **kw)

    monkeypatch.setattr(dt, "_git", failing)
    with pytest.raises(EagleError, match="git rm failed"):
        dt.slim(repo)
    assert not dt.is_slim(repo) and not (repo / ".git/info/exclude").exists()
    assert git(repo, "ls-files", "-s") == index and not (repo / ".git/hooks/pre-commit").exists()
