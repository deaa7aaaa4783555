"""``python -m helpers run ...``: the pipeline from the shell; the stats are the last line, as JSON.
``python -m helpers run --workload binning --input images/ --output out.h5``: also writes out.csv.
``python -m helpers tune --input big.jsonl --output tuned.yaml``: the fastest configuration on a
sample (helpers.tuner); ``python -m helpers run --config tuned.yaml ...`` runs it.
``python -m helpers notebooks --params cpu``: the notebook suite, headless (see
helpers.study.notebooks). ``python -m helpers compact out.h5``: a big run's output (an index over
its parts) as one file. ``python -m helpers export out.h5 --to parquet --output out.parquet``: for
other tools (also npy).

Exit status: 0 done, 1 failed (a model that does not load, every worker gone, a full disk), 2 bad
arguments or input (no such input, a format gpufeed does not read, a column that is not there, files
that disagree on a column's type; an output that is not this run's to write: another run holds
it, it exists and neither --resume nor --overwrite was given, it is the input, or gpufeed did not
write it; a --resume of another input or workload), 3 partial (the run finished but some records
are in the output's ``errors`` table), 130 interrupted (Ctrl-C or SIGTERM: every worker is
stopped; the output holds the records written so far, and ``--resume`` finishes the run). Workers
that die or hang are replaced and their workunits retried; what happened is logged to stderr.
"""
from __future__ import annotations

import argparse
import difflib
import json
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from helpers import tuner
from helpers.engine.contract.fingerprint import InputChanged
from helpers.engine.contract.protocol import ExtraMissing, needs
from helpers.engine.contract.settings import (AUTO, BACKENDS, FIT, MAX_UNITS_PER_MESSAGE,
                                              MESSAGE_SECONDS, RAY_UNITS_PER_MESSAGE, WRITES,
                                              JobSettings, PoolSettings, or_words)
from helpers.engine.inputs.sources import ImageFolderSource, open_source
from helpers.engine.outputs.hdf5_sink import check_parts, read_output
from helpers.engine.outputs.ownership import Claim, OutputError, output_path, owning
from helpers.engine.pipeline import STRATEGIES, PipelineError, run_pipeline
from helpers.workloads import WORKLOADS, make_workload
from helpers.workloads.binning import DEFAULT_PROMPTS, BinningWorkload, Thresholds
from helpers.workloads.binning.table import is_table, write_csv
from helpers.workloads.embedding.cards.simulated import CARDS
from helpers.workloads.embedding import TASKS, EmbeddingWorkload
from helpers.workloads.embedding.runtimes import PRECISIONS, RUNTIMES
from helpers.workloads.embedding.stored import CALIBRATED, STORED
from helpers.workloads.synthetic import MODES, SyntheticWorkload

CALIBRATION_ROWS = 1_000  # texts stored int8 / uint8 is calibrated on, by default (the input's
# first: sentence-transformers warns under 100)
EXIT_FAILED, EXIT_USAGE, EXIT_PARTIAL, EXIT_INTERRUPTED = 1, 2, 3, 130
EXIT_STATUS = ("exit status: 0 done, 1 failed, 2 a bad argument or input, 3 partial (some records "
               "are in the output's errors table), 130 interrupted (--resume finishes it)")


def _speeds(text: str) -> dict[str, float]:
    """``cuda:0=1,cuda:1=0.35`` -> {"cuda:0": 1.0, "cuda:1": 0.35}."""
    try:
        return {k.strip(): float(v) for k, v in (item.split("=") for item in text.split(","))}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected DEVICE=FACTOR[,DEVICE=FACTOR...], got {text!r}")


def _counts(text: str) -> tuple[int, ...]:
    """An argparse type: whole numbers separated by commas."""
    try:
        return tuple(int(item) for item in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 16,32,64, got {text!r}")


def _count_or(*words: str) -> Any:
    """An argparse type: a whole number, or one of ``words`` (any case)."""
    def parse(text: str) -> int | str:
        if text.strip().lower() in words:
            return text.strip().lower()
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {or_words(['a whole number', *map(repr, words)])}, got {text!r}")
    return parse


_count_or_auto, _workers_per_device = _count_or(AUTO), _count_or(AUTO, FIT)


def _names(text: str) -> list[str]:
    """``a,b`` -> ["a", "b"]: the columns ``--keep-columns`` (and tuned.yaml) names."""
    return [c for c in text.split(",") if c]


def _flag(text: str) -> bool:
    """A tuned.yaml's true or false."""
    if text.strip().lower() in ("true", "false"):
        return text.strip().lower() == "true"
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


class _Help(argparse.RawDescriptionHelpFormatter):
    """Each option's default after its help, where it has one worth saying."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default  # (1 == True: a bool is told apart by its type)
        if action.option_strings and "%(default)" not in text and default is not None and \
                not isinstance(default, bool) and default not in ([], {}, (), "", argparse.SUPPRESS):
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    """A command's parser as argparse users expect: no abbreviated flags (``--text-colum`` is not
    ``--text-column``), and an unknown flag refused by the command it was given to, with its
    usage and the flags it most looks like."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if self._subparsers is None:  # a command's: an unknown flag refused here, first (not
            # above, nor after a required flag it may be the misspelling of)
            flags = [f for f in self._option_string_actions if f.startswith("--")]
            given = sys.argv[1:] if args is None else list(args)
            unknown = [a for a in given if a.startswith("--") and a.split("=")[0] not in flags]
            if unknown:
                near = difflib.get_close_matches(unknown[0].split("=")[0], flags, n=3,
                                                 cutoff=0.6)
                self.error(f"unrecognized arguments: {' '.join(unknown)}" +
                           (f" (did you mean {or_words(near)}?)" if near else ""))
        return super().parse_known_args(args, namespace)


