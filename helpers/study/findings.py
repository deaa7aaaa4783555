"""One-line findings computed from result tables: what each figure shows, in numbers.

Nothing here is written by hand about a result: every sentence is filled in from the table it
describes, so a re-run on other hardware rewrites the findings with the figures.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from helpers.study.experiments import MIN_WORKUNITS
from helpers.study.figures import STRATEGY_LABELS
from helpers.workloads.binning.rule import BINS

SECONDS_PER_DAY = 86_400


def mean_sd(frame: pd.DataFrame, by: Sequence[str], metric: str = "records_per_s") -> pd.DataFrame:
    """Mean, sd and replicate count of ``metric`` per configuration ``by``, best first."""
    grouped = frame.groupby(list(by))[metric].agg(["mean", "std", "count"]).reset_index()
    return grouped.fillna({"std": 0.0}).sort_values("mean", ascending=False, ignore_index=True)


def estimate(frame: pd.DataFrame, by: Sequence[str], total_records: int) -> pd.DataFrame:
    """``mean_sd`` per configuration plus the days ``total_records`` would take at each rate."""
    stats = mean_sd(frame, by)
    return stats.assign(estimated_days=[days(total_records, r) for r in stats["mean"]])


def _rate(row: pd.Series) -> str:
    runs = row.get("count", 2)
    return f"{row['mean']:.1f}{_spread(row['std'], runs)} records/s" + (
        "" if runs > 1 else " (one run)")


def _spread(sd: float, runs: int) -> str:
    """`` ± sd`` over several runs; nothing where there is one (no spread to say)."""
    return f" ± {sd:.1f}" if runs > 1 else ""


def days(total_records: int, records_per_s: float) -> float:
    """Days to process ``total_records`` at ``records_per_s``."""
    return total_records / records_per_s / SECONDS_PER_DAY if records_per_s > 0 else float("inf")


def few_workunits(table: pd.DataFrame) -> str:
    """'' when every queue-fed worker had at least MIN_WORKUNITS workunits on average; else a
    clause naming the configurations that did not (their rate weighs their last workunits).
    A table without records, workunit_size and workers columns says nothing of it: ''."""
    if not {"records", "workunit_size", "workers"} <= set(table):
        return ""
    queued = table[table["strategy"] != "static"] if "strategy" in table else table
    per_worker = queued["records"] / queued["workunit_size"] / queued["workers"]
    short = queued.assign(per_worker=per_worker)[per_worker < MIN_WORKUNITS]
    if short.empty:
        return ""
    named = short.groupby(["workers", "workunit_size"])["per_worker"].mean()
    return (f"; fewer than {MIN_WORKUNITS} workunits per worker, so the job's end weighs on the "
            f"rate: " + ", ".join(f"{w} worker{'s' if w != 1 else ''} × {s} records: {n:.1f}"
                                   for (w, s), n in named.items()))


def _sizes_used(table: pd.DataFrame) -> str:
    """'workunits of 37, 18, 9 records for 1, 2, 4 workers' (queue-fed rows)."""
    if "workunit_size" not in table:
        return "queue-fed workunit sizes not recorded"
    queued = table[table["strategy"] == "queue"] if "strategy" in table else table
    sizes = queued.groupby("workers")["workunit_size"].first()
    return (f"queue-fed workunits of {', '.join(map(str, sizes))} records for "
            f"{', '.join(map(str, sizes.index))} workers")


def workers_per_device(table: pd.DataFrame, total_records: int) -> str:
    """Best worker count per strategy, the others relative to it, the workunit sizes and the
    corpus estimate."""
    parts = []
    for strategy in ("queue", "static"):
        stats = mean_sd(table[table["strategy"] == strategy], ["workers"])
        if not stats.empty:
            named = _ranked(stats, "workers", lambda n: f"{n} worker{'s' if n != 1 else ''}")
            parts.append(f"{STRATEGY_LABELS[strategy]}: {named}")
    best = mean_sd(table, ["strategy", "workers"]).iloc[0]
    return "; ".join(parts) + f"; {total_records:,} chunks would take " \
        f"{days(total_records, best['mean']):.1f} days at the best rate; {_sizes_used(table)}" \
        + few_workunits(table)


def _ranked(stats: pd.DataFrame, key: str, name: Callable[[int], str]) -> str:
    """'2 workers best at 21.0 ± 1.4 records/s (1: 0.52×, 4: 0.86×)' from best-first stats."""
    best = stats.iloc[0]
    others = ", ".join(f"{int(r[key])}: {r['mean'] / best['mean']:.2f}×"
                       for _, r in stats.iloc[1:].sort_values(key).iterrows())
    return f"{name(int(best[key]))} best at {_rate(best)}" + (f" ({others})" if others else "")


def round_efficiency(rounds: pd.DataFrame, label: str) -> str:
    """How busy a static round keeps its workers, and where the waiting goes."""
    efficiency = rounds["efficiency"].mean()
    return (f"{label}: a static round keeps its workers busy {efficiency:.0%} of the time on "
            f"average over {len(rounds)} rounds (the rest is waiting for the slowest worker); "
            f"{rounds['records_per_s'].mean():.1f} records/s")


def workunit_sizes(table: pd.DataFrame) -> str:
    """The fastest workunit size and how the others compare with it."""
    stats = mean_sd(table, ["workunit_size"])
    return f"on {table['devices'].iloc[0]}: " + \
        _ranked(stats, "workunit_size", lambda n: f"workunit size {n}") + few_workunits(table)


def layouts(table: pd.DataFrame, label: str) -> str:
    """Queue-fed against static split on the same devices and records."""
    stats = mean_sd(table, ["strategy"]).set_index("strategy")
    queue, static = stats.loc["queue"], stats.loc["static"]
    busy = table.groupby("strategy")["efficiency"].mean()
    return (f"{label}: queue-fed {queue['mean']:.1f} records/s vs static split "
            f"{static['mean']:.1f} ({queue['mean'] / static['mean']:.2f}×); workers busy "
            f"{busy['queue']:.0%} vs {busy['static']:.0%} of the time" + few_workunits(table))


def backends(table: pd.DataFrame) -> str:
    """Threads sharing a model against a process per model, at the largest common worker count."""
    n = int(table["workers"].max())
    at_n = table[table["workers"] == n].groupby("backend")[["records_per_s", "peak_rss_mib"]].mean()
    if not {"thread", "process"} <= set(at_n.index):
        return f"only {', '.join(at_n.index)} measured"
    thread, process = at_n.loc["thread"], at_n.loc["process"]
    return (f"at {n} workers: processes reach {process['records_per_s']:.1f} records/s at "
            f"{process['peak_rss_mib']:.0f} MiB peak RSS, threads {thread['records_per_s']:.1f} "
            f"records/s at {thread['peak_rss_mib']:.0f} MiB "
            f"({process['records_per_s'] / thread['records_per_s']:.2f}× the throughput for "
            f"{process['peak_rss_mib'] / thread['peak_rss_mib']:.2f}× the memory)"
            + few_workunits(table))


def best_configurations(tables: dict[str, pd.DataFrame], total_records: int) -> pd.DataFrame:
    """Per experiment and device set, the configuration with the highest mean throughput and the
    days it would take to process ``total_records`` at that rate."""
    rows = []
    for experiment, table in tables.items():
        keys = [k for k in ("strategy", "backend", "workers", "workunit_size") if k in table]
        for devices, part in table.groupby("devices"):
            best = mean_sd(part, keys).iloc[0]
            rows.append({"experiment": experiment, "devices": devices,
                         "configuration": ", ".join(f"{k}={best[k]}" for k in keys),
                         "records_per_s": best["mean"], "records_per_s_sd": best["std"],
                         "replicates": int(best["count"]),
                         "estimated_days": days(total_records, best["mean"])})
    return pd.DataFrame(rows).sort_values("records_per_s", ascending=False, ignore_index=True)


def summary(best: pd.DataFrame, total_records: int) -> str:
    top = best.iloc[0]
    return (f"fastest measured: {top['configuration']} on {top['devices']} "
            f"({top['experiment']}) at {top['records_per_s']:.1f} records/s: {total_records:,} "
            f"chunks in {top['estimated_days']:.1f} days")


def binning_layouts(table: pd.DataFrame) -> str:
    """Queue-fed against static split for each worker count of the binning workload."""
    parts, fewest = [], table["workers"].min()
    for workers, rows in table.groupby("workers"):
        rates = rows.groupby("strategy")["records_per_s"].mean()
        scaled = "" if workers == fewest or "speedup" not in rows else \
            f", {rows[rows['strategy'] == 'queue']['speedup'].mean():.2f}× {fewest} worker" \
            f"{'s' * int(fewest > 1)}"
        parts.append(f"{workers} worker{'s' if workers > 1 else ''}: queue-fed "
                     f"{rates['queue']:.2f} images/s{scaled} vs static {rates['static']:.2f} "
                     f"({rates['queue'] / rates['static']:.2f}×)")
    return f"on {table['device'].iloc[0]}: " + "; ".join(parts) + few_workunits(table)


def model_time(times: pd.DataFrame) -> str:
    """Where an image's time goes: each model's share of the summed per-image seconds."""
    per_model = times.groupby("model")["seconds"].sum().sort_values(ascending=False)
    per_image = times.groupby("id")["seconds"].sum().mean()
    shares = ", ".join(f"{name} {s / per_model.sum():.0%}" for name, s in per_model.items())
    return f"{per_image:.2f} s per image on average: {shares}"


def bin_counts(table: pd.DataFrame) -> str:
    """How many images landed in each bin, and how many failed."""
    counts = table[table["error"] == ""]["bin"].value_counts()
    failed = int((table["error"] != "").sum())
    bins = ", ".join(f"{b}: {int(counts.get(b, 0))}" for b in BINS)
    return f"{len(table)} images: {bins}" + (f"; {failed} failed" if failed else "")


def self_tuning(runs: pd.DataFrame) -> str:
    """Per job length: the self-tuning run's rate against the best fixed configuration's, its
    makespan against the ideal, and the workers it ended with."""
    parts = []
    for job, rows in runs.groupby("job", sort=False):
        fixed = mean_sd(rows[rows["layout"] == "fixed"], ["workers_per_device", "workunit_size"])
        auto = rows[rows["layout"] == "self-tuning"]
        best = fixed.iloc[0]
        parts.append(
            f"{int(auto['records'].iloc[0]):,}-record job (ideal {auto['ideal_s'].iloc[0]:.1f} s): "
            f"self-tuning {auto['records_per_s'].mean():.0f} records/s = "
            f"{auto['records_per_s'].mean() / best['mean']:.2f}× the best fixed configuration "
            f"({best['workers_per_device']} per device, workunits of {best['workunit_size']}), "
            f"makespan {auto['makespan_vs_ideal'].mean():.2f}× the ideal, "
            f"devices finishing within {auto['finish_spread_s'].mean():.2f} s of each other, "
            f"ending with {auto['final_workers'].iloc[0]}")
    return "; ".join(parts)


def _medians(runs: int) -> str:
    """How many runs a figure is the median of; one run said as such (runs here move 10-20 %)."""
    return f"medians of {runs}" if runs > 1 else "one run each, no median"


def _ratio_over(replicates: int, ratio: float | None = None) -> str:
    """Which ratio a finding gives (``ratio`` said again where the sentence has not)."""
    said = "" if ratio is None else f" {ratio:.2f}"
    return (f"median ratio{said} over {replicates} interleaved replicates" if replicates > 1
            else f"ratio{said} of one run each, no median")


def tuned_against(table: pd.DataFrame, tuned: str, reference: str, tuner_seconds: float) -> str:
    """The tuner's pick against a reference configuration, measured side by side."""
    rates = table.groupby("configuration")["records_per_s"]
    mean, sd, runs = rates.mean(), rates.std().fillna(0.0), rates.count()
    ratios = table.pivot(index="replicate", columns="configuration", values="records_per_s")
    ratio = (ratios[tuned] / ratios[reference]).median()
    return (f"{tuned}: {mean[tuned]:.1f}{_spread(sd[tuned], runs[tuned])} records/s, "
            f"{reference}: {mean[reference]:.1f}{_spread(sd[reference], runs[reference])} "
            f"({_ratio_over(len(ratios), ratio)}); the tuner took {tuner_seconds:.0f} s")


