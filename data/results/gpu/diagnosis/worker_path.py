"""Where does one pipeline worker lose to in-process encode on a card? (one-off diagnostic)"""
import json, os, subprocess, sys, tempfile, threading, time
from pathlib import Path
sys.path.insert(0, os.getcwd())
OUT = Path(os.environ.get("OUT", "/tmp/diag-out")); OUT.mkdir(parents=True, exist_ok=True)
DEVICE = os.environ.get("DIAG_DEVICE", "cuda:0")
UNITS = tuple(int(u) for u in os.environ.get("DIAG_UNITS", "4096,256,4096").split(","))
PYSPY = os.environ.get("PYSPY", "py-spy")
N = int(os.environ.get("DIAG_N", "40000"))
from helpers.bench.gpu.weights import build
from helpers.bench.gpu import study, check
from helpers.engine.contract.devices import available_cores
log = []
def main():
    def say(**row):
        print(json.dumps(row), flush=True); log.append(row)
        (OUT / "diag.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    scratch = Path(tempfile.mkdtemp())
    model_dir = str(build(Path("build/gpu/model"), scratch / "model"))
    workload = check._study_workload(model_dir, DEVICE)
    pairs = study.corpus(N); texts = [t for _, t in pairs]
    # A. in process, workunits of 4096 and of 256
    model = workload.load(DEVICE, available_cores())
    workload.process(model, texts[:4096]); workload.phases(model)
    for unit in UNITS:
        t0 = time.perf_counter(); c0 = time.process_time(); ph = {}
        for k in range(0, N, unit):
            workload.process(model, texts[k:k + unit])
            for p, s in (workload.phases(model) or {}).items(): ph[p] = ph.get(p, 0) + s
        w = time.perf_counter() - t0
        say(case="in_process", unit=unit, texts_per_s=N / w, wall_s=w, cpu_s=time.process_time() - c0, **ph)
    import torch; del model; torch.cuda.empty_cache()
    # B. the pool, one worker
    from helpers.engine.pipeline import WorkerPool
    with WorkerPool(workload, [DEVICE], workers_per_device=1, progress=False) as pool:
        for unit, profile in ((4096, False), ("auto", False), ("auto", True), (256, False)):
            out = scratch / f"out-{unit}-{profile}.h5"
            if profile:
                def record():
                    time.sleep(4)
                    pid = next(iter(pool.pids.values()))
                    for opts, name in ((["--idle"], "idle"), ([], "busy")):
                        r = subprocess.run([PYSPY, "record", "-p", str(pid), "-d", "6", "-r", "200",
                                            "-f", "raw", "-o", str(OUT / f"worker-{name}.txt"), *opts],
                                           capture_output=True, text=True)
                        say(case="py-spy", what=name, rc=r.returncode, err=r.stderr[-500:])
                    r = subprocess.run([PYSPY, "dump", "-p", str(pid)], capture_output=True, text=True)
                    (OUT / "worker-dump.txt").write_text(r.stdout + r.stderr)
                th = threading.Thread(target=record); th.start()
            stats = pool.run(pairs if not profile else study.corpus(2 * N), out, workunit_size=unit)
            if profile: th.join()
            say(case="pool", unit=unit, profiled=profile, texts_per_s=stats.records_per_second,
                wall_s=stats.wall_seconds, workunits=sum(w.workunits for w in stats.workers), worker_cpu_s=sum(w.cpu_seconds or 0 for w in stats.workers), busy_s=sum(w.busy_seconds for w in stats.workers),
                longest_wait_s=stats.longest_idle_seconds, **{f"{p}_s": s for p, s in stats.phases.items()},
                counts={k: v for k, v in stats.counts.items()})
    say(case="done")

if __name__ == "__main__":
    main()