def _prog() -> str:
    return "gpufeed" if Path(sys.argv[0]).name == "gpufeed" else "python -m helpers"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpufeed")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _common_arguments(shared: argparse.ArgumentParser, devices: str
                      ) -> tuple[Any, Any]:
    """What run and tune share, first: the input and its columns, the workload, the devices
    (default ``devices``), the backend; the two groups, for the command's own options."""
    inputs = shared.add_argument_group("input")
    layout = shared.add_argument_group("devices and layout")
    inputs.add_argument("--input", required=True,
                        help="a Parquet, CSV/TSV, Arrow, .jsonl or .h5 (batches/0, 1, ...) "
                             "file, a folder or glob of tables; a folder of images for binning")
    shared.add_argument("--workload", choices=WORKLOADS, default="embedding",
                        help="what runs on each record (its options: the groups below)")
    layout.add_argument("--devices", default=devices,
                        help="one entry per worker, e.g. cuda:0,cuda:0,cpu or cuda:0*2,cpu; "
                             "'auto': every GPU here (else mps, else cpu), 'auto*2': two on each")
    layout.add_argument("--backend", choices=BACKENDS, default=PoolSettings.backend,
                        help="process: a process per worker; thread: threads sharing one "
                             "model per device; ray: a Ray actor per worker (pip install "
                             "'gpufeed[ray]')")
    inputs.add_argument("--text-column", "--text-field", dest="text_column", default="text",
                        help="the column (JSONL: field) holding the text")
    inputs.add_argument("--id-column", "--id-field", dest="id_column",
                        help="the column holding each record's id: integers are the ids; "
                             "strings come back under the column's name (ids: row numbers). "
                             "Default: row numbers (JSONL: its 'id' field if there)")
    inputs.add_argument("--keep-columns", type=_names,
                        default=[], metavar="A,B",
                        help="a table's other columns to carry to the output beside each row "
                             "(numbers, booleans, strings)")
    return inputs, layout


def _workload_groups(shared: argparse.ArgumentParser) -> None:
    """What run and tune share, last: each workload's own options, a group each."""
    emb = shared.add_argument_group("embedding workload (--workload embedding, the default)")
    emb.add_argument("--model", help="sentence-transformers name or path (default: embedded "
                                     "all-MiniLM-L6-v2, offline); binning: its similarity model")
    emb.add_argument("--batch-size", type=int, default=EmbeddingWorkload.batch_size,
                     help="texts per forward pass")
    emb.add_argument("--normalize", action="store_true", help="unit-length embeddings")
    emb.add_argument("--tokenize-ahead", action="store_true",
                     help="on encode's path (it puts the model there): tokenize the next batch "
                          "in a helper thread while one runs")
    emb.add_argument("--no-feeder", dest="feeder", action="store_false",
                     help="run the model through its own encode (the reference path) instead "
                          "of the feeder, which tokenizes each text once and feeds the model's "
                          "modules; a model the feeder cannot run takes encode's path anyway, "
                          "the run saying why")
    emb.add_argument("--no-word-cache", dest="word_cache", action="store_false",
                     help="the feeder tokenizes every text with the Rust tokenizer, not from "
                          "its cache of words (BERT WordPiece models: the same ids either way)")
    emb.add_argument("--precision", choices=PRECISIONS, default=EmbeddingWorkload.precision,
                     help="the model's precision, its weights cast: bf16, fp16 (CUDA only); "
                          "checked against fp32 first")
    emb.add_argument("--runtime", choices=RUNTIMES, default=EmbeddingWorkload.runtime,
                     help="onnx, onnx-int8 (CPU): the model exported once into GPUFEED_CACHE "
                          "and run by onnxruntime; checked against fp32 torch first")
    emb.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False,
                     help="torch.compile the transformer in each worker's load (runtime torch; "
                          "checked against eager fp32 first)")
    emb.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=False,
                     help="on CUDA: replay each batch's forward pass from a CUDA graph of its "
                          "padded shape, one launch instead of one a kernel (checked against "
                          "eager fp32 first; skipped on a CPU)")
    emb.add_argument("--unpadded", action=argparse.BooleanOptionalAction, default=False,
                     help="run the transformer on each batch's real tokens alone, attention "
                          "over each text's span (flash varlen attention on CUDA in fp16/bf16; "
                          "transformers' BertModel only; checked against eager fp32 first)")
    emb.add_argument("--no-pin-memory", dest="pin_memory", action="store_false",
                     help="on CUDA: copy tokenized batches from pageable memory, blocking")
    emb.add_argument("--prompt", action="append", dest="prompts", metavar="TEXT",
                     help="the text put before each record, as encode's prompt= ('query: '); "
                          "binning: a similarity prompt (repeat for several; default: a page "
                          "of text, a chart)")
    emb.add_argument("--prompt-name", help="one of the model's own prompts (its config's "
                                           "'prompts'), as encode's prompt_name=")
    emb.add_argument("--task", choices=TASKS,
                     help="as encode_query / encode_document: the model's prompt of that name "
                          "where it has one (default: the model's default prompt, if any)")
    emb.add_argument("--max-seq-length", type=int,
                     help="tokens read of each text (default: the model's own); fewer is "
                          "faster and changes the vectors of longer texts")
    emb.add_argument("--truncate-dim", type=int,
                     help="keep the first this many dimensions (a Matryoshka model), "
                          "normalized after the cut with --normalize")
    emb.add_argument("--stored", choices=STORED, default=EmbeddingWorkload.stored,
                     help="the precision the embeddings are stored in, as encode's "
                          "precision= (and float16): float16 halves the file, int8/uint8 "
                          "quarter it (cut with calibration ranges the output keeps), "
                          "binary/ubinary 1/32 (one bit a dimension)")
    emb.add_argument("--card", choices=tuple(CARDS),
                     help="a simulated card instead of the model's forward pass (the tokenizer "
                          "and all around it real, the embeddings zeros): does this CPU side "
                          "keep such a card busy? --devices are then labels (cuda:0*2: two "
                          "workers on one card)")
    emb.add_argument("--card-cores", type=int,
                     help="the simulated card scaled to this machine's cores from this many "
                          "a GPU on a real machine (16: one GPU, 16 cores)")
    emb.add_argument("--tokenize-threads", type=int,
                     help="the feeder's threads tokenizing ahead in each worker (default: "
                          "one on a CPU; on a GPU or a simulated card, processes: "
                          "--tokenize-processes, or one where a worker's share is one core)")
    emb.add_argument("--tokenize-processes", type=int,
                     help="the feeder's tokenizing processes in each worker, instead of "
                          "threads (the word cache runs in Python: processes scale it; "
                          "default on a GPU: the worker's share of the node's cores less one, "
                          "8 at most)")
    emb.add_argument("--batch-tokens", type=int,
                     help="the feeder's batches: as many texts as fit this many padded "
                          "tokens, at most --batch-size (default: --batch-size texts)")
    syn = shared.add_argument_group("synthetic workload (--workload synthetic: a model that "
                                    "costs a set time, for trying layouts)")
    syn.add_argument("--seconds-per-record", type=float,
                     default=SyntheticWorkload.seconds_per_record, help="its cost per record")
    syn.add_argument("--speed", type=_speeds, default={},
                     help="simulated devices' speed factors, e.g. cuda:0=1,cuda:1=0.35")
    syn.add_argument("--mode", choices=MODES, default=SyntheticWorkload.mode,
                     help="sleep: a device's wait (a GPU kernel); busy: spins a core")
    syn.add_argument("--seconds-per-workunit", type=float,
                     default=SyntheticWorkload.seconds_per_workunit,
                     help="a fixed cost per workunit (so that the size matters)")
    syn.add_argument("--parallelism", type=int, default=SyntheticWorkload.parallelism,
                     help="workunits a device runs at once (where k workers saturate it)")
    img = shared.add_argument_group("binning workload (--workload binning: images into A: "
                                    "text-rich, B: object-rich scenes, C: the rest)")
    for name, default in asdict(Thresholds()).items():
        img.add_argument("--" + name.replace("_", "-"), type=type(default), default=default,
                         help="a threshold of the binning rule")
    img.add_argument("--model-threads", type=int, default=BinningWorkload.threads,
                     help="intra-op threads per model")
    img.add_argument("--clip-model", help="transformers CLIP id: score the image, not the text")
    img.add_argument("--caption-model", help="transformers image-to-text id instead of the template")
    img.add_argument("--follow-symlinks", action="store_true",
                     help="read images through symbolic links too (skipped by default: a link "
                          "can lead anywhere the run may read)")


