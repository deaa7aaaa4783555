"""Where a result came from (helpers.study.provenance): a commit is dirty only when the code that
makes results differs from it, not when a run has rewritten its own tables and figures."""
import shutil
import subprocess

import pytest

from helpers.study.provenance import CODE, git_commit

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(root, *args):
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_commit_is_dirty_only_when_its_code_differs(tmp_path):
    for name in ("helpers/engine.py", "notebooks/params/cpu.yaml", "data/results/cpu/t.csv",
                 "figures/f.svg", "README.md", "tests/test_x.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("first\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    head = git(tmp_path, "rev-parse", "HEAD")
    assert git_commit(tmp_path) == head and "helpers" in CODE
    for written in ("data/results/cpu/t.csv", "figures/f.svg", "README.md", "tests/test_x.py"):
        (tmp_path / written).write_text("rewritten by a run, or not code\n")
    (tmp_path / "untracked.py").write_text("x\n")
    assert git_commit(tmp_path) == head
    (tmp_path / "notebooks/params/cpu.yaml").write_text("changed\n")
    assert git_commit(tmp_path) == head + "-dirty"
    git(tmp_path, "checkout", "-q", "--", "notebooks")
    (tmp_path / "helpers/engine.py").write_text("changed\n")
    assert git_commit(tmp_path) == head + "-dirty"


def test_outside_git_the_commit_is_unknown(tmp_path):
    assert git_commit(tmp_path) == "unknown"
