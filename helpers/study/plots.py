"""The study's plot kinds. Each takes a tidy table and returns a matplotlib Figure for
``helpers.study.figures.save_figure``; titles say which direction is better, axes carry units."""
from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from helpers.study.figures import STRATEGY_LABELS, use_style
from helpers.workloads.binning.rule import BINS

LABEL_CHARS = 36  # a bar's label wrapped at this many characters (ranked_bars)
USE_LABELS = {"nvml": "GPU busy [%]\n(NVML)", "psutil": "CPU [%] of the\nworkers (psutil)",
              "simulated": "card busy [%]\n(simulated)"}  # telemetry lane, by sample source


def _labelled(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    """``frame`` with the strategies in ``column`` named as figures name them."""
    return frame.assign(**{column: frame[column].map(lambda v: STRATEGY_LABELS.get(v, v))})


def _figure(ncols: int = 1, width: float = 6.4, height: float = 4.2, **kwargs: Any):
    import matplotlib.pyplot as plt

    use_style()
    return plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False, **kwargs)


def _wrapped(title: str, width: int) -> str:
    """``title`` in lines of at most ``width`` characters, its own line breaks kept."""
    return "\n".join(textwrap.fill(line, width, break_on_hyphens=False)
                     for line in title.splitlines())


def mean_sd(frame: pd.DataFrame, x: str, y: str, hue: str, title: str, xlabel: str, ylabel: str,
            logx: bool = False) -> Any:
    """Mean ± sd of ``y`` over replicates against ``x``, one line per ``hue``."""
    import seaborn as sns

    fig, axes = _figure()
    ax = axes[0, 0]
    data = _labelled(frame, hue)
    sns.lineplot(data=data, x=x, y=y, hue=hue, errorbar="sd", err_style="bars", marker="o",
                 ax=ax, err_kws={"capsize": 4})
    if logx:
        ax.set_xscale("log")
    ax.set_xticks(sorted(frame[x].unique()), labels=[str(v) for v in sorted(frame[x].unique())])
    ax.set(title=_wrapped(title, 68), xlabel=xlabel, ylabel=ylabel)
    ax.set_ylim(bottom=0)
    return fig


def card_busy(table: pd.DataFrame, title: str, x: str = "workers",
              lines: str = "tokenizing", xlabel: str = "workers on the card",
              logx: bool = False) -> Any:
    """A simulated card's busy share against ``x``, one line per value of ``lines`` (labelled
    as helpers.study.feeding names it), on a 0-100 % axis with "fed" marked, and, where the
    table has it, the most this machine's every core could keep the card busy: how far the card
    is from fed, and whether a layout or the machine holds it back."""
    from helpers.study.feeding import layout_name

    shown = table.assign(card_busy_pct=100 * table["card_busy_share"],
                         layout=[layout_name(row, [lines]) for _, row in table.iterrows()])
    fig = mean_sd(shown, x, "card_busy_pct", "layout", title=title, xlabel=xlabel,
                  ylabel="card busy [%]", logx=logx)
    ax = fig.axes[0]
    ax.axhline(100, color="0.3", linestyle="--", linewidth=0.8)
    ax.text(ax.get_xlim()[0], 101, " fed", fontsize=8, color="0.3", va="bottom")
    limit = 100 * table["card_busy_limit"].median() if "card_busy_limit" in table else 200
    if limit < 100:  # (at 100 % or more, the cores here could feed the card: no line)
        ax.axhline(limit, color="0.5", linestyle=":", linewidth=0.8)
        ax.text(ax.get_xlim()[0], limit + 1, " every core here", fontsize=8, color="0.5",
                va="bottom")
    ax.set_ylim(0, 110)
    return fig