def trials(table: pd.DataFrame) -> str:
    """The tuner's pick (the trials table's ``picked`` row) and the fastest trial overall."""
    pick = table[table["picked"]].iloc[0]
    fastest = table["records_per_s"].max()
    refused = int(table["refused"].fillna("").ne("").sum()) if "refused" in table else 0
    said = pick["configuration"].partition(": ")[2].removesuffix(" (picked)")  # (trials_table)
    return (f"{len(table)} trials"
            + (f" ({refused} variant{'s' * (refused != 1)} refused by the quality guard)"
               if refused else "")
            + f"; picked: {said} at {pick['records_per_s']:.1f} records/s "
            f"({pick['records_per_s'] / fastest:.2f}× the fastest trial)" + _card_busy(table, pick))


def _card_busy(table: pd.DataFrame, pick: pd.Series) -> str:
    """'; the simulated card 30% busy (the busiest trial 31%)', where the trials ran on one."""
    if "card_busy_share" not in table or pd.isna(pick.get("card_busy_share")):
        return ""
    return (f"; the simulated card {pick['card_busy_share']:.0%} busy there (the busiest "
            f"trial {table['card_busy_share'].max():.0%})")


def scale_out(table: pd.DataFrame) -> str:
    """The ray backend's steady state and spin-up against the process backend's (notebook 8's
    side-by-side table: interleaved replicates, models loaded)."""
    rates = table.pivot(index="replicate", columns="backend", values="records_per_s")
    ratio = (rates["ray"] / rates["process"]).median()
    first = table.groupby("backend")[["spinup_s", "cluster_start_s"]].first()
    mean = table.groupby("backend")["records_per_s"].agg(["mean", "std", "count"]).fillna(0.0)
    return (f"steady state, models loaded: ray {mean.loc['ray', 'mean']:.1f}"
            f"{_spread(mean.loc['ray', 'std'], mean.loc['ray', 'count'])} records/s, process "
            f"{mean.loc['process', 'mean']:.1f}"
            f"{_spread(mean.loc['process', 'std'], mean.loc['process', 'count'])}: ray at "
            f"{ratio:.2f}× the process backend "
            f"({_ratio_over(len(rates))}); spin-up: ray "
            f"{first.loc['ray', 'cluster_start_s'] + first.loc['ray', 'spinup_s']:.1f} s (Ray's "
            f"own start {first.loc['ray', 'cluster_start_s']:.1f} s, then its actors "
            f"{first.loc['ray', 'spinup_s']:.1f} s), process "
            f"{first.loc['process', 'spinup_s']:.1f} s")


