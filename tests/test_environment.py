"""Set-up: pyproject and environment.yml agree, torch is pinned everywhere, the README leads."""
import re
import tomllib

import yaml

from helpers.study.paths import ROOT

TORCH_PIN = "torch==2.13.0"


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_lists_the_same_dependencies_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    declared = project["dependencies"] + extras["test"] + extras["ray"] + extras["peers"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    listed = [r for r in pip if not r.startswith("-e")]
    assert sorted(listed) == sorted(declared)  # same names and the same version specifiers


def test_torch_is_pinned_in_every_install_path():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert TORCH_PIN in project["dependencies"]
    assert TORCH_PIN in (ROOT / "environment.yml").read_text()
    assert TORCH_PIN in (ROOT / "Makefile").read_text()


def test_readme_starts_with_the_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^make (\w+)\s*$", readme.split("\n## ", 1)[0], flags=re.M)
    assert commands == ["run", "test"]
    ci = [line for line in (ROOT / ".ci/run").read_text().splitlines()
          if line and not line.startswith("#")]
    assert ci[-1] == "exec make test"


# transfer.py frames messages between our own processes over a pipe (pickle protocol 5, arrays out
# of band), as multiprocessing's Connection does; it may pickle only if it never touches a file
IN_MEMORY_PICKLING = {"transfer.py"}
FILE_CALLS = {"open", "dump", "load", "File"}


def test_persisted_state_is_data_not_code():
    """No pickle reaches the disk, and any torch.load refuses code (weights_only=True)."""
    import ast

    offences = []
    for path in sorted((ROOT / "helpers").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if any(n.split(".")[0] in ("pickle", "dill", "cloudpickle", "joblib")
                       for n in names) and path.name not in IN_MEMORY_PICKLING:
                    offences.append(f"{path.name}:{node.lineno} imports a pickler")
            if path.name in IN_MEMORY_PICKLING and isinstance(node, ast.Call) \
                    and getattr(node.func, "id", getattr(node.func, "attr", "")) in FILE_CALLS:
                offences.append(f"{path.name}:{node.lineno} pickles, and touches a file")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                keywords = {k.arg: k.value for k in node.keywords}
                if node.func.attr == "load" and getattr(node.func.value, "id", "") == "torch":
                    safe = keywords.get("weights_only")
                    if not (isinstance(safe, ast.Constant) and safe.value is True):
                        offences.append(f"{path.name}:{node.lineno} torch.load without "
                                        f"weights_only=True")
                if node.func.attr in ("save", "load") and "allow_pickle" in keywords:
                    offences.append(f"{path.name}:{node.lineno} allow_pickle")
    assert not offences
