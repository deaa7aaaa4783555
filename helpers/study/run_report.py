"""A finished run's own picture, from what it recorded in its output
(helpers.engine.outputs.run_log): ``python -m helpers report OUT.h5``.

One PNG, a panel for each question the run has something to say about:

- where each worker's time went: busy (split by the workload's phases where it measures them:
  tokenizing, the forward pass, the rest) and waiting (for work, or at the end);
- the rate over time: tokens per second where the workload counts them (what stays flat while
  the run is steady: rows per second move with the texts' length, short ones first to long
  ones), rows per second beside them; each device's and the whole run's;
- was the card fed: each device's busy share over time, from a simulated card's queue or the
  card's own telemetry (NVML);
- what failed: the output's error rows by type, and what the run recovered from.

A panel with nothing to show (a CPU run has no card; a run without errors) is left out and its
finding said in a line under the title. The title counts the output's rows, every run's: a
resumed output holds what earlier runs wrote too (one killed before it finished is not a
recorded run, but its rows are there).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from helpers.engine.contract.protocol import needs
from helpers.engine.outputs import run_log
from helpers.study.figures import use_style

BINS = 40  # time bins of the rate and busy panels
TOKENS = "count_tokens_needed"  # a span's tokens (the texts' own, no padding), where counted
PHASE_COLORS = {"tokenize": "#4c72b0", "forward": "#dd8452", "copy_out": "#8172b3"}


def default_path(output: str | Path) -> Path:
    """``OUT.h5.report.png``, beside the output."""
    return Path(f"{output}.report.png")


def _errors(output: str | Path) -> pd.Series:
    """The output's error rows counted by type."""
    import h5py

    with h5py.File(output, "r") as f:
        kinds = f["errors/type"][()] if "errors/type" in f else np.array([], dtype=object)
    kinds = [k.decode() if isinstance(k, bytes) else str(k) for k in kinds]
    return pd.Series(kinds, dtype=object).value_counts()


def _held(output: str | Path) -> int:
    """The rows the output holds, every run's."""
    import h5py

    with h5py.File(output, "r") as f:
        return len(f["ids"])


def _bins(spans: pd.DataFrame, wall: float) -> np.ndarray:
    last = float(spans["end_s"].max()) if len(spans) else 0.0
    return np.linspace(0.0, max(wall, last, 1e-6), BINS + 1)


def _spread(spans: pd.DataFrame, column: str, edges: np.ndarray) -> np.ndarray:
    """``column`` of each span spread evenly over its time, summed per bin."""
    totals = np.zeros(len(edges) - 1)
    for start, end, value in zip(spans["start_s"], spans["end_s"], spans[column]):
        length = max(end - start, 1e-9)
        overlap = np.clip(np.minimum(edges[1:], end) - np.maximum(edges[:-1], start), 0, None)
        totals += value * overlap / length
    return totals


def _check_output(output: Path) -> None:
    """ValueError, one line naming ``output`` and why it is not a gpufeed output to draw."""
    import h5py

    if output.is_dir():
        raise ValueError(f"{output}: a folder, not an output (name the .h5 file a run wrote)")
    if not output.is_file():
        raise ValueError(f"{output}: no such file")
    if output.stat().st_size == 0:
        raise ValueError(f"{output}: an empty file, not a gpufeed output")
    if not h5py.is_hdf5(output):
        raise ValueError(f"{output}: not a gpufeed output (not an HDF5 file)")
    with h5py.File(output, "r") as f:
        if "ids" not in f:
            raise ValueError(f"{output}: an HDF5 file gpufeed did not write (no ids)")


