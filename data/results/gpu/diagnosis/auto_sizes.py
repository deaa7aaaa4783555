"""Why did one worker's auto workunits stay ~100 records on a card? Log every Sizing.observe."""
import json, os, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, os.getcwd())
OUT = Path(os.environ.get("OUT", "/tmp/diag-out")); OUT.mkdir(parents=True, exist_ok=True)
DEVICE = os.environ.get("DIAG_DEVICE", "cuda:0")
N = int(os.environ.get("DIAG_N", "30000"))
from helpers.bench.gpu.weights import build
from helpers.bench.gpu import study, check
from helpers.engine.measure import sizing
seen = []
original = sizing.Sizing.observe
def observe(self, slot, records, seconds):
    original(self, slot, records, seconds)
    seen.append({"job": JOB[0], "slot": slot, "records": records, "seconds": seconds,
                 "target": self.targets.get(slot), "fixed": self.fixed.get(slot),
                 "rate": self.rates.get(slot), "t": time.monotonic()})
sizing.Sizing.observe = observe
JOB = [""]
def main():
    scratch = Path(tempfile.mkdtemp())
    model_dir = str(build(Path("build/gpu/model"), scratch / "model"))
    workload = check._study_workload(model_dir, DEVICE)
    pairs = study.corpus(N)
    from helpers.engine.pipeline import WorkerPool
    rows = []
    with WorkerPool(workload, [DEVICE], workers_per_device=1, progress=False) as pool:
        for k, unit in enumerate(("auto", 4096, "auto", "auto")):
            JOB[0] = f"{k}-{unit}"
            stats = pool.run(pairs, scratch / f"o{k}.h5", workunit_size=unit)
            rows.append({"job": JOB[0], "texts_per_s": stats.records_per_second,
                         "workunits": sum(w.workunits for w in stats.workers),
                         "wall_s": stats.wall_seconds})
            print(json.dumps(rows[-1]), flush=True)
            (OUT / "jobs.json").write_text(json.dumps(rows))
            (OUT / "observed.json").write_text(json.dumps(seen))
if __name__ == "__main__":
    main()