def timeline(spans: pd.DataFrame, title: str, panel: str | None = None,
             round_ends: pd.Series | None = None, sizes: bool = False,
             decisions: pd.DataFrame | None = None, telemetry: pd.DataFrame | None = None,
             color_by: str = "device", simulated: bool = False) -> Any:
    """Busy bars per worker over time (the gaps are idle time), one panel per value of ``panel``;
    each bar coloured by its ``color_by`` column (the device; a Ray run's ``node``, say).
    ``simulated``: the devices are the synthetic workload's simulated cards, said in each
    worker's label and the title, where the eye lands.

    With one panel, lanes below it, sharing its time axis: ``sizes``, each workunit's records by
    device; ``decisions`` (growth's), each device's worker count; ``telemetry`` (its samples, or
    helpers.study.autotune.busy_share's), each device's use: were the devices fed?
    """
    import matplotlib.pyplot as plt

    use_style()
    panels = [None] if panel is None else list(dict.fromkeys(spans[panel]))
    lanes = [] if panel is not None else \
        [lane for lane, wanted in (("sizes", sizes), ("workers", decisions is not None),
                                   ("use", telemetry is not None)) if wanted]
    rows = 0.6 + 0.45 * spans["worker"].nunique()
    fig, axes = plt.subplots(len(panels) + len(lanes), 1, squeeze=False, sharex=True,
                             figsize=(9.0, 1.2 + len(panels) * rows + 1.6 * len(lanes)),
                             height_ratios=[rows] * len(panels) + [1.6] * len(lanes))
    devices = list(dict.fromkeys(spans.sort_values("worker")["device"]))
    groups = list(dict.fromkeys(spans.sort_values(["start_s", "worker"])[color_by])) \
        if color_by != "device" else devices
    by_group = len(groups) > 1
    colors = plt.get_cmap("tab10")
    for ax, value in zip(axes[:len(panels), 0], panels):
        part = spans if value is None else spans[spans[panel] == value]
        for (worker, group), rows_ in part.groupby(["worker", color_by], sort=False):
            bars = list(zip(rows_["start_s"], rows_["end_s"] - rows_["start_s"]))
            color = colors(groups.index(group) if by_group else worker % 10)
            ax.broken_barh(bars, (worker - 0.4, 0.8), facecolors=color, edgecolor="white",
                           linewidth=1.0)
        labels = part.drop_duplicates("worker").sort_values("worker")
        ax.set_yticks(labels["worker"], labels=[
            f"worker {w} · {d}" + (" (simulated)" if simulated else "")
            for w, d in zip(labels["worker"], labels["device"])])
        ax.invert_yaxis()
        if round_ends is not None and value is None:
            for end in sorted(set(round_ends)):
                ax.axvline(end, color="0.3", linestyle="--", linewidth=0.8)
        ax.set_title(STRATEGY_LABELS.get(value, value) if value is not None else "", fontsize=10)
    for ax, lane in zip(axes[len(panels):, 0], lanes):
        if lane == "sizes":
            _sizes_lane(ax, spans, devices, colors)
        elif lane == "workers":
            _workers_lane(ax, decisions, spans, devices, colors)
        else:
            _use_lane(ax, telemetry, devices, colors)
    if by_group and (lanes or color_by != "device"):
        axes[0, 0].legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colors(i))
                                   for i in range(len(groups))], labels=groups,
                          fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[-1, 0].set_xlabel("time since start [s] (bars: busy; gaps: idle)")
    fig.suptitle(("Simulated cards: " if simulated and "simulated" not in title.lower() else "")
                 + title)
    return fig


def _sizes_lane(ax: Any, spans: pd.DataFrame, devices: list[str], colors: Any) -> None:
    from matplotlib import ticker

    for i, device in enumerate(devices):
        part = spans[spans["device"] == device]
        ax.scatter(part["start_s"], part["records"], s=10, color=colors(i), label=device)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_ylabel("workunit\n[records]", fontsize=9)


def _workers_lane(ax: Any, decisions: pd.DataFrame, spans: pd.DataFrame, devices: list[str],
                  colors: Any) -> None:
    known = decisions if "device" in decisions else pd.DataFrame(
        columns=["device", "seconds", "workers"])
    for i, device in enumerate(devices):
        part = known[known["device"] == device]
        times, counts = [0.0, *part["seconds"]], [1, *part["workers"]]
        ax.step([*times, spans["end_s"].max()], [c + 0.06 * (i - 1) for c in counts + counts[-1:]],
                where="post", color=colors(i), linewidth=1.6)  # offset: equal counts stay visible
    ax.set_ylabel("workers\nper device", fontsize=9)
    ax.set_ylim(0.5, max([2, *known["workers"]]) + 0.5)
    ax.yaxis.get_major_locator().set_params(integer=True)


def _use_lane(ax: Any, telemetry: pd.DataFrame, devices: list[str], colors: Any) -> None:
    if telemetry.empty:  # a job shorter than telemetry's sample period
        ax.text(0.5, 0.5, "no telemetry samples: the job was shorter than their period",
                transform=ax.transAxes, ha="center", va="center", fontsize=9, color="0.4")
        ax.set_ylabel("use [%]", fontsize=9)
        return
    use = telemetry.groupby(["device", "seconds"])["utilization"].sum().reset_index()
    for i, device in enumerate(devices):
        part = use[use["device"] == device]
        ax.plot(part["seconds"], part["utilization"], color=colors(i), linewidth=1.2)
    source = telemetry["source"].iloc[0] if len(telemetry) else ""
    ax.set_ylabel(USE_LABELS.get(source, "use [%]"), fontsize=9)
    ax.set_ylim(bottom=0)