def driver_limit(table: pd.DataFrame) -> str:
    """How many rows a second one driver's writer takes, from each backend and alone."""
    rows = table.groupby("backend")["rows_per_s"].median()
    dim = int(table["dim"].iloc[0])
    alone = rows.pop("writer alone") if "writer alone" in rows else np.nan
    each = ", ".join(f"from {backend} workers {rate:,.0f}" for backend, rate in
                     rows.sort_values(ascending=False).items())
    return (f"the driver's writer takes {each} rows/s of {dim}-d float32 "
            f"({_medians(table['replicate'].nunique())}); the writer alone {alone:,.0f}")


def simulated_cluster(table: pd.DataFrame, workers_per_node: int) -> str:
    """The job on the simulated cluster, whole and with a node lost."""
    whole = table[table["job"] == "whole"].iloc[0]
    lost = table[table["job"] != "whole"].iloc[0]
    deaths = int(lost["deaths"])
    return (f"{int(whole['nodes'])} simulated nodes × {workers_per_node} "
            f"actor{'s' * (workers_per_node != 1)}: {whole['records_per_s']:.1f} records/s; with "
            f"the last node lost at {lost['lost_at_s']:g} s: {lost['records_per_s']:.1f} "
            f"records/s ({lost['records_per_s'] / whole['records_per_s']:.2f}× whole: the simulated "
            f"nodes share this machine's cores), {deaths} actor{'s' * (deaths != 1)} died and "
            f"{'their' if deaths != 1 else 'its'} workunits were redone on the others; "
            f"every id once: {bool(whole['exactly_once'] and lost['exactly_once'])}")