def build_parser(run_defaults: dict[str, Any] | None = None) -> argparse.ArgumentParser:
    """The command line; ``run_defaults`` (a tuned.yaml's fields) replace run's defaults, so that
    a flag given on the command line still wins."""
    parser = _Parser(
        prog=_prog(),
        description="Run a model over a big dataset and keep every device fed: run it, tune "
                    "its layout on a sample first, and read, compact or export what it wrote.",
        epilog=EXIT_STATUS)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=_Parser)
    run = commands.add_parser("run", formatter_class=_Help, epilog=EXIT_STATUS,
                              usage="%(prog)s --input INPUT --output OUTPUT [options]",
                              help="run a workload over an input file",
                              description="Run a workload over an input; the stats are the "
                                          "last line of stdout, as JSON.")
    inputs, layout = _common_arguments(run, ",".join(PoolSettings.devices))
    written = run.add_argument_group("output")
    safe = run.add_argument_group("failures and resuming")
    written.add_argument("--output", required=True,
                         help="the HDF5 file to write, .h5 or .hdf5 (export writes Parquet or "
                              "npy from it; binning: a CSV beside it)")
    run.add_argument("--config", help="a tuned.yaml (python -m helpers tune): its fields are the "
                                      "defaults; flags given here override them")
    layout.add_argument("--workers-per-device", type=_workers_per_device,
                     default=PoolSettings.workers_per_device,
                     help="workers on each entry of --devices; 'auto': one, then more while "
                          "they raise the device's measured rate; 'fit': as many as fit in its "
                          "memory, started before any work")
    layout.add_argument("--strategy", choices=STRATEGIES, default="queue",
                     help="queue: workers pull workunits; static: one even slice per worker")
    layout.add_argument("--workunit-size", type=_count_or_auto, default=JobSettings.workunit_size,
                     help="records per workunit; 'auto': sized per worker from its measured rate")
    layout.add_argument("--workunit-seconds", type=float, default=JobSettings.workunit_seconds,
                     help="--workunit-size auto: seconds a workunit should take on its worker")
    inputs.add_argument("--limit", type=int, help="stop after this many records")
    layout.add_argument("--queue-depth", type=int, help="workunits the reader queues, at most "
                                                     "(default: 2 per worker, times "
                                                     "--units-per-message, or what the workers "
                                                     "took in the last 0.1 s if more)")
    layout.add_argument("--units-per-message", type=_count_or_auto,
                     default=PoolSettings.units_per_message,
                     help="workunits sent to a worker in one message (on Ray, one call); "
                          f"auto: {RAY_UNITS_PER_MESSAGE} on Ray with a fixed --workunit-size, "
                          f"else 1, then more for a worker whose workunits take under "
                          f"{MESSAGE_SECONDS:g} s (about that much of its work a message, at "
                          f"most {MAX_UNITS_PER_MESSAGE})")
    layout.add_argument("--threads-per-worker", type=int, help="CPU threads per cpu worker")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    layout.add_argument("--ray-address", help="--backend ray: the cluster's head, e.g. "
                                           "10.0.0.1:6379 (default: $RAY_ADDRESS, else a local "
                                           "Ray started for the run)")
    safe.add_argument("--resume", action="store_true",
                      help="keep what OUTPUT holds (a killed or interrupted run) and do the rest; "
                           "refused if OUTPUT was made from another input or workload")
    safe.add_argument("--overwrite", action="store_true",
                      help="replace OUTPUT if it exists (without this or --resume, an existing "
                           "OUTPUT is refused)")
    written.add_argument("--ranges", metavar="NPY",
                         help="--stored int8 or uint8: the calibration ranges, a (2, dim) .npy "
                              "(the least and greatest value of each dimension; default: from "
                              "the input's first --calibration-rows texts, or on --resume the "
                              "output's own)")
    written.add_argument("--calibration-rows", type=int,
                         help=f"--stored int8 or uint8 without --ranges: texts to calibrate on, "
                              f"the input's first (default {CALIBRATION_ROWS:,}; a --resume "
                              f"keeps the output's own ranges)")
    safe.add_argument("--workunit-timeout", type=float,
                      help="seconds a workunit may run before its worker is killed and replaced")
    safe.add_argument("--retries", type=int, default=PoolSettings.retries,
                      help="times a failed workunit is retried before it is split")
    safe.add_argument("--max-restarts", type=int, default=PoolSettings.max_restarts,
                      help="replacements per worker")
    written.add_argument("--in-place", action="store_true",
                      help="deprecated, to be removed: writing in place was no faster than "
                           "crash-safe parts, which the run now writes as any run does (a "
                           "FutureWarning says so)")
    written.add_argument("--writes", choices=WRITES, default=JobSettings.writes,
                      help="who writes the rows: the driver's writer thread, or each worker its "
                           "own part files that the driver commits (the driver then reads none "
                           "of the rows; OUTPUT must be on storage every worker reaches); auto: "
                           "the workers on Ray when they can read the input by position (HDF5, "
                           "Parquet, Arrow, CSV/TSV, JSONL with line-number ids), else the "
                           "driver")
    layout.add_argument("--adaptive", action="store_true",
                      help="deprecated: the older name of --workers-per-device fit")
    layout.add_argument("--max-workers-per-device", type=int,
                      default=PoolSettings.max_workers_per_device,
                      help="the most workers --workers-per-device auto or fit puts on a "
                           "device")
    _workload_groups(run)
    run.set_defaults(**(run_defaults or {}))
    tune = commands.add_parser("tune", formatter_class=_Help, epilog=EXIT_STATUS,
                               usage="%(prog)s --input INPUT [--output tuned.yaml] [options]",
                               help="find the fastest configuration on a sample; write tuned.yaml",
                               description="Find the fastest configuration on a sample of the "
                                           "input, trial by trial; write it to tuned.yaml for "
                                           "run --config.")
    _common_arguments(tune, "auto")
    tune.add_argument("--output", default="tuned.yaml", help="the YAML file to write")
    tune.add_argument("--budget-seconds", type=float, default=tuner.BUDGET_SECONDS,
                      help="the tune's time: a trial that would end past it is not started (a "
                           "row says so); its last 15 %% measures the leaders again")
    tune.add_argument("--sample", type=int, default=tuner.SAMPLE, help="records per trial")
    tune.add_argument("--batch-sizes", type=_counts, default=(),
                      help="batch sizes to try, e.g. 16,32,64 (default: the workload's own)")
    tune.add_argument("--max-seq-lengths", type=_counts, default=(),
                      help="lengths you accept, e.g. 128,256: phase 0 tries each (they "
                           "change the vectors of longer texts: never tried unasked)")
    tune.add_argument("--variants", choices=("auto", "none"), default="auto",
                      help="auto: first try each precision and runtime the devices support "
                           "(those the quality guard passes); none, or a --precision or "
                           "--runtime given: only that one (a card's tokenizing layouts are "
                           "tried on it either way, unless --tokenize-threads or "
                           "--tokenize-processes names one)")
    tune.add_argument("--results-dir",
                      help="where tune_trials.csv goes, with its provenance (default: beside "
                           "--output; '' for nowhere)")
    _workload_groups(tune)
    pack = commands.add_parser("compact", help="copy a run's index and its parts into one file",
                               epilog=EXIT_STATUS)
    pack.add_argument("output", help="the output of a run: an index beside OUTPUT.parts/")
    out = commands.add_parser("export", help="an output as Parquet or NumPy files (streamed)",
                              epilog=EXIT_STATUS)
    out.add_argument("source", metavar="RUN_OUTPUT", help="a run's output (.h5)")
    out.add_argument("--to", choices=("parquet", "npy"), required=True,
                     help="parquet: one file, vectors as fixed-size lists; npy: a folder of "
                          "memory-mappable <dataset>.npy")
    out.add_argument("--output", metavar="PATH", required=True,
                     help="the file (parquet) or folder (npy) to write")
    out.add_argument("--overwrite", action="store_true",
                     help="replace an earlier export at --output (never another file)")
    out.add_argument("--partial", action="store_true",
                     help="export an unfinished run's rows written so far")
    out.add_argument("--order", choices=("id", "stored"), default="id",
                     help="id (default): rows in id order, the input's order where ids are row "
                          "numbers (keys too), so row k of every array is one record; stored: as "
                          "the run wrote them (arrival order), a little faster")
    out.add_argument("--row-numbers", action="store_true",
                     help="with a string id column, the input's row numbers too (as ids)")
    look = commands.add_parser("report", help="a finished run's picture, from its output (PNG)",
                               epilog=EXIT_STATUS)
    look.add_argument("output", help="a run's output (.h5)")
    look.add_argument("--to", metavar="PNG",
                      help="where the picture goes (default: OUTPUT.report.png, beside it)")
    look.add_argument("--run", type=int, default=-1,
                      help="which run of a resumed output: 0 the first (default: the last)")
    books = commands.add_parser("notebooks", help="run the notebook suite with papermill")
    books.add_argument("--params", default="cpu",
                       help="parameter set: smoke, cpu, gpu (notebooks/params/) or a .yaml path")
    books.add_argument("--only", nargs="+", metavar="PREFIX",
                       help="run only the notebooks whose name starts with these, e.g. 01 05")
    return parser