def grouped_bars(frame: pd.DataFrame, x: str, y: str, hue: str, title: str, xlabel: str,
                 ylabel: str) -> Any:
    """Mean ± sd bars of ``y`` per ``x``, grouped by ``hue``."""
    import seaborn as sns

    fig, axes = _figure()
    data = _labelled(frame, hue)
    sns.barplot(data=data, x=x, y=y, hue=hue, errorbar="sd", capsize=0.1, ax=axes[0, 0])
    axes[0, 0].set(title=title, xlabel=xlabel, ylabel=ylabel)
    return fig


def side_by_side(frame: pd.DataFrame, x: str, panels: list[tuple[str, str]], hue: str,
                 title: str, xlabel: str) -> Any:
    """One mean ± sd panel per (column, label) in ``panels``, sharing ``x`` and ``hue``."""
    import seaborn as sns

    fig, axes = _figure(len(panels), width=5.2)
    for ax, (column, label) in zip(axes[0], panels):
        sns.lineplot(data=frame, x=x, y=column, hue=hue, errorbar="sd", err_style="bars",
                     marker="o", ax=ax, err_kws={"capsize": 4})
        ax.set_xticks(sorted(frame[x].unique()))
        ax.set(xlabel=xlabel, ylabel=label, title=label.split(" [")[0])
        ax.set_ylim(bottom=0)
    fig.suptitle(title)
    return fig


def ranking(best: pd.DataFrame, title: str, total_records: int) -> Any:
    """Horizontal bars, best first: each experiment's best configuration (mean ± sd), annotated
    with the days ``total_records`` would take at that rate."""
    import matplotlib.pyplot as plt

    use_style()
    fig, ax = plt.subplots(figsize=(9.0, 1.2 + 0.75 * len(best)))
    labels = [f"{r.experiment} · {r.devices}\n{r.configuration}" for r in best.itertuples()]
    positions = range(len(best))
    ax.barh(positions, best["records_per_s"], xerr=best["records_per_s_sd"], capsize=4,
            color=plt.get_cmap("tab10")(0))
    ends = best["records_per_s"] + best["records_per_s_sd"].fillna(0)  # past the error bar
    for y, end, row in zip(positions, ends, best.itertuples()):
        ax.text(end, y, f"  {row.estimated_days:,.1f} days", va="center", fontsize=9)
    ax.set_yticks(list(positions), labels=labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(right=ends.max() * 1.3)
    ax.set(title=title, xlabel=f"throughput [records/s] (labels: days for {total_records:,} chunks)")
    return fig


def ranked_bars(frame: pd.DataFrame, label: str, y: str, hue: str, title: str,
                xlabel: str) -> Any:
    """Horizontal mean ± sd bars of ``y`` per ``label``, best first, coloured by ``hue``."""
    import matplotlib.pyplot as plt

    use_style()
    stats = frame.groupby(label).agg(mean=(y, "mean"), sd=(y, "std"), hue=(hue, "first"))
    stats = stats.sort_values("mean", ascending=False)
    kinds = list(dict.fromkeys(frame[hue]))
    colors = [plt.get_cmap("tab10")(kinds.index(k)) for k in stats["hue"]]
    labels = [textwrap.fill(str(name), LABEL_CHARS, break_on_hyphens=False)
              for name in stats.index]  # (a long label wrapped: the bars keep the width)
    lines = max(name.count("\n") + 1 for name in labels) if labels else 1
    fig, ax = plt.subplots(figsize=(8.0, 1.2 + (0.25 + 0.15 * lines) * len(stats)))
    spread = None if stats["sd"].isna().all() else stats["sd"].fillna(0.0)  # one run: no bars
    ax.barh(range(len(stats)), stats["mean"], xerr=spread, capsize=3, color=colors)
    ax.set_yticks(range(len(stats)), labels=labels, fontsize=8)
    ax.invert_yaxis()
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=plt.get_cmap("tab10")(i))
                       for i in range(len(kinds))], labels=kinds, fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    ax.set(title=_wrapped(title, 70), xlabel=xlabel)  # (legend: right)
    return fig


