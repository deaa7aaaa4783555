"""``python -m helpers.bench overhead|failures [--records N] [--repeats N] ...``"""
from __future__ import annotations

import argparse
import sys

from helpers.bench import failures, overhead


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.bench")
    commands = parser.add_subparsers(dest="command", required=True)
    cmd = commands.add_parser("overhead", help=overhead.__doc__.splitlines()[0])
    cmd.add_argument("--records", type=int, default=1000)
    cmd.add_argument("--repeats", type=int, default=3)
    cmd.add_argument("--batch-size", type=int, default=32)
    cmd.add_argument("--workunit-size", type=int, default=100)
    cmd.add_argument("--threads", type=int, help="CPU threads for both (default: all cores)")
    cost = commands.add_parser("failures", help=failures.__doc__.splitlines()[0])
    cost.add_argument("--records", type=int, default=600, help="texts for the embedding runs")
    cost.add_argument("--repeats", type=int, default=3)
    cost.add_argument("--results-dir", default="data/results/cpu",
                      help="where failure_costs.csv goes ('' to save nothing)")
    args = parser.parse_args(argv)
    if args.command == "failures":
        failures.main(args.records, args.repeats, args.results_dir)
        return 0
    rows = overhead.measure(args.records, args.repeats, args.batch_size, args.workunit_size,
                            args.threads)
    overhead.report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