def peers(table: pd.DataFrame) -> str:
    """gpufeed beside the peers (notebook 9): each system's steady state as a multiple of bare
    encode's in the same replicate (median), the fastest end to end, and the memory each took."""
    ratios = table.pivot(index="replicate", columns="label", values="records_per_s")
    bare = ratios.pop("bare model.encode") if "bare model.encode" in ratios else None
    median = table.groupby("label")[["records_per_s", "end_to_end_s", "peak_pss_mib",
                                     "spinup_s"]].median()
    ranked = median.sort_values("records_per_s", ascending=False)
    steady = ", ".join(
        f"{label} {row.records_per_s:.1f}"
        + (f" ({(ratios[label] / bare).median():.2f}× bare)" if bare is not None else "")
        for label, row in ranked.iterrows() if label != "bare model.encode")
    quickest = median["end_to_end_s"].idxmin()
    lightest, heaviest = median["peak_pss_mib"].idxmin(), median["peak_pss_mib"].idxmax()
    floor = f"bare model.encode {median.loc['bare model.encode', 'records_per_s']:.1f} " \
        "records/s; " if bare is not None else ""
    return (f"steady state (models loaded, {_medians(table['replicate'].nunique())}): {floor}"
            f"{steady}; end to end on {int(table['records'].iloc[0])} records, {quickest} is "
            f"quickest ({median.loc[quickest, 'end_to_end_s']:.1f} s, of which spin-up "
            f"{median.loc[quickest, 'spinup_s']:.1f} s); peak memory from {lightest} "
            f"({median.loc[lightest, 'peak_pss_mib']:,.0f} MiB) to {heaviest} "
            f"({median.loc[heaviest, 'peak_pss_mib']:,.0f} MiB)")