def notebooks(args: argparse.Namespace) -> int:
    try:
        needs("papermill", "notebooks", "the notebook suite")
    except ExtraMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from papermill.exceptions import PapermillExecutionError

    from helpers.study.notebooks import run_notebooks

    try:
        run_notebooks(args.params, args.only)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except PapermillExecutionError as exc:
        print(f"error: a notebook failed: {exc.ename}: {exc.evalue}", file=sys.stderr)
        return EXIT_FAILED
    return 0


def report(args: argparse.Namespace) -> int:
    """``python -m helpers report``: draw a finished run from what it recorded in its output."""
    from helpers.study.run_report import draw

    try:
        path = draw(args.output, args.to, args.run)
    except (ValueError, OSError, ExtraMissing) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(path)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "notebooks":
        return notebooks(args)
    if args.command == "compact":
        return compact_output(args.output)
    if args.command == "export":
        return export_output(args)
    if args.command == "report":
        return report(args)
    if args.command == "run" and args.config:
        try:
            args = build_parser(_config_defaults(args.config)).parse_args(argv)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("gpufeed").setLevel(logging.INFO)
    if args.command == "tune":
        return tune(args)
    # Ctrl-C and a scheduler's SIGTERM both stop the run cleanly; SIGINT explicitly too, since a
    # shell starts background jobs with it ignored
    previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with owning(args.output) as claim:  # held until the binning table is written too
            stats = _run(args, claim)
    except (ValueError, RuntimeError) as exc:  # SourceError, OutputError, PipelineError
        print(f"error: {exc}", file=sys.stderr)
        changed = _input_changed(exc)
        if isinstance(exc, PipelineError) and exc.__cause__ is not None and not changed \
                and not _is_usage(exc):
            print(f"remote traceback:{exc.__cause__}", file=sys.stderr)
        if _is_usage(exc):
            return EXIT_USAGE
        _failed(args.output, exc, changed)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("interrupted: workers stopped", file=sys.stderr)
        held = _say_kept(args.output)
        print(json.dumps({"interrupted": True, "output": args.output, **held}))  # (the stats
        # line scripts read last, saying what the output holds)
        return EXIT_INTERRUPTED
    except OSError as exc:  # a full disk, a folder that cannot be written, an input changed
        print(f"error: {exc}", file=sys.stderr)
        _failed(args.output, exc, _input_changed(exc))
        return EXIT_FAILED
    except Exception as exc:  # not foreseen: the details, then what it means for the output
        traceback.print_exc()
        print(f"error: the run stopped: {type(exc).__name__}: {exc}", file=sys.stderr)
        _failed(args.output, exc)
        return EXIT_FAILED
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    print(stats.summary(), file=sys.stderr)
    if stats.partial:
        print(f"partial: {stats.failed_records + stats.failed_before} records failed"
              f"{f' ({stats.failed_before} in an earlier run)' if stats.failed_before else ''}"
              f"; their ids, error types and "
              f"messages are in {args.output} under errors/", file=sys.stderr)
    print(json.dumps(stats.to_dict()))
    return EXIT_PARTIAL if stats.partial else 0


