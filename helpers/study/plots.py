"""The study's plot kinds. Each takes a tidy table and returns a matplotlib Figure for
``helpers.study.figures.save_figure``; titles say which direction is better, axes carry units."""
from __future__ import annotations

from typing import Any

import pandas as pd

from helpers.study.figures import use_style
from helpers.workloads.binning.rule import BINS

STRATEGY_NAMES = {"static": "static split (rounds)", "queue": "queue-fed (persistent)"}


def _figure(ncols: int = 1, width: float = 6.4, height: float = 4.2, **kwargs: Any):
    import matplotlib.pyplot as plt

    use_style()
    return plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False, **kwargs)


def mean_sd(frame: pd.DataFrame, x: str, y: str, hue: str, title: str, xlabel: str, ylabel: str,
            logx: bool = False) -> Any:
    """Mean ± sd of ``y`` over replicates against ``x``, one line per ``hue``."""
    import seaborn as sns

    fig, axes = _figure()
    ax = axes[0, 0]
    data = frame.assign(**{hue: frame[hue].map(lambda v: STRATEGY_NAMES.get(v, v))})
    sns.lineplot(data=data, x=x, y=y, hue=hue, errorbar="sd", err_style="bars", marker="o",
                 ax=ax, err_kws={"capsize": 4})
    if logx:
        ax.set_xscale("log")
    ax.set_xticks(sorted(frame[x].unique()), labels=[str(v) for v in sorted(frame[x].unique())])
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.set_ylim(bottom=0)
    return fig


def timeline(spans: pd.DataFrame, title: str, panel: str | None = None,
             round_ends: pd.Series | None = None) -> Any:
    """Busy bars per worker over time (the gaps are idle time), one panel per value of ``panel``."""
    import matplotlib.pyplot as plt

    use_style()
    panels = [None] if panel is None else list(dict.fromkeys(spans[panel]))
    height = 1.2 + len(panels) * (0.6 + 0.45 * spans["worker"].nunique())
    fig, axes = plt.subplots(len(panels), 1, figsize=(9.0, height), squeeze=False, sharex=True)
    colors = plt.get_cmap("tab10")
    for ax, value in zip(axes[:, 0], panels):
        part = spans if value is None else spans[spans[panel] == value]
        for worker, rows in part.groupby("worker"):
            bars = list(zip(rows["start_s"], rows["end_s"] - rows["start_s"]))
            ax.broken_barh(bars, (worker - 0.4, 0.8), facecolors=colors(worker % 10),
                           edgecolor="white", linewidth=1.0)
        labels = part.drop_duplicates("worker").sort_values("worker")
        ax.set_yticks(labels["worker"], labels=[f"worker {w} · {d}" for w, d in
                                                zip(labels["worker"], labels["device"])])
        ax.invert_yaxis()
        if round_ends is not None and value is None:
            for end in sorted(set(round_ends)):
                ax.axvline(end, color="0.3", linestyle="--", linewidth=0.8)
        ax.set_title(STRATEGY_NAMES.get(value, value) if value is not None else "", fontsize=10)
    axes[-1, 0].set_xlabel("time since start [s] (bars: busy; gaps: idle)")
    fig.suptitle(title)
    return fig


def grouped_bars(frame: pd.DataFrame, x: str, y: str, hue: str, title: str, xlabel: str,
                 ylabel: str) -> Any:
    """Mean ± sd bars of ``y`` per ``x``, grouped by ``hue``."""
    import seaborn as sns

    fig, axes = _figure()
    data = frame.assign(**{hue: frame[hue].map(lambda v: STRATEGY_NAMES.get(v, v))})
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
    for y, row in zip(positions, best.itertuples()):
        ax.text(row.records_per_s, y, f"  {row.estimated_days:,.1f} days", va="center",
                fontsize=9)
    ax.set_yticks(list(positions), labels=labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(right=best["records_per_s"].max() * 1.3)
    ax.set(title=title, xlabel=f"throughput [records/s] (labels: days for {total_records:,} chunks)")
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