def faults(table: pd.DataFrame) -> str:
    """Who survives a model process killed mid-run (notebook 9's fault table)."""
    killed = table[table["killed_pid"].notna()]
    whole = killed[(killed["outcome"] == "finished") & (killed["rows_lost"] == 0)
                   & (killed["rows_duplicated"] == 0)]
    parts = [f"with one model process SIGKILLed mid-run, every row came back once from "
             f"{_names(whole)}" if len(whole) else "no system returned every row once"]
    for outcome, verb in (("failed", "failed"), ("hung", "hung past the time limit")):
        rows = killed[killed["outcome"] == outcome]
        if len(rows):
            parts.append(f"{verb}: " + ", ".join(
                f"{r.label} ({r.rows_lost:,} of {r.records:,} rows lost"
                + (f"; {r.error}" if r.error else "") + ")" for r in rows.itertuples()))
    damaged = killed[(killed["outcome"] == "finished") & ((killed["rows_lost"] > 0)
                                                         | (killed["rows_duplicated"] > 0))]
    if len(damaged):
        parts.append("finished with rows lost or twice: " + ", ".join(
            f"{r.label} ({r.rows_lost} lost, {r.rows_duplicated} twice)"
            for r in damaged.itertuples()))
    spared = table[table["killed_pid"].isna()]
    if len(spared):
        parts.append("not killed: " + ", ".join(f"{r.label} ({r.fault})"
                                                for r in spared.itertuples()))
    return "; ".join(parts)


def _names(rows: pd.DataFrame) -> str:
    return ", ".join(rows["label"])


def card_busy(table: pd.DataFrame, by: Sequence[str]) -> str:
    """How busy the simulated card was at each layout ``by`` names (helpers.study.feeding),
    and, where the table has it, the most this machine's cores could keep it busy."""
    from helpers.study.feeding import AXES, layout_name

    stats = mean_sd(table, list(by), "card_busy_share")
    best = stats.iloc[0]
    runs = int(best["count"])
    axes = " × ".join(AXES[column][1] for column in by)
    others = ", ".join(f"{layout_name(r, by, short=True)}: {r['mean']:.0%}"
                       for _, r in stats.iloc[1:].iterrows())
    first = table.iloc[0]
    scaled = "" if pd.isna(first["card_cores"]) else \
        f", scaled to {int(first['cores'])} of {int(first['card_cores'])} cores"
    verdict = "the card waits for its CPU" if best["mean"] < 0.85 else "the card is fed"
    spread = "" if runs < 2 else f" ± {best['std']:.0%}"
    limit = "" if "card_busy_limit" not in table else _limit(table["card_busy_limit"].median())
    return (f"the {first['card']}{scaled} was busiest at {best['mean']:.0%}{spread} with "
            f"{layout_name(best, by)}" + (f" ({axes}: {others})" if others else "")
            + f": {verdict}{limit}")


def _limit(share: float) -> str:
    """What every core here could do for the card, at the runs' CPU per token."""
    if share >= 1:
        return (f" (every core here could feed {share:.1f} such cards at these runs' CPU per "
                f"token)")
    return f" (every core here would keep it {share:.0%} busy at these runs' CPU per token)"


def card_feeding(table: pd.DataFrame) -> str:
    """Notebook 01's: ``card_busy`` by workers × tokenizing (threads or processes), how many
    of this machine's cores one real card would need (helpers.study.feeding), and what the
    default tokenized on at each count of workers (its processes: each worker's share of the
    cores less its own thread), where the table has default runs."""
    from helpers.study.feeding import cores_needed

    return (card_busy(table, ["workers", "tokenizing"]) + f"; at its cheapest layout's CPU "
            f"per token, one real card needs {cores_needed(table):.0f} of these cores to be fed"
            + _default_tokenizing(table))


def _default_tokenizing(table: pd.DataFrame) -> str:
    """"; the default tokenized on 8 processes at 1 worker, 7 processes at 2 workers" (the runs
    whose ``tokenizing_asked`` is "default"; "" where none is)."""
    if "tokenizing_asked" not in table:
        return ""
    default = table[table["tokenizing_asked"] == "default"].drop_duplicates("workers") \
        .sort_values("workers")
    each = [f"{words} at {int(n)} worker{'s' * (n > 1)}"
            for words, n in zip(default["tokenizing"], default["workers"])]
    return f"; the default tokenized on {', '.join(each)}" if each else ""