def _run(args: argparse.Namespace, output: Claim) -> Any:
    """The run the arguments ask for into ``output`` (held: ``main`` claimed it), and the binning
    table beside it; its stats."""
    if args.workload == "embedding" and args.stored in CALIBRATED:
        args.calibration = _calibration(args)
    workload = _workload(args)
    options = {"queue_depth": args.queue_depth, "threads_per_worker": args.threads_per_worker,
               "limit": args.limit, "progress": not args.no_progress, "resume": args.resume,
               "overwrite": args.overwrite, "workunit_timeout": args.workunit_timeout,
               "retries": args.retries, "max_restarts": args.max_restarts,
               "durable": not args.in_place, "adaptive": args.adaptive,
               "max_workers_per_device": args.max_workers_per_device,
               "workers_per_device": args.workers_per_device,
               "workunit_seconds": args.workunit_seconds, "writes": args.writes,
               "units_per_message": args.units_per_message}
    if args.ray_address:
        options["ray_address"] = args.ray_address
    source = _source(args)
    if args.workload != "binning":
        return run_pipeline(source, workload, args.devices, args.workunit_size, output,
                            args.backend, args.strategy, **options)
    table = _table_path(args)
    with owning(table):  # a.h5 and a.hdf5 would share a.csv
        stats = run_pipeline(source, workload, args.devices, args.workunit_size, output,
                             args.backend, args.strategy, **options)
        write_csv(read_output(args.output), table, dict(source))
    print(f"table: {table}", file=sys.stderr)
    return stats


