"""The GPU check's figures, drawn from its tables only (helpers.study.figures saves them):

- ``model-texts_per_s-vs-batch_size``: the card alone (forward passes, one line per variant) and
  a worker's whole path (encode, the feed variant), in texts/s and as a share of the card's
  measured bf16 limit: how much of the card the model can use, and how much the CPU side leaves;
- ``study-texts_per_s-vs-workers``: the study's corpus through 1-4 workers per GPU, by workunit
  size, and the card's busy share (NVML) in each run: how many workers keep the card fed; each
  tokenizing layout tried beside the default, a point at its count of workers;
- ``simulated-card_busy-vs-workers``: the simulated card at full speed, fed by the machine's
  cores: does this CPU keep its card fed (helpers.bench.gpu.simulated)?
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from helpers.bench.gpu.model_side import FEEDS, feed_precision
from helpers.bench.gpu.tables import (FIGURES, VARIANT, measured, read, sidecar, study_runs,
                                      variant)


def draw(results: str | Path, figures_dir: str | Path) -> list[Path]:
    """The figures from the tables in ``results``; their paths."""
    from helpers.study.figures import save_figure
    from helpers.study.provenance import describe_machine

    tables, meta = read(results), sidecar(results)
    machine = describe_machine(meta["machine"]) + f"; weights {meta['parameters']['weights']}"
    device = meta["parameters"]["device"]
    saved = []
    if "gpu_model" in tables and "texts_per_s" in measured(tables["gpu_model"]).dropna(
            axis="columns", how="all"):  # (not where every variant was skipped)
        fig, finding = model_figure(tables["gpu_model"], device)
        saved.append(save_figure(fig, FIGURES, "model-texts_per_s-vs-batch_size", figures_dir,
                                 finding=finding, machine=machine,
                                 replicates=int(meta["parameters"]["repeats"]),
                                 tables=["gpu_model"]))
    if "gpu_study" in tables and "texts_per_s" in tables["gpu_study"]:
        fig, finding = study_figure(tables["gpu_study"])
        saved.append(save_figure(fig, FIGURES, "study-texts_per_s-vs-workers", figures_dir,
                                 finding=finding, machine=machine, replicates=1,
                                 tables=["gpu_study"]))
    if "gpu_simulated" in tables and len(measured(tables["gpu_simulated"])):
        from helpers.study.feeding import tokenizing
        from helpers.study.findings import card_busy
        from helpers.study.plots import card_busy as card_busy_figure

        fed = measured(tables["gpu_simulated"])
        fed = fed.assign(tokenizing=tokenizing(fed))
        finding = card_busy(fed, ["workers", "tokenizing"])
        fig = card_busy_figure(fed, f"{fed['card'].iloc[0].capitalize()} fed by this machine's "
                               f"{int(fed['cores'].iloc[0])} cores (higher is better)",
                               lines="tokenizing")
        saved.append(save_figure(fig, FIGURES, "simulated-card_busy-vs-workers", figures_dir,
                                 finding=finding, machine=machine, replicates=1,
                                 tables=["gpu_simulated"]))
    return saved


def _panels() -> tuple[Any, Any]:
    import matplotlib.pyplot as plt

    from helpers.study.figures import use_style

    use_style()
    fig, axes = plt.subplots(1, 2, figsize=(12.8, 4.4))
    return fig, axes


def model_figure(model: pd.DataFrame, device: str) -> tuple[Any, str]:
    done = measured(model)
    ahead, pin = FEEDS[0]
    lines = done[(done["mode"] == "forward") | (
        (done["mode"] == "encode") & (done["precision"] == feed_precision(device))
        & ~done["compile"].astype(bool) & ~done["cuda_graphs"].astype(bool)
        & ~done["unpadded"].astype(bool)
        & (done["tokenize_ahead"] == ahead) & (done["pin_memory"] == pin))]
    medians = lines.groupby(["mode", *VARIANT, "batch_size"], sort=False)[
        ["texts_per_s", "card_share"]].median().reset_index()
    fig, (rate, share) = _panels()
    for (mode, *_), group in medians.groupby(["mode", *VARIANT], sort=False):
        label = f"{mode}: {variant(group.iloc[0])}"
        style = {"linestyle": "--", "color": "black"} if mode == "encode" else {}
        for ax, column, scale in ((rate, "texts_per_s", 1), (share, "card_share", 100)):
            ax.plot(group["batch_size"], group[column] * scale, marker="o", label=label, **style)
    sizes = sorted(medians["batch_size"].unique())
    for ax, ylabel in ((rate, "texts per second"), (share, "share of the card's bf16 limit [%]")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, labels=[str(int(s)) for s in sizes])
        ax.set(xlabel="batch size [texts]", ylabel=ylabel)
        ax.set_ylim(bottom=0)
    rate.legend(fontsize=8)
    fig.suptitle("Higher is better: the card alone (forward) against a worker's whole path "
                 "(encode, dashed)")
    return fig, model_finding(medians)


def model_finding(medians: pd.DataFrame) -> str:
    forward = medians[medians["mode"] == "forward"]
    encode = medians[medians["mode"] == "encode"]
    if forward.empty:
        return "no forward pass was timed"
    best = forward.loc[forward["texts_per_s"].idxmax()]
    text = (f"The card alone peaks at {best['texts_per_s']:,.0f} texts/s ({variant(best)}, "
            f"batch {int(best['batch_size'])}: "
            f"{best['card_share']:.1%} of its bf16 limit)")
    if not encode.empty:
        top = encode.loc[encode["texts_per_s"].idxmax()]
        text += (f"; one worker's whole path reaches {top['texts_per_s']:,.0f} "
                 f"({top['texts_per_s'] / best['texts_per_s']:.1%} of that)")
    return text + "."


def study_figure(runs: pd.DataFrame) -> tuple[Any, str]:
    done = study_runs(runs)
    fig, (rate, busy) = _panels()
    source = done["busy_source"].iloc[0] if len(done) else "nvml"
    scale = 100 if source == "nvml" else 1  # a card's share in %; a CPU's in cores
    default = done["layout"] == "default"
    tried = not default.all()
    for size, group in done[default].groupby("workunit_size", sort=False):
        group = group.sort_values("workers")
        label = f"workunit {size}" + (", default tokenizing" if tried else "")
        rate.plot(group["workers"], group["texts_per_s"], marker="o", label=label)
        busy.plot(group["workers"], group["busy_share"] * scale, marker="o", label=label)
    for (size, words), group in done[~default].groupby(["workunit_size", "tokenizing"],
                                                        sort=False):
        label = f"workunit {size}, tokenizing on {words or group['layout'].iloc[0]}"
        for ax, column, factor in ((rate, "texts_per_s", 1), (busy, "busy_share", scale)):
            ax.plot(group["workers"], group[column] * factor, marker="s", linestyle="none",
                    label=label)  # (a layout runs at one count of workers: a point)
    counts = sorted(done["workers"].unique())
    for ax, ylabel in ((rate, "texts per second"),
                       (busy, "card busy [%] (NVML)" if source == "nvml"
                        else "workers' CPU [cores] (psutil: no card)")):
        ax.set_xticks(counts)
        ax.set(xlabel="workers per GPU", ylabel=ylabel)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.05)  # (a point at the top kept whole)
        ax.legend(fontsize=8)
    fig.suptitle("Higher is better: how many workers keep one card fed")
    return fig, study_finding(done)


def study_finding(done: pd.DataFrame) -> str:
    """``done``: ``study_runs``' rows."""
    if done.empty:
        return "no run of the study finished"
    best = done.loc[done["texts_per_s"].idxmax()]
    one = done[done["workers"] == done["workers"].min()]["texts_per_s"].max()
    use = (f"the card busy {best['busy_share']:.0%} of the time (NVML)"
           if best["busy_source"] == "nvml" else
           f"its workers using {best['busy_share']:.1f} cores (psutil: no card)")
    how = "" if best["layout"] == "default" else \
        f", tokenizing on {best['tokenizing'] or best['layout']}"
    found = (f"{int(best['workers'])} workers per GPU (workunit {best['workunit_size']}{how}"
             f") ran {best['texts_per_s']:,.0f} texts/s, {best['texts_per_s'] / one:.2f}x "
             f"{int(done['workers'].min())}, {use}.")
    tried = done[done["layout"] != "default"]
    if tried.empty:
        return found
    workers, size = int(tried["workers"].iloc[0]), tried["workunit_size"].iloc[0]
    same = done[done["workers"].eq(workers) & done["workunit_size"].eq(size)]
    each = [f"{r['tokenizing'] or r['layout']}{' (the default)' * (r['layout'] == 'default')} "
            f"{r['texts_per_s']:,.0f} texts/s"
            + (f" at {r['cpu_ms_per_text']:.2f} CPU ms a text"
               if pd.notna(r.get("cpu_ms_per_text")) else "")
            for _, r in same.sort_values("texts_per_s", ascending=False).iterrows()]
    return found + f" Tokenizing, {workers} worker(s) at workunit {size}: " + "; ".join(each) \
        + "."