def draw(output: str | Path, path: str | Path | None = None, run: int = -1) -> Path:
    """Draw run ``run`` (default: the last) of ``output`` into ``path`` (default:
    ``default_path``); ValueError if the output records no run. The output is checked before
    the plotting libraries load (a second and a half here): a wrong name is told at once."""
    _check_output(Path(output))
    matplotlib = needs("matplotlib", "report", "the run's figure (python -m helpers report)")
    needs("seaborn", "report", "the run's figure (python -m helpers report)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = run_log.read(output)
    if not runs:
        raise ValueError(f"{output}: records no finished run (an output written before gpufeed "
                         f"kept runs' records, or a run that did not finish)")
    try:
        chosen = runs[run]
    except IndexError:
        raise ValueError(f"run: {output} records runs 0 to {len(runs) - 1}, not {run}") from None
    stats, spans = chosen.stats, pd.DataFrame(chosen.timeline)
    telemetry = pd.DataFrame(chosen.telemetry)
    wall = float(stats["wall_s"])
    edges = _bins(spans, wall)
    errors = _errors(output)
    panels = [lambda ax: _time_split(ax, stats, spans), lambda ax: _rate(ax, spans, edges)]
    said = []
    if _has_card(spans, telemetry):
        panels.append(lambda ax: _card(ax, stats, spans, telemetry, edges))
    elif not spans.empty:
        said.append("no card: a CPU run (its workers' busy share is the first panel)")
    if not errors.empty or _recovered(stats):
        panels.append(lambda ax: _failures(ax, errors, stats))
    else:
        said.append("no error rows: every input row is in the output")
    use_style()
    shape = {2: (1, 2), 3: (1, 3), 4: (2, 2)}[len(panels)]
    fig, axes = plt.subplots(*shape, figsize={2: (14, 5.2), 3: (19, 5.4), 4: (14, 9)}[len(panels)])
    for panel, ax in zip(panels, np.ravel(axes)):
        panel(ax)
    fig.suptitle(_title(output, runs, chosen, stats, errors), fontsize=12)
    if said:
        fig.text(0.5, 0.9, "; ".join(said), ha="center", fontsize=10, color="0.35")
    fig.tight_layout(rect=(0, 0, 1, 0.89 if said else 0.93))
    target = Path(path) if path is not None else default_path(output)
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target


def _title(output: str | Path, runs: list, chosen: Any, stats: dict[str, Any],
           errors: pd.Series | None = None) -> str:
    """Which run, what it did, and what the output holds (every run's rows; ``errors``: its
    error rows by type, read here if not given)."""
    card = f" on a {_card_name(output)}" if "card_busy_us" in stats.get("counts", {}) else ""
    which = "its one recorded run" if len(runs) == 1 else \
        f"run {chosen.number + 1} of {len(runs)} recorded (--run {chosen.number})"
    line = (f"{Path(output).name}, {which}{card}: {stats['records']:,} rows in "
            f"{float(stats['wall_s']):.1f} s ({stats['records_per_s']:,.0f} rows/s), "
            f"{stats['failed_records']:,} failed")
    held = _held(output)
    errors = int((errors if errors is not None else _errors(output)).sum())
    earlier = held + errors - int(stats["records"]) - int(stats["failed_records"])
    if earlier > 0:
        line += (f"\nthe output holds {held:,} rows and {errors:,} error rows: {earlier:,} of "
                 f"them from earlier runs")
    return line


def _has_card(spans: pd.DataFrame, telemetry: pd.DataFrame) -> bool:
    """Whether the run measured a card: a simulated one's busy time, or NVML's readings."""
    return "count_card_busy_us" in spans or (
        len(telemetry) > 0 and (telemetry["source"] == "nvml").any())


def _recovered(stats: dict[str, Any]) -> dict[str, int]:
    """What the run recovered from (retries, splits, restarts ...), those that happened."""
    return {k: v for k, v in stats.get("recovery", {}).items()
            if isinstance(v, int) and v and k != "restart_s"}


def _card_name(output: str | Path) -> str:
    import h5py

    with h5py.File(output, "r") as f:
        name = f.attrs.get("card", "simulated card")
    return str(name)


def _time_split(ax: Any, stats: dict[str, Any], spans: pd.DataFrame) -> None:
    workers = pd.DataFrame(stats["workers"]).sort_values("worker")
    labels = [f"worker {w} · {d}" for w, d in zip(workers["worker"], workers["device"])]
    left = np.zeros(len(workers))
    phases = sorted((c for c in spans.columns if c.startswith("phase_")), key=lambda c: (
        list(PHASE_COLORS).index(c[6:]) if c[6:] in PHASE_COLORS else len(PHASE_COLORS), c))
    if phases and not spans.empty:
        by_worker = spans.groupby("worker")[phases].sum().reindex(workers["worker"]).fillna(0)
        busy = workers["busy_s"].to_numpy()
        measured = by_worker.sum(axis=1).to_numpy()
        for phase in phases:
            name = phase.removeprefix("phase_")
            width = by_worker[phase].to_numpy()
            ax.barh(labels, width, left=left, color=PHASE_COLORS.get(name), label=f"busy: {name}")
            left += width
        rest = np.clip(busy - measured, 0, None)  # checks, reading, writing its part
        ax.barh(labels, rest, left=left, color="#55a868", label="busy: the rest")
        left += rest
    else:
        ax.barh(labels, workers["busy_s"], color="#55a868", label="busy")
        left += workers["busy_s"].to_numpy()
    ax.barh(labels, workers["wait_s"], left=left, color="0.85", label="waiting")
    left += workers["wait_s"].to_numpy()
    ax.invert_yaxis()
    ax.set_xlim(0, max(float(left.max()) if len(left) else 0.0, 1e-6) * 1.45)  # the legend's
    ax.set_xlabel("seconds of the run (after spin-up)")  # room, right of the longest bar
    ax.set_title("Where each worker's time went (more busy is better)", fontsize=10)
    ax.legend(fontsize=8, loc="center right")


def _nothing(ax: Any, title: str) -> None:
    ax.text(0.5, 0.5, "no workunits in this run (it found the output done)",
            transform=ax.transAxes, ha="center", va="center", fontsize=10, color="0.4")
    ax.set_title(title, fontsize=10)
    ax.set_axis_off()


def _rate(ax: Any, spans: pd.DataFrame, edges: np.ndarray) -> None:
    if spans.empty:
        return _nothing(ax, "The rate over time")
    width = edges[1] - edges[0]
    middle = (edges[:-1] + edges[1:]) / 2
    tokens = TOKENS in spans and spans[TOKENS].sum() > 0
    spans = spans.fillna({TOKENS: 0}) if tokens else spans  # (a span without its count)
    steady = TOKENS if tokens else "records"  # what stays flat while the run is steady
    unit = "tokens" if tokens else "rows"
    if spans["device"].nunique() > 1:
        for device, part in spans.groupby("device", sort=False):
            ax.plot(middle, _spread(part, steady, edges) / width, label=f"{device}: {unit}/s",
                    linewidth=1.2)
    ax.plot(middle, _spread(spans, steady, edges) / width, color="black", linewidth=1.8,
            label=f"all: {unit}/s")
    ax.set_xlabel("time since the first read [s]")
    ax.set_ylabel(f"{unit} per second")
    ax.set_ylim(bottom=0)
    if tokens:  # rows beside them, on their own axis: they move with the texts' length
        rows = ax.twinx()
        rows.plot(middle, _spread(spans, "records", edges) / width, color="0.55",
                  linewidth=1.2, linestyle="--", label="all: rows/s (right)")
        rows.set_ylabel("rows per second", color="0.4")
        rows.set_ylim(bottom=0)
        rows.grid(False)
        handles = ax.get_legend_handles_labels()
        more = rows.get_legend_handles_labels()
        ax.legend(handles[0] + more[0], handles[1] + more[1], fontsize=8, loc="center")
        ax.set_title("The rate over time: tokens/s is flat while the run is steady (a dip is a "
                     "stall);\nrows/s moves with the texts' length", fontsize=10)
    else:
        ax.set_title("The rate over time (flat is steady; a dip is a stall)", fontsize=10)
        ax.legend(fontsize=8, loc="lower center")


def _card(ax: Any, stats: dict[str, Any], spans: pd.DataFrame, telemetry: pd.DataFrame,
          edges: np.ndarray) -> None:
    width = edges[1] - edges[0]
    middle = (edges[:-1] + edges[1:]) / 2
    if "count_card_busy_us" in spans:
        for device, part in spans.groupby("device", sort=False):
            busy = _spread(part, "count_card_busy_us", edges) / 1e6 / width
            ax.plot(middle, 100 * np.clip(busy, 0, 1), label=f"{device} (simulated)")
        share = stats["card_busy_share"]
        ax.set_title(f"Was the card fed? Simulated card busy {share:.0%} of the run "
                     f"(100 % is fed)", fontsize=10)
    elif len(telemetry) and (telemetry["source"] == "nvml").any():
        cards = telemetry[telemetry["source"] == "nvml"]
        for device, part in cards.groupby("device", sort=False):
            ax.plot(part["seconds"], part["utilization"], label=f"{device} (NVML)")
        ax.set_title("Was the card fed? GPU busy, from NVML (100 % is fed)", fontsize=10)
    else:
        ax.text(0.5, 0.5, "no card here: a CPU run (its workers' busy share is above)",
                transform=ax.transAxes, ha="center", va="center", fontsize=10, color="0.4")
        ax.set_title("Was the card fed?", fontsize=10)
        ax.set_axis_off()
        return
    ax.set_ylim(0, 105)
    ax.set_xlabel("time since the first read [s]")
    ax.set_ylabel("card busy [%]")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def _failures(ax: Any, errors: pd.Series, stats: dict[str, Any]) -> None:
    if errors.empty:
        ax.text(0.5, 0.5, "no error rows: every input row is in the output",
                transform=ax.transAxes, ha="center", va="center", fontsize=10, color="0.3")
        ax.set_axis_off()
    else:
        ax.barh([str(k) for k in errors.index], errors.to_numpy(), color="#c44e52")
        ax.invert_yaxis()
        ax.set_xlabel("rows in errors/ (python -m helpers export, or read_output's errors)")
    said = ", ".join(f"{v} {k}" for k, v in _recovered(stats).items())
    recovered = f"\n(the run recovered from: {said})" if said else ""
    ax.set_title(f"What failed, by type (the output's error rows, every run's){recovered}",
                 fontsize=10)