def _calibration(args: argparse.Namespace) -> Any:
    """The ranges a run storing int8 or uint8 cuts its embeddings with: --ranges; else, on
    --resume, those the output keeps; else from the input's first --calibration-rows texts."""
    import numpy as np

    if args.ranges:
        try:
            return np.load(args.ranges)  # (no pickles: numpy's default)
        except (OSError, ValueError) as exc:
            raise ValueError(f"--ranges {args.ranges}: not a .npy array ({exc})") from None
    if args.resume:
        import h5py

        try:
            with h5py.File(output_path(args.output), "r") as f:
                kept, made = f.attrs.get("ranges"), f.attrs.get("workload_fingerprint")
                stored = str(f.attrs.get("stored", "float32"))
        except (OSError, KeyError):
            kept = made = None  # nothing to resume: the run says so, calibrated or not
        if made is not None and kept is None:
            raise ValueError(f"--resume: {args.output} stores {stored}, not {args.stored}: "
                             f"resume it as it was made, or start anew with --overwrite")
        if kept is not None:
            if args.truncate_dim is not None and np.shape(kept)[1] != args.truncate_dim:
                raise ValueError(f"--resume: {args.output} stores {np.shape(kept)[1]} "
                                 f"dimensions, not --truncate-dim {args.truncate_dim}")
            unused = f"; --calibration-rows {args.calibration_rows} is not used: its rows " \
                f"were cut with these" if args.calibration_rows is not None else ""
            print(f"{args.stored}: the calibration ranges {args.output} keeps{unused}",
                  file=sys.stderr)
            return np.asarray(kept)
    from helpers.embed import calibration_ranges
    from helpers.engine.contract.id_ranges import IdRanges
    from helpers.engine.inputs.sources import read_slices

    rows = args.calibration_rows if args.calibration_rows is not None else CALIBRATION_ROWS
    if rows < 2:
        raise ValueError(f"--calibration-rows: at least 2 texts, got {rows}")
    texts: list[str] = []
    check = EmbeddingWorkload().check_record  # (a text the run refuses calibrates nothing)
    for _, records in read_slices(_source(args), IdRanges(), reject=lambda rows: None):
        texts += [r for r in records if _fit(check, r)]
        if len(texts) >= rows:
            break
    texts = texts[:rows]
    print(f"{args.stored}: calibrating on the input's first {len(texts):,} texts "
          f"(--ranges or --calibration-rows to choose)", file=sys.stderr)
    options = {k: v for k, v in _encoding(args).items() if k not in ("stored", "ranges")}
    return calibration_ranges(texts, args.model, args.devices, args.batch_size,
                              args.normalize, args.backend, **options)


def _fit(check: Any, record: Any) -> bool:
    """Whether ``check`` (a workload's check_record) passes ``record``."""
    try:
        check(record)
    except (TypeError, ValueError):
        return False
    return True


def _encoding(args: argparse.Namespace) -> dict[str, Any]:
    """The embedding workload's options for ``encode`` (prompt, ...), from the arguments:
    ValueError where --prompt is given twice (that is binning's)."""
    prompts, prompt_name = list(args.prompts or []), args.prompt_name
    if not prompts and prompt_name is None:  # (tuned.yaml's; a --prompt or --prompt-name
        config = getattr(args, "config_prompt", None)  # given wins over both of its own)
        prompts, prompt_name = [config] if config is not None else [], \
            getattr(args, "config_prompt_name", None)
    if getattr(args, "ranges", None) and args.stored not in CALIBRATED:
        raise ValueError(f"--ranges: calibration ranges are for --stored int8 or uint8 "
                         f"(--stored {args.stored} takes none)")
    if len(prompts) > 1:
        raise ValueError(f"--prompt: the embedding workload takes one (the text put before "
                         f"each record), got {len(prompts)}: {prompts}")
    stored = args.stored if args.stored not in CALIBRATED or \
        getattr(args, "calibration", None) is not None else "float32"  # (tune's trials: the
    # calibration is the run's; storing costs the same)
    return {"prompt": prompts[0] if prompts else None, "prompt_name": prompt_name,
            "task": args.task, "max_seq_length": args.max_seq_length,
            "truncate_dim": args.truncate_dim, "stored": stored,
            "ranges": getattr(args, "calibration", None) if stored in CALIBRATED else None}


def _input_changed(exc: BaseException) -> bool:
    """Whether a run stopped because its input changed under it (a reader's InputChanged, in
    the driver or, named in a PipelineError, in a worker)."""
    return isinstance(exc, InputChanged) or "changed since the run started" in str(exc)


def _failed(output: str, exc: BaseException, changed: bool = False) -> None:
    """After a failed run: what its output holds, and the last stdout line (JSON) saying so."""
    held = _say_kept(output, changed)
    print(json.dumps({"failed": True, "error": f"{type(exc).__name__}: {exc}"[:500],
                      "output": output, **held}))