def ranked_panels(frame: pd.DataFrame, label: str, hue: str,
                  metrics: Sequence[tuple[str, str, bool]], title: str) -> Any:
    """One horizontal bar panel per metric (``(column, axis label, higher is better)``): mean ±
    sd per ``label``, the labels in the first metric's order, best first, coloured by ``hue``;
    each panel's title says which way is better."""
    import matplotlib.pyplot as plt

    use_style()
    first, _, higher = metrics[0]
    order = frame.groupby(label)[first].mean().sort_values(ascending=not higher).index
    kinds = list(dict.fromkeys(frame[hue]))
    colors = [plt.get_cmap("tab10")(kinds.index(frame.loc[frame[label] == name, hue].iloc[0]))
              for name in order]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics) + 2.0,
                                                      1.4 + 0.4 * len(order)), sharey=True)
    for ax, (column, axis, better_high) in zip(np.atleast_1d(axes), metrics):
        stats = frame.groupby(label)[column].agg(["mean", "std"]).fillna(0.0).reindex(order)
        ax.barh(range(len(order)), stats["mean"], xerr=stats["std"], capsize=3, color=colors)
        ax.set(title=f"{axis}\n({'higher' if better_high else 'lower'} is better)", xlabel=axis)
    first_ax = np.atleast_1d(axes)[0]
    first_ax.set_yticks(range(len(order)), labels=order, fontsize=8)
    first_ax.invert_yaxis()
    np.atleast_1d(axes)[-1].legend(
        handles=[plt.Rectangle((0, 0), 1, 1, color=plt.get_cmap("tab10")(i))
                 for i in range(len(kinds))], labels=kinds, fontsize=8, loc="upper left",
        bbox_to_anchor=(1.02, 1.0))
    fig.suptitle(title)
    return fig


def fault_rows(frame: pd.DataFrame, title: str) -> Any:
    """Per system, the rows a run with one model process killed returned once, lost and twice,
    stacked, with how it ended written beside each bar."""
    import matplotlib.pyplot as plt

    use_style()
    parts = [("rows once", frame["rows_unique"], "tab:green"),
             ("rows lost", frame["rows_lost"], "tab:red"),
             ("rows twice", frame["rows_duplicated"], "tab:orange")]
    fig, ax = plt.subplots(figsize=(9.0, 1.4 + 0.45 * len(frame)))
    left = np.zeros(len(frame))
    for name, values, color in parts:
        ax.barh(range(len(frame)), values, left=left, color=color, label=name)
        left += values.to_numpy()
    for y, (outcome, fault) in enumerate(zip(frame["outcome"], frame["fault"])):
        ax.text(left[y] * 1.01, y, outcome if fault.startswith("SIGKILL") else
                f"{outcome}, nothing killed", va="center", fontsize=8)
    ax.set_yticks(range(len(frame)), labels=frame["label"], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, left.max() * 1.45)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set(title=title, xlabel="rows of the run")
    return fig


def stacked_counts(frame: pd.DataFrame, x: str, stack: str, title: str, xlabel: str) -> Any:
    """How many rows per ``x``, each bar split by ``stack`` (e.g. images per bin, by kind)."""
    fig, axes = _figure()
    counts = frame.groupby([x, stack]).size().unstack(fill_value=0)
    counts.plot.bar(stacked=True, ax=axes[0, 0], rot=0)
    axes[0, 0].set(title=title, xlabel=xlabel, ylabel="images")
    axes[0, 0].legend(title=stack)
    return fig


def time_breakdown(times: pd.DataFrame, title: str) -> Any:
    """Mean seconds per image spent in each model, by kind of image, stacked."""
    fig, axes = _figure()
    means = times.groupby(["kind", "model"])["seconds"].mean().unstack(fill_value=0)
    means = means[means.sum().sort_values(ascending=False).index]
    means.plot.barh(stacked=True, ax=axes[0, 0])
    axes[0, 0].set(title=title, xlabel="seconds per image (lower is better)", ylabel="kind of image")
    axes[0, 0].legend(title="model")
    return fig


def gallery(table: pd.DataFrame, boxes: dict[int, list], per_bin: int, seed: int = 0) -> Any:
    """A few images of each bin, with the detector's boxes and the features that decided it."""
    import matplotlib.pyplot as plt
    from PIL import Image

    use_style()
    done = table[table["error"] == ""]
    bins = [b for b in BINS if (done["bin"] == b).any()]
    fig, axes = plt.subplots(len(bins), per_bin, figsize=(3.2 * per_bin, 3.4 * len(bins)),
                             squeeze=False)
    for row, name in zip(axes, bins):
        members = done[done["bin"] == name]
        picks = members.sample(min(per_bin, len(members)), random_state=seed)
        for ax, image in zip(row, picks.itertuples()):
            ax.imshow(Image.open(image.path).convert("RGB"))
            for x0, y0, x1, y1, label, _ in boxes.get(image.id, []):
                ax.add_patch(plt.Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, color="yellow",
                                           linewidth=1.2))
                ax.text(x0, y0, label, color="black", backgroundcolor="yellow", fontsize=6)
            ax.set_title(f"{name}: {image.file}\n{image.text_boxes} text boxes, area "
                         f"{image.text_area:.2f}; {image.objects} objects", fontsize=7)
        for ax in row:
            ax.axis("off")
    fig.suptitle("Bins A (text-rich), B (object-rich scenes), C (the rest), with detected boxes")
    return fig
