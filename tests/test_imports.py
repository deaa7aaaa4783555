"""What imports what: no circle among helpers' modules, and a worker process loads the worker loop
and its workload, not the parent's engine (h5py, pandas, the scheduler, the writer)."""
import ast
import subprocess
import sys

from helpers.paths import ROOT

PARENT_ONLY = ["h5py", "pandas", "helpers.scheduler", "helpers.pipeline", "helpers.hdf5_sink",
               "helpers.checkpoint", "helpers.reader", "helpers.cli"]


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph():
    """Module -> the helpers modules it imports anywhere in its text (lazy imports included)."""
    modules = {module_name(p): p for p in (ROOT / "helpers").rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module in modules:
                found.add(node.module)
                found |= {f"{node.module}.{a.name}" for a in node.names} & set(modules)
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names} & set(modules)
        graph[name] = found - {name, "helpers"}  # the package itself only hands out names
    return graph


def test_no_module_of_helpers_imports_itself_through_others():
    graph, state, circles = import_graph(), {}, []

    def visit(name, path):
        state[name] = "open"
        for dep in sorted(graph[name]):
            if state.get(dep) == "open":
                circles.append(" -> ".join(path[path.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, path + [dep])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles
    assert "helpers.images" not in graph["helpers.sources"]  # the circle there once was


def test_a_worker_process_imports_the_worker_loop_and_its_workload_only():
    # what a spawned worker imports: the main module again (python -m helpers), the worker loop,
    # the workload's module when its pickle is loaded
    code = ("import sys, helpers.__main__, helpers.worker, helpers.workloads.synthetic, "
            "helpers.workloads.embedding, helpers.workloads.binning\n"
            f"print([m for m in {PARENT_ONLY!r} if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_the_public_names_are_there_when_asked_for():
    code = ("import sys, helpers\n"
            "assert 'helpers.pipeline' not in sys.modules\n"
            "from helpers import run_pipeline, WorkerPool, EmbeddingWorkload, SyntheticWorkload, "
            "read_output, ImageFolderSource\n"
            "assert 'helpers.pipeline' in sys.modules and callable(run_pipeline)\n"
            "assert sorted(helpers.__all__) == sorted(n for n in helpers.__all__ if "
            "getattr(helpers, n) is not None)\n"
            "try:\n    helpers.nothing\nexcept AttributeError as e:\n    print(e)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    assert "has no attribute 'nothing'" in done.stdout
