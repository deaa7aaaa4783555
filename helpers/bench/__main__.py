"""``python -m helpers.bench overhead [--records N] [--repeats N] ...``"""
from __future__ import annotations

import argparse
import sys

from helpers.bench import overhead


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.bench")
    commands = parser.add_subparsers(dest="command", required=True)
    cmd = commands.add_parser("overhead", help=overhead.__doc__.splitlines()[0])
    cmd.add_argument("--records", type=int, default=1000)
    cmd.add_argument("--repeats", type=int, default=3)
    cmd.add_argument("--batch-size", type=int, default=32)
    cmd.add_argument("--workunit-size", type=int, default=100)
    cmd.add_argument("--threads", type=int, help="CPU threads for both (default: all cores)")
    args = parser.parse_args(argv)
    rows = overhead.measure(args.records, args.repeats, args.batch_size, args.workunit_size,
                            args.threads)
    overhead.report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
