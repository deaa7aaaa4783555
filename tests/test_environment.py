"""Set-up: pyproject and environment.yml agree, torch is pinned where we install, the README
leads."""
import re
import tomllib

import yaml

from helpers.study.paths import ROOT

TORCH_PIN = "torch==2.13.0"  # constraints.txt: the CPU build on our machines' disk
JSONSCHEMA_PIN = "jsonschema==4.24.1"  # constraints.txt: the last without rfc3987-syntax
OLDEST_TORCH = "2.11.0"  # the GPU check's image (the device tool's KINDS.md)


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_lists_the_same_dependencies_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    declared = project["dependencies"] + [r for extra in extras.values() for r in extra]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    listed = [r for r in pip if not r.startswith("-")]
    assert sorted(listed) == sorted(set(declared))  # same names and the same version specifiers
    make = (ROOT / "Makefile").read_text()
    assert f'-e ".[{",".join(extras)}]"' in make or all(  # make installs every extra
        re.search(rf'-e "\.\[[^]]*\b{name}\b', make) for name in extras)


def test_importing_ray_builds_no_iri_grammar():
    """jsonschema 4.25+ imports rfc3987-syntax where it is installed (the notebooks' extra pulls
    it), which builds a Lark grammar: 1.35 CPU s of every Ray process's 1.9 here. The install
    pins the jsonschema that does not (constraints.txt)."""
    import subprocess
    import sys

    found = subprocess.run([sys.executable, "-c", "import sys, ray, jsonschema; "
                            "print(sorted({'rfc3987_syntax', 'lark'} & set(sys.modules)))"],
                           capture_output=True, text=True, timeout=60)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "[]"


def test_torch_is_pinned_where_we_install_and_only_bounded_where_users_do():
    """make and the conda file install with constraints.txt (2.13.0's CPU build, never a CUDA
    one); the package itself asks for torch >= the oldest we run, so ``pip install -e .``
    beside a card's torch keeps it."""
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch = next(Requirement(r) for r in project["dependencies"] if _name(r) == "torch")
    assert torch.specifier.contains(OLDEST_TORCH) and torch.specifier.contains("2.13.0")
    assert not torch.specifier.contains("2.10.0") and "==" not in str(torch.specifier)
    pins = [line for line in (ROOT / "constraints.txt").read_text().splitlines()
            if line and not line.startswith("#")]
    assert pins == [TORCH_PIN, JSONSCHEMA_PIN]
    installs = [line for line in (ROOT / "Makefile").read_text().splitlines()
                if "pip install" in line and not line.startswith("#")]
    assert installs and all("-c $(CONSTRAINTS)" in line for line in installs)
    assert "CONSTRAINTS := constraints.txt" in (ROOT / "Makefile").read_text()
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "-c constraints.txt" in next(d["pip"] for d in env["dependencies"]
                                        if isinstance(d, dict))


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


def test_make_test_runs_every_case_and_make_quick_all_but_the_slow_ones():
    """CI (make test) runs the slow cases too; make quick, the developer's suite, leaves them out;
    both say how long the tests took, and the marker is declared (a typo'd one fails at once)."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = {target: makefile.split(f"\n{target}: ", 1)[1].split("\n\n", 1)[0]
              for target in ("test", "quick")}
    pytest = makefile.split("\nPYTEST := ", 1)[1].split("\n", 1)[0]
    assert pytest.startswith("$(PY) -m pytest ") and " -m " not in pytest.split("pytest", 1)[1]
    assert "-n $(TEST_WORKERS) --dist loadfile" in pytest  # (a file's fixtures made once)
    assert "$(PYTEST);" in recipe["test"] and " -m " not in recipe["test"]
    assert '$(PYTEST) -m "not slow"' in recipe["quick"]
    assert all("the tests took" in r for r in recipe.values())
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "--strict-markers" in settings["addopts"]
    assert any(m.startswith("slow:") for m in settings["markers"])


EXTRAS_ONLY = ("matplotlib", "seaborn", "papermill", "jupyterlab", "ipykernel", "ipywidgets",
               "PIL", "onnxruntime", "onnx", "rapidocr_onnxruntime", "ray")  # what a library
# install lacks (measured: 57 packages, 1.8 GB with torch's CPU build, against 195 and 2.8 GB)


def test_a_library_install_runs_and_exports_and_names_the_extra_it_lacks(tmp_path):
    """Issue 59: `pip install -e .` pulled 195 packages (JupyterLab, papermill, seaborn,
    rapidocr, onnx) to embed texts. Without any extra's packages (each made unimportable), a
    run on the embedded model and its export work; report, the notebooks and runtime='onnx'
    say which `pip install` adds what they need."""
    import json
    import subprocess
    import sys
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {_name(r) for r in project["dependencies"]}
    for extra in ("notebooks", "report", "onnx", "binning", "ray", "peers"):
        assert project["optional-dependencies"][extra]
    assert not core & {"matplotlib", "seaborn", "papermill", "jupyterlab", "onnx",
                       "onnxruntime", "rapidocr-onnxruntime", "ray"}
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                               for t in ["one", "two", "three"]))
    script = ("import sys\n"
              f"for name in {EXTRAS_ONLY!r}:\n"
              "    sys.modules[name] = None\n"
              "from helpers.cli import main\n"
              "sys.exit(main(sys.argv[1:]))\n")

    def command(*args):
        return subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                              text=True, cwd=tmp_path, timeout=300,
                              env={**__import__("os").environ, "PYTHONPATH": str(ROOT),
                                   "HF_HUB_OFFLINE": "1"})

    ran = command("run", "--input", "in.jsonl", "--output", "out.h5", "--backend", "thread",
                  "--no-progress")
    assert ran.returncode == 0, ran.stderr
    exported = command("export", "out.h5", "--to", "parquet", "--output", "out.parquet")
    assert exported.returncode == 0, exported.stderr
    report = command("report", "out.h5")
    assert report.returncode == 2
    assert "needs matplotlib, which gpufeed's [report] extra installs: pip install " \
           "'gpufeed[report]'" in report.stderr
    notebooks = command("notebooks", "--params", "smoke")
    assert notebooks.returncode == 2 and "pip install 'gpufeed[notebooks]'" in notebooks.stderr
    onnx = command("run", "--input", "in.jsonl", "--output", "onnx.h5", "--backend", "thread",
                   "--no-progress", "--runtime", "onnx")
    assert onnx.returncode == 1 and "pip install 'gpufeed[onnx]'" in onnx.stderr
