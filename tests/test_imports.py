"""What imports what: three floors (engine, workloads, study), each importing only the floors below
it; no circle among helpers' modules; a worker process loads the worker loop and its workload, not
the parent's engine (h5py, pandas, the scheduler, the writer)."""
import ast
import functools
import subprocess
import sys
from pathlib import Path

from helpers.study.paths import ROOT

PARENT_ONLY = ["h5py", "pandas", "helpers.engine.dispatch.scheduler", "helpers.engine.pipeline",
               "helpers.engine.pool", "helpers.engine.job", "helpers.engine.dispatch.taker",
               "helpers.engine.outputs.hdf5_sink", "helpers.engine.outputs.checkpoint",
               "helpers.engine.dispatch.reader", "helpers.cli"]
FLOORS = ("helpers.engine", "helpers.workloads", "helpers.study")  # bottom to top
ON_TOP = ("helpers", "helpers.__main__", "helpers.cli", "helpers.tuner", "helpers.bench",
          "helpers.embed")  # may import any floor
WORKLOAD_SEES = {"helpers.engine.contract.protocol"}  # all of the engine a workload may import
# the engine's rooms, each with the rooms it may import besides itself (as its __init__ says)
ROOMS = {"contract": set(), "measure": {"contract"}, "inputs": {"contract"}, "outputs": {"contract"},
         "workers": {"contract", "outputs"}, "dispatch": {"contract", "measure", "workers"}}
ENGINE_TOP = {"helpers.engine", "helpers.engine.pipeline", "helpers.engine.pool",
              "helpers.engine.job"}  # may import any room


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
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


def floor(module):
    """0, 1, 2 for the engine, the workloads, the study; 3 for what stands on them."""
    for number, package in enumerate(FLOORS):
        if module == package or module.startswith(package + "."):
            return number
    assert module in ON_TOP or module.startswith("helpers.bench."), \
        f"{module} is on no floor: put it in {', '.join(FLOORS)}, or on top ({', '.join(ON_TOP)})"
    return len(FLOORS)


def upward(graph):
    return sorted(f"{module} -> {dep}" for module, deps in graph.items() for dep in deps
                  if floor(dep) > floor(module))


def beyond_the_protocol(graph):
    return sorted(f"{module} -> {dep}" for module, deps in graph.items() if floor(module) == 1
                  for dep in deps if floor(dep) == 0 and dep not in WORKLOAD_SEES)


def test_each_floor_imports_only_the_floors_below_it():
    found = upward(import_graph())
    assert not found, "imports that run upward:\n" + "\n".join(found)


def test_a_workload_imports_the_engine_s_protocol_and_nothing_else_of_it():
    found = beyond_the_protocol(import_graph())
    assert not found, "workloads reaching into the engine:\n" + "\n".join(found)


def test_the_floor_rules_catch_what_they_are_about():
    graph = import_graph()
    # the walk sees imports
    assert "helpers.engine.contract.protocol" in graph["helpers.workloads.embedding.workload"]
    assert "helpers.engine.dispatch.scheduler" in graph["helpers.engine.pipeline"]
    # the engine knowing a workload
    wrong = {"helpers.engine.workers.worker": {"helpers.workloads.synthetic"},
             # a workload writing
             "helpers.workloads.embedding": {"helpers.engine.outputs.hdf5_sink"},
             "helpers.engine.detector": {"helpers.study.paths"},  # model code knowing the checkout
             "helpers.study.plots": {"helpers.engine.measure.stats"}}  # fine: downward
    assert upward(wrong) == ["helpers.engine.detector -> helpers.study.paths",
                             "helpers.engine.workers.worker -> helpers.workloads.synthetic"]
    assert beyond_the_protocol(wrong) == [
        "helpers.workloads.embedding -> helpers.engine.outputs.hdf5_sink"]


def room(module):
    """The engine room ``module`` is in (None for the engine's top)."""
    if module in ENGINE_TOP:
        return None
    name = module.removeprefix("helpers.engine.").split(".")[0]
    assert name in ROOMS, f"{module} is in no room of the engine: put it in one of {sorted(ROOMS)}"
    return name


def across_rooms(graph):
    return sorted(f"{module} -> {dep}" for module, deps in graph.items()
                  if module.startswith("helpers.engine.") and room(module) is not None
                  for dep in deps if dep.startswith("helpers.engine")
                  and room(dep) not in ROOMS[room(module)] | {room(module)})


def test_each_room_of_the_engine_imports_only_the_rooms_it_names():
    found = across_rooms(import_graph())
    assert not found, "imports between rooms that their __init__ does not allow:\n" + \
        "\n".join(found)


def test_the_room_rules_catch_what_they_are_about():
    assert "helpers.engine.workers.backends" in \
        import_graph()["helpers.engine.dispatch.scheduler"]  # the walk sees rooms
    wrong = {"helpers.engine.inputs.sources": {"helpers.engine.outputs.atomic"},  # inputs writing
             "helpers.engine.contract.messages": {"helpers.engine.dispatch.reader"},  # upward
             "helpers.engine.workers.worker": {"helpers.engine.outputs.checkpoint",  # allowed
                                               "helpers.engine.workers.transfer"},  # own room
             "helpers.engine.dispatch.scheduler": {"helpers.engine.pipeline"}}  # the top
    assert across_rooms(wrong) == [
        "helpers.engine.contract.messages -> helpers.engine.dispatch.reader",
        "helpers.engine.dispatch.scheduler -> helpers.engine.pipeline",
        "helpers.engine.inputs.sources -> helpers.engine.outputs.atomic"]


