"""``python -m helpers.bench COMMAND``: overhead, failures, scale, autotune, ray, sources, dispatch,
prefetch, joins, runtimes, feed, gpu (each command's ``--help`` says what it measures)."""
from __future__ import annotations

import argparse
import json
import os
import sys

from helpers.bench import (autotune, dispatch, failures, feed, joins, overhead, prefetch,
                           ray_backend, runtimes, scale, sources)
from helpers.bench.gpu import check as gpu_check
from helpers.bench.gpu import report as gpu_report


def _per_message(value: str) -> int | str:
    """--units-per-message: a count, or "auto" (PoolSettings validates it)."""
    return value if value == "auto" else int(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.bench")
    commands = parser.add_subparsers(dest="command", required=True)
    cmd = commands.add_parser("overhead", help=overhead.__doc__.splitlines()[0])
    cmd.add_argument("--records", type=int, default=1024, help="sample texts, cut into blocks")
    cmd.add_argument("--block", type=int, default=128, help="texts per round")
    cmd.add_argument("--rounds", type=int, default=24)
    cmd.add_argument("--batch-size", type=int, default=16)
    cmd.add_argument("--workunit-size", type=int, default=64)
    cmd.add_argument("--threads", type=int, help="CPU threads for each (default: all cores)")
    cost = commands.add_parser("failures", help=failures.__doc__.splitlines()[0])
    cost.add_argument("--records", type=int, default=600, help="texts for the embedding runs")
    cost.add_argument("--repeats", type=int, default=3)
    cost.add_argument("--results-dir", default="data/results/cpu",
                      help="where failure_costs.csv goes ('' to save nothing)")
    big = commands.add_parser("scale", help=scale.__doc__.splitlines()[0])
    big.add_argument("--records", type=int, default=scale.CORPUS)
    big.add_argument("--baseline-records", type=int, default=100_000,
                     help="the run whose driver RSS the full run is compared with (0: none)")
    big.add_argument("--kill-at", type=float, default=0.9,
                     help="SIGKILL a second run at this fraction, then resume it (0: no kill)")
    big.add_argument("--folder", help="where outputs are written (default: the temp folder)")
    big.add_argument("--results-dir", default="data/results/cpu",
                     help="where scale.csv goes ('' to save nothing)")
    tune = commands.add_parser("autotune", help=autotune.__doc__.splitlines()[0])
    tune.add_argument("--records", type=int, default=autotune.RECORDS)
    tune.add_argument("--repeats", type=int, default=3)
    tune.add_argument("--results-dir", default="data/results/cpu",
                      help="where autotune_bench.csv goes ('' to save nothing)")
    on_ray = commands.add_parser("ray", help=ray_backend.__doc__.splitlines()[0])
    on_ray.add_argument("--records", type=int, default=400, help="texts per embedding job")
    on_ray.add_argument("--repeats", type=int, default=5)
    on_ray.add_argument("--results-dir", default="data/results/cpu",
                        help="where ray_bench_*.csv go ('' to save nothing)")
    data = commands.add_parser("sources", help=sources.__doc__.splitlines()[0])
    data.add_argument("--read-records", type=int, default=2_000_000, help="rows per format read")
    data.add_argument("--records", type=int, default=2_000_000, help="rows of the end-to-end run")
    data.add_argument("--baseline-records", type=int, default=100_000,
                      help="the run whose driver RSS the end-to-end run is compared with (0: none)")
    data.add_argument("--repeats", type=int, default=3)
    data.add_argument("--folder", help="where the corpora are written (default: the temp folder)")
    data.add_argument("--results-dir", default="data/results/cpu",
                      help="where sources_bench.csv goes ('' to save nothing)")
    data_one = commands.add_parser("sources-run", help="one end-to-end run of `sources`")
    data_one.add_argument("--input", required=True)
    data_one.add_argument("--output", required=True)
    data_one.add_argument("--no-keys", action="store_true", help="ids the row numbers, no keys")
    for command in (data, data_one):
        command.add_argument("--workers", type=int, default=2)
        command.add_argument("--workunit-size", type=int, default=4096)
    ceiling = commands.add_parser("dispatch", help=dispatch.__doc__.splitlines()[0])
    ceiling.add_argument("--units", type=int, default=20_000, help="workunits per run")
    ceiling.add_argument("--repeats", type=int, default=3)
    ceiling.add_argument("--results-dir", default="data/results/cpu",
                         help="where dispatch_bench.csv goes ('' to save nothing)")
    ceiling_one = commands.add_parser("dispatch-run", help="one run of `dispatch`")
    ceiling_one.add_argument("--units", type=int, required=True)
    ceiling_one.add_argument("--writes", choices=dispatch.WRITES, required=True)
    ceiling_one.add_argument("--output", required=True)
    ceiling_one.add_argument("--units-per-message", type=_per_message, default=1)
    for command in (ceiling, ceiling_one):
        command.add_argument("--backend", choices=("process", "ray"), default="process",
                             help="ray: actors on a local Ray each run starts")
    ahead = commands.add_parser("prefetch", help=prefetch.__doc__.splitlines()[0])
    ahead.add_argument("--rounds", type=int, default=5, help="jobs of each setting, alternating")
    ahead.add_argument("--records", type=int, default=40_000)
    ahead.add_argument("--unit-records", type=int, default=64, help="the fixed workunit size")
    ahead.add_argument("--unit-seconds", type=float, default=0.002,
                       help="the simulated card's time a workunit")
    ahead.add_argument("--results-dir", default="data/results/cpu",
                       help="where prefetch_bench.csv goes ('' to save nothing)")
    joined = commands.add_parser("joins", help=joins.__doc__.splitlines()[0])
    joined.add_argument("--rounds", type=int, default=5, help="jobs of each setting, alternating")
    joined.add_argument("--records", type=int, default=600_000)
    joined.add_argument("--record-seconds", type=float, default=20e-6,
                        help="the simulated card's time a record")
    joined.add_argument("--unit-seconds", type=float, nargs="+", default=joins.UNIT_SECONDS,
                        help="the simulated card's time a workunit, beside its records' (a pool "
                             "for each)")
    joined.add_argument("--window", type=int, default=None,
                        help="records the reader orders at a time (sort_window; default: the "
                             "pool's, SORT_RECORDS or the largest workunit)")
    joined.add_argument("--results-dir", default="data/results/cpu",
                        help="where joins_bench.csv goes ('' to save nothing)")
    variants = commands.add_parser("runtimes", help=runtimes.__doc__.splitlines()[0])
    variants.add_argument("--records", type=int, default=512, help="sample paragraphs a round")
    variants.add_argument("--repeats", type=int, default=5)
    variants.add_argument("--batch-size", type=int, default=16)
    variants.add_argument("--results-dir", default="data/results/cpu",
                          help="where runtimes_bench.csv and encode_options_bench.csv go ('' "
                               "to save nothing)")
    variants.add_argument("--only", choices=("variants", "options"),
                          help="variants: the precisions and runtimes alone; options: encode's "
                               "options alone (lengths, stored precisions)")
    fed = commands.add_parser("feed", help=feed.__doc__.splitlines()[0])
    fed.add_argument("--records", type=int, default=20_000, help="texts of each corpus a run")
    fed.add_argument("--repeats", type=int, default=3)
    fed.add_argument("--batch-size", type=int, default=128)
    fed.add_argument("--workunit-size", type=int, default=1024)
    fed.add_argument("--results-dir", default="data/results/cpu",
                     help="where feed_bench.csv goes ('' to save nothing)")
    one = commands.add_parser("scale-run", help="one run of `scale`, in this process")
    one.add_argument("--records", type=int, required=True)
    one.add_argument("--output", required=True)
    one.add_argument("--resume", action="store_true")
    one.add_argument("--corpus", help="read the first --records rows of this file (Parquet, JSONL)")
    big.add_argument("--source", choices=("cycled", *scale.WRITERS), default="cycled",
                     help="parquet, jsonl, csv: the records written as such a file first, read "
                          "from it")
    for command in (big, one):
        command.add_argument("--workers", type=int, default=max(2, os.cpu_count() or 2),
                             help="zero-cost workers (default: one per core, at least 2)")
        command.add_argument("--workunit-size", type=int, default=4096)
        command.add_argument("--dim", type=int, default=384)
        command.add_argument("--backend", choices=("process", "thread", "ray"), default="process",
                             help="ray: actors on a local Ray each run starts")
        command.add_argument("--writes", choices=("driver", "workers"), default="driver",
                             help="who writes the rows (JobSettings.writes)")
        command.add_argument("--units-per-message", type=_per_message, default="auto",
                             help="workunits a message to a worker (PoolSettings."
                                  "units_per_message; auto: 4 on Ray, else 1, more for short "
                                  "workunits)")
    card = commands.add_parser("gpu", help="the GPU check: one call on a lent card "
                                           "(helpers.bench.gpu)")
    mode = card.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", help="run the check; its tables go into this folder")
    mode.add_argument("--plan", action="store_true",
                      help="prepare what a device call carries; print its size and the call")
    mode.add_argument("--report", metavar="PATH",
                      help="a check's tables (a folder, or the call's .tgz): copied into "
                           "--results-dir, drawn into --figures-dir, summarised")
    card.add_argument("--dry-run", action="store_true",
                      help="every section with tiny sizes, on the CPU where there is no card")
    card.add_argument("--budget", type=float, default=gpu_check.BUDGET_SECONDS,
                      help="seconds the check may take (its study is cut to fit)")
    card.add_argument("--results-dir", default=gpu_report.RESULTS_DIR)
    card.add_argument("--figures-dir", default=gpu_report.FIGURES_DIR)
    args = parser.parse_args(argv)
    if args.command == "gpu":
        return _gpu(args)
    if args.command == "failures":
        failures.main(args.records, args.repeats, args.results_dir)
        return 0
    if args.command == "scale":
        scale.main(args.records, args.workers, args.workunit_size, args.dim,
                   args.baseline_records, args.kill_at or None, args.folder, args.results_dir,
                   args.backend, args.writes, args.source, args.units_per_message)
        return 0
    if args.command == "autotune":
        autotune.main(args.records, args.repeats, args.results_dir)
        return 0
    if args.command == "ray":
        ray_backend.main(args.records, args.repeats, args.results_dir)
        return 0
    if args.command == "sources":
        sources.main(args.read_records, args.records, args.baseline_records, args.repeats,
                     args.workers, args.workunit_size, args.folder, args.results_dir)
        return 0
    if args.command == "sources-run":
        print(json.dumps(sources.run_once(args.input, args.output, args.workers,
                                          args.workunit_size, not args.no_keys)))
        return 0
    if args.command == "dispatch":
        dispatch.main(args.units, args.repeats, args.results_dir, args.backend)
        return 0
    if args.command == "dispatch-run":
        print(json.dumps(dispatch.run_once(args.units, args.writes, args.output,
                                           args.units_per_message, args.backend)))
        return 0
    if args.command == "prefetch":
        prefetch.main(args.rounds, args.records, args.unit_records, args.unit_seconds,
                      args.results_dir)
        return 0
    if args.command == "joins":
        joins.main(args.rounds, args.records, args.record_seconds, tuple(args.unit_seconds),
                   args.window, args.results_dir)
        return 0
    if args.command == "feed":
        feed.main(args.records, args.repeats, args.batch_size, args.workunit_size,
                  args.results_dir)
        return 0
    if args.command == "runtimes":
        runtimes.main(args.records, args.repeats, args.batch_size, args.results_dir, args.only)
        return 0
    if args.command == "scale-run":
        print(json.dumps(scale.run_once(args.records, args.output, args.workers,
                                        args.workunit_size, args.dim, args.resume,
                                        args.backend, args.writes, args.corpus,
                                        args.units_per_message)))
        return 0
    overhead.report(*overhead.measure(args.records, args.block, args.rounds, args.batch_size,
                                      args.workunit_size, args.threads))
    return 0


def _gpu(args: argparse.Namespace) -> int:
    if args.plan:
        from helpers.bench.gpu.plan import plan

        print(plan())
    elif args.report:
        gpu_report.ingest(args.report, args.results_dir, args.figures_dir)
    else:
        gpu_check.run(args.out, args.dry_run, args.budget)
    return 0


if __name__ == "__main__":
    sys.exit(main())