def _say_kept(output: str, changed: bool = False) -> dict[str, Any]:
    """After a run stopped: what its output holds now, and what finishes it (``changed``: the
    input changed under it, which --resume refuses); returns it (``records``,
    ``failed_records``, ``complete``; nothing where it cannot tell)."""
    import h5py

    path = output_path(output)
    try:
        with h5py.File(path, "r") as f:
            rows, complete = len(f["ids"]), bool(f.attrs.get("complete", False))
            errors = len(f["errors/ids"]) if "errors/ids" in f else 0
            check_parts(f, path)
    except (KeyError, ValueError):
        return {}  # not ours to describe
    except OSError as exc:  # nothing written, or a part is gone
        if path.exists():
            print(str(exc), file=sys.stderr)
        return {}
    if complete:
        print(f"{output} is complete ({rows:,} records)", file=sys.stderr)
    else:
        print(f"{rows:,} records written so far are in {output} " + (
            "(the input changed under the run: --resume carries on only once the input is "
            "again the file the run started with; --overwrite starts anew on the new one)"
            if changed else "(--resume finishes the run)"), file=sys.stderr)
    return {"records": rows, "failed_records": errors, "complete": complete}


def _table_path(args: argparse.Namespace) -> Path:
    """The binning table beside the output, if this run may write it (OutputError if not): a
    table a binning run wrote is replaced with --overwrite or --resume, any other file never."""
    output = output_path(args.output)
    table = output.with_suffix(".csv")
    if table == output:
        raise OutputError(f"output {args.output!r}: the binning table would be written over it "
                          f"({table.name}); name the output .h5")
    if table.exists() or table.is_symlink():
        if not is_table(table):
            raise OutputError(f"{str(table)!r} exists and is not a binning table gpufeed wrote "
                              f"(the table goes beside the output); name another output")
        if not (args.overwrite or args.resume):
            raise OutputError(f"{str(table)!r} exists (the binning table beside the output); "
                              f"--overwrite replaces it, or name another output")
    return table


def compact_output(output: str) -> int:
    from helpers.engine.outputs.checkpoint import compact

    started = time.monotonic()
    try:
        with owning(output):  # not while a run writes it
            size = compact(output)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"error: {exc}; {output} is as it was (its index and parts)", file=sys.stderr)
        return EXIT_FAILED
    print(f"{output}: one file of {size / 1e9:.2f} GB ({time.monotonic() - started:.1f} s); its "
          f"parts are removed", file=sys.stderr)
    return 0


def export_output(args: argparse.Namespace) -> int:
    from helpers.engine.outputs.export import export

    started = time.monotonic()
    try:
        rows = export(args.source, args.to, args.output, overwrite=args.overwrite,
                      partial=args.partial, order=args.order,
                      row_numbers=args.row_numbers)  # (refused while a run writes
        # it: its lock)
    except ValueError as exc:  # ExportError, OutputError
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"error: {exc}; nothing was written at {args.output}", file=sys.stderr)
        return EXIT_FAILED
    print(f"{args.output}: {rows:,} rows as {args.to} ({time.monotonic() - started:.1f} s)",
          file=sys.stderr)
    return 0


def tune(args: argparse.Namespace) -> int:
    """``python -m helpers tune``: the search, its trials table, tuned.yaml."""
    try:
        _writable_folders(args.output, args.results_dir)  # now, not after the tune's minutes
        source = _source(args)
        chosen = args.variants == "none" or (args.precision, args.runtime) != \
            (EmbeddingWorkload.precision, EmbeddingWorkload.runtime)
        if args.max_seq_lengths and args.max_seq_length is not None:
            raise ValueError("--max-seq-length and --max-seq-lengths: give one (the length, or "
                             "those the tune may try)")
        tuned = tuner.tune(lambda batch, **variant: _workload(args, batch, **variant), source,
                           args.devices, args.backend, args.batch_sizes, args.budget_seconds,
                           args.sample, [] if chosen else None, args.max_seq_lengths)
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE if _is_usage(exc) else EXIT_FAILED
    import pandas as pd

    from helpers.study.results import save_table

    trials = pd.DataFrame(tuned.trials)
    print("trials:", *(("  " + tuner.describe(t) + ("  <- picked" if t["trial"] == tuned.trial
                                                   else "")) for t in tuned.trials),
          sep="\n", file=sys.stderr)
    results_dir = str(Path(args.output).resolve().parent) if args.results_dir is None \
        else args.results_dir
    if results_dir:
        table = save_table(trials, "tune_trials", results_dir, "python -m helpers tune",
                           {k: v for k, v in vars(args).items() if k != "speed"})
        print(f"trials: {table}", file=sys.stderr)
    seconds = tuned.estimated_seconds
    estimate = "" if seconds is None else "; the whole input in about " + (
        f"{seconds / 60:.1f} min" if seconds < 3600 else f"{seconds / 3600:.2f} h")
    print(f"why: {tuned.reason}", file=sys.stderr)
    print(f"best: {','.join(tuned.devices)}, workunits {tuned.workunit_size}"
          f"{'' if tuned.batch_size is None else f', batch size {tuned.batch_size}'}"
          f"{''.join(f', {k} {v}' for k, v in tuned.variant.items())}: "
          f"{tuned.records_per_s:.1f} records/s{estimate}", file=sys.stderr)
    path = tuner.write_config(tuned, args.output, workload=args.workload,
                              **({"model": args.model} if args.model else {}),
                              **({"compile": True} if args.compile else {}),
                              **({"cuda_graphs": True} if args.cuda_graphs else {}),
                              **({"unpadded": True} if args.unpadded else {}),
                              **({"precision": args.precision, "runtime": args.runtime}
                                 if chosen else {}),  # phase 0 skipped: the variant given
                              **({"batch_size": args.batch_size}  # (the size it measured)
                                 if tuned.batch_size is None and args.workload == "embedding"
                                 else {}),
                              **_columns(args), input=str(args.input))
    print(f"wrote {path}: python -m helpers run --config {path} --input ... --output ...",
          file=sys.stderr)
    return 0


