"""helpers.engine.workers.preload: the modules a workload names, imported by the process
backend's fork server once; one that cannot be imported is left to the worker's own load."""
import importlib
import os
import subprocess
import sys
from pathlib import Path

from helpers.engine.workers.backends import START_METHOD_ENV


def test_preload_imports_what_it_can_and_passes_over_what_raises(tmp_path, monkeypatch):
    from helpers.engine.workers.preload import preload  # (imports nothing: the env names none)

    (tmp_path / "gpufeed_boom.py").write_text("raise RuntimeError('not importable here')\n")
    (tmp_path / "gpufeed_fine.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("gpufeed_boom", "gpufeed_fine", "gpufeed_missing"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    preload(" gpufeed_boom, gpufeed_missing,, gpufeed_fine ")
    assert "gpufeed_fine" in sys.modules and "gpufeed_boom" not in sys.modules
    assert importlib.import_module("gpufeed_fine").VALUE == 7


BOOMING = """
from helpers.engine.pipeline import WorkerPool
from helpers.workloads import SyntheticWorkload

class Booming(SyntheticWorkload):
    imports = "boom"  # (one name as a string)

    def load(self, device, threads):
        import boom
        return super().load(device, threads)

if __name__ == "__main__":
    with WorkerPool(Booming(0.0), ["cpu"], "process", progress=False):
        pass
"""


def test_a_module_the_fork_server_cannot_import_is_its_worker_s_error_not_the_server_s_end(
        tmp_path):
    """multiprocessing's preload ends the server at any error but ImportError (every start then
    fails with a bare EOFError): helpers.engine.workers.preload leaves the module to the worker's
    load."""
    root = str(Path(__file__).resolve().parents[1])
    (tmp_path / "boom.py").write_text("raise RuntimeError('boom: not importable here')\n")
    (tmp_path / "script.py").write_text(BOOMING)
    done = subprocess.run([sys.executable, str(tmp_path / "script.py")], capture_output=True,
                          text=True, timeout=100, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": root, START_METHOD_ENV: "forkserver"})
    assert done.returncode == 1
    assert "worker 0 on cpu failed in loading the model: RuntimeError: boom: not importable " \
        "here" in done.stderr and "EOFError" not in done.stderr