def test_each_room_s_docstring_names_its_modules_and_the_rooms_it_imports():
    import importlib

    for name, allowed in ROOMS.items():
        package = importlib.import_module(f"helpers.engine.{name}")
        folder = Path(package.__file__).parent
        modules = {p.stem for p in folder.glob("*.py")} - {"__init__"}
        assert modules, name
        assert {m for m in modules if f"``{m}``" not in package.__doc__} == set(), name
        said = package.__doc__.split("\n\n")[0]
        assert {r for r in ROOMS if f"``{r}``" in said} == allowed, name


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


def test_a_worker_process_imports_the_worker_loop_and_its_workload_only():
    # what a spawned worker imports: the main module again (python -m helpers), the worker loop,
    # the workload's module when its pickle is loaded
    code = ("import sys, helpers.__main__, helpers.engine.workers.worker, "
            "helpers.workloads.synthetic, helpers.workloads.embedding, helpers.workloads.binning\n"
            f"print([m for m in {PARENT_ONLY!r} if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_the_process_and_thread_backends_never_import_ray(tmp_path):
    code = ("import sys\n"
            "from helpers.engine.pipeline import run_pipeline\n"
            "from helpers.workloads.synthetic import SyntheticWorkload\n"
            "if __name__ == '__main__':\n"
            "    for backend in ('process', 'thread'):\n"
            "        run_pipeline([(i, str(i)) for i in range(8)], SyntheticWorkload(0.0), "
            "['cpu'] * 2, 4, sys.argv[1] + backend + '.h5', backend, progress=False)\n"
            "    print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "no-ray-")],
                          capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


def test_the_public_names_are_there_when_asked_for():
    code = ("import sys, helpers\n"
            "assert 'helpers.engine.pipeline' not in sys.modules\n"
            "from helpers import run_pipeline, WorkerPool, EmbeddingWorkload, SyntheticWorkload, "
            "read_output, ImageFolderSource\n"
            "assert 'helpers.engine.pipeline' in sys.modules and callable(run_pipeline)\n"
            "assert sorted(helpers.__all__) == sorted(n for n in helpers.__all__ if "
            "getattr(helpers, n) is not None)\n"
            "try:\n    helpers.nothing\nexcept AttributeError as e:\n    print(e)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    assert "has no attribute 'nothing'" in done.stdout


def test_the_engine_s_docstring_names_every_one_of_its_rooms():
    import helpers.engine

    folder = Path(helpers.engine.__file__).parent
    rooms = {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
    assert rooms == set(ROOMS)
    modules = {p.stem for p in folder.glob("*.py")} - {"__init__"}
    assert {m for m in rooms | modules if f"``{m}``" not in helpers.engine.__doc__} == set()


def scheduler_reach_ins(sources):
    """``module:line expression`` for each use, in ``sources`` (module -> text), of a
    scheduler's attribute that is not one of its public methods or properties (its fields, its
    taker, anything private), and each assignment to one."""
    from helpers.engine.dispatch.scheduler import Scheduler

    allowed = {name for name, value in vars(Scheduler).items()
               if not name.startswith("_") and (callable(value) or isinstance(value, property))}

    def a_scheduler(node):
        name = node.id if isinstance(node, ast.Name) else \
            node.attr if isinstance(node, ast.Attribute) else ""
        return name.endswith("scheduler")

    return sorted(f"{module}:{node.lineno} {ast.unparse(node)}"
                  for module, text in sources.items() for node in ast.walk(ast.parse(text))
                  if isinstance(node, ast.Attribute) and a_scheduler(node.value)
                  and (node.attr not in allowed or not isinstance(node.ctx, ast.Load)))


def test_nothing_outside_dispatch_touches_the_scheduler_but_through_its_methods():
    sources = {module_name(p): p.read_text() for p in (ROOT / "helpers").rglob("*.py")
               if not module_name(p).startswith("helpers.engine.dispatch")}
    found = scheduler_reach_ins(sources)
    assert not found, "reaching into the scheduler:\n" + "\n".join(found)


def test_the_reach_in_rule_catches_what_it_is_about():
    found = scheduler_reach_ins({"m": "scheduler.dispatch(feed)\n"
                                      "self._scheduler.slots[0].ready\n"
                                      "scheduler.pending.append(unit)\n"
                                      "self._scheduler.dispatches = None\n"
                                      "job.scheduler._kill(slot)\n"
                                      "scheduler.taker.cap(0, 1)\n"
                                      "schedule.pending\n"})
    assert found == ["m:3 scheduler.pending", "m:4 self._scheduler.dispatches",
                     "m:5 job.scheduler._kill", "m:6 scheduler.taker"]


def test_no_class_of_the_engine_is_over_250_lines():
    """A class a newcomer can read whole: the engine's split where one grew past it (the
    scheduler into its taker and its failures, the pool and its job each in a module)."""
    long = sorted(f"{module_name(p)}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
                  for p in (ROOT / "helpers" / "engine").rglob("*.py")
                  for node in ast.walk(ast.parse(p.read_text()))
                  if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno >= 250)
    assert not long, "\n".join(long)