def _columns(args: argparse.Namespace) -> dict[str, Any]:
    """The input's columns as a tune was told them (those not the defaults), and a simulated
    card's options, for tuned.yaml: the command it prints runs as printed."""
    named = {"text_column": args.text_column, "id_column": args.id_column,
             "keep_columns": list(args.keep_columns or []),
             **({"card": args.card, "card_cores": args.card_cores,
                 "tokenize_threads": args.tokenize_threads,
                 "tokenize_processes": args.tokenize_processes, "batch_tokens": args.batch_tokens,
                 "feeder": None if args.feeder else False,
                 "word_cache": None if args.word_cache else False,
                 "prompt": (args.prompts or [None])[0], "prompt_name": args.prompt_name,
                 "task": args.task, "max_seq_length": args.max_seq_length,
                 "truncate_dim": args.truncate_dim,
                 "stored": None if args.stored == "float32" else args.stored}
                if args.workload == "embedding" else {})}
    return {k: v for k, v in named.items() if v not in ("text", None, [])}


def _config_defaults(path: str) -> dict[str, Any]:
    """run's defaults from a tuned.yaml: the fields that are settings (the rest informs), each
    read as its flag would be; ValueError naming the field and the file."""
    values = tuner.read_config(path)
    if isinstance(values.get("devices"), list):
        values["devices"] = ",".join(map(str, values["devices"]))
    if isinstance(values.get("keep_columns"), list) and all(
            isinstance(c, str) for c in values["keep_columns"]):
        values["keep_columns"] = ",".join(values["keep_columns"])
    read = {"workload": str, "model": str, "devices": str, "backend": str, "batch_size": int,
            "workunit_size": _count_or_auto, "workunit_seconds": float,
            "threads_per_worker": int, "precision": str, "runtime": str, "compile": _flag,
            "cuda_graphs": _flag, "unpadded": _flag,
            "text_column": str, "id_column": str,
            "keep_columns": _names, "card": str, "card_cores": int, "tokenize_threads": int,
            "tokenize_processes": int, "word_cache": _flag, "feeder": _flag,
            "batch_tokens": int, "prompt": str, "prompt_name": str, "task": str,
            "max_seq_length": int, "truncate_dim": int, "stored": str}
    defaults = {}
    for field, value in values.items():
        if field in read:
            try:
                if read[field] is str and not isinstance(value, str):
                    raise TypeError(value)
                defaults[field] = read[field](str(value))  # as if it were typed after the flag
            except (ValueError, TypeError, argparse.ArgumentTypeError):
                raise ValueError(f"config {path}: {field}: expected "
                                 f"{tuner.CONFIG_FIELDS[field]}, got {value!r}") from None
    for field in ("prompt", "prompt_name"):  # (apart from the flags: one given on the command
        if field in defaults:  # line, either, replaces both of the file's)
            defaults[f"config_{field}"] = defaults.pop(field)
    return defaults


def _source(args: argparse.Namespace) -> Any:
    if args.workload == "binning":
        return ImageFolderSource(args.input, follow_symlinks=args.follow_symlinks)
    return open_source(args.input, text_column=args.text_column, id_column=args.id_column,
                       keep_columns=args.keep_columns)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _workload(args: argparse.Namespace, batch_size: int | None = None, **variant: Any) -> Any:
    """The workload the arguments name, with the options of its own argument group (and
    ``batch_size`` instead of ``--batch-size`` if given, ``variant``'s options over theirs)."""
    options = {"embedding": {"normalize": args.normalize,
                             "tokenize_ahead": args.tokenize_ahead,
                             "precision": args.precision, "runtime": args.runtime,
                             "compile": args.compile, "cuda_graphs": args.cuda_graphs,
                             "unpadded": args.unpadded, "pin_memory": args.pin_memory,
                             "feeder": args.feeder, "word_cache": args.word_cache,
                             "card": args.card, "card_cores": args.card_cores,
                             "tokenize_threads": args.tokenize_threads,
                             "tokenize_processes": args.tokenize_processes,
                             "batch_tokens": args.batch_tokens,
                             **(_encoding(args) if args.workload == "embedding" else {})},
               "synthetic": {"mode": args.mode,
                             "seconds_per_workunit": args.seconds_per_workunit,
                             "parallelism": args.parallelism},
               "binning": {"thresholds": Thresholds(**{k: getattr(args, k)
                                                       for k in asdict(Thresholds())}),
                           "prompts": tuple(args.prompts or DEFAULT_PROMPTS),
                           "threads": args.model_threads, "clip_model": args.clip_model,
                           "caption_model": args.caption_model}}[args.workload]
    return make_workload(args.workload, args.model, batch_size or args.batch_size,
                         args.seconds_per_record, args.speed, **{**options, **variant})


def _writable_folders(output: str, results_dir: str | None) -> None:
    """ValueError naming ``output``'s folder, or the results folder, if tune could not write
    there: said before the tune, not after it."""
    folders = {"--output": Path(output).resolve().parent}
    if results_dir:
        folders["--results-dir"] = Path(results_dir).resolve()
    for flag, folder in folders.items():
        existing = next(p for p in (folder, *folder.parents) if p.exists())
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            raise ValueError(f"{flag}: cannot write in {folder} ({existing} is "
                             f"{'not a folder' if not existing.is_dir() else 'not writable'})")


def _is_usage(exc: Exception) -> bool:
    """A bad argument or input (ValueError from validation, SourceError), not a failed run."""
    return isinstance(exc, ValueError)


if __name__ == "__main__":
    sys.exit(main())
