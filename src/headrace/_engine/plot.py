"""``headrace.plot``: draw a loader's stats timeline to a PNG (matplotlib, the ``plot`` extra).

Four panels over time: throughput; memory against its caps (drawn as horizontal lines); queue
depth and batches in flight against the queue cap (with ``tune=True``: the tuned threads and
window over time); where time went (the consumer waiting vs the
workers busy). The title is the verdict: loader-bound (the model waited) or model-bound.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from headrace._base.errors import ConfigError
from headrace._engine.timeline import load_timeline, summarize

__all__ = ["plot"]

_MIB = float(1 << 20)


def plot(source: Any, out: str | os.PathLike[str], *, title: str | None = None,
         dpi: int = 100, width_in: float = 10.0, height_in: float = 9.0) -> Path:
    """Draws a stats timeline to an image file (PNG by default, by ``out``'s suffix).

    Example::

        loader = headrace.Loader("train.hr", batch=256, epochs=None, timeline=True)
        for step, batch in zip(range(1000), loader):
            train_step(batch)
        headrace.plot(loader, "timeline.png")          # or save it first:
        json.dump(loader.stats_timeline(), open("timeline.json", "w"))
        headrace.plot("timeline.json", "timeline.png")

    Args:
        source: a loader created with ``timeline=True`` (anything with ``stats_timeline()``),
            a timeline dict, or the path of one saved as JSON.
        out: the image file to write (its folder must exist).
        title: a first title line (the verdict is always the last line).
        dpi, width_in, height_in: the figure's resolution and size (pixels = inches x dpi).

    Returns:
        The path written.

    Raises:
        ConfigError: ``source`` is not a timeline, or it holds no snapshot yet; matplotlib is
            missing (install ``headrace[plot]``).
    """
    timeline = load_timeline(source)
    samples = timeline.get("samples") or []
    if not samples:
        raise ConfigError("the timeline holds no snapshot yet; iterate the loader for at least "
                          "one period (timeline period_s) before plotting")
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("headrace.plot needs matplotlib: pip install 'headrace[plot]'") from None
    matplotlib.use("Agg", force=False)  # no display needed; a no-op if a backend is in use
    from matplotlib.figure import Figure

    summary = summarize(timeline)
    t = [s["t"] for s in samples]
    fig = Figure(figsize=(width_in, height_in), dpi=dpi, layout="constrained")
    ax_rate, ax_mem, ax_queue, ax_time = fig.subplots(4, 1, sharex=True)

    ax_rate.plot(t, [s["samples_per_second"] for s in samples], color="tab:blue")
    ax_rate.set_ylabel("samples/s")
    ax_rate.set_ylim(bottom=0)
    ax_mb = ax_rate.twinx()
    ax_mb.plot(t, [s["bytes_per_second"] / 1e6 for s in samples], color="tab:orange", alpha=0.6)
    ax_mb.set_ylabel("MB/s", color="tab:orange")
    ax_mb.set_ylim(bottom=0)
    ax_rate.set_title(f"throughput: {summary['samples_per_second']:,.0f} samples/s, "
                      f"{summary['bytes_per_second'] / 1e6:,.1f} MB/s on average", fontsize=9)

    ax_mem.plot(t, [s["counted_rss_bytes"] / _MIB for s in samples], label="process RSS (counted)",
                color="tab:red")
    ax_mem.plot(t, [s["page_cache_resident_bytes"] / _MIB for s in samples], label="page cache",
                color="tab:gray", linestyle=":")
    ax_mem.plot(t, [s["inflight_bytes"] / _MIB for s in samples], label="bytes in flight",
                color="tab:green")
    top = max(max(s[k] for s in samples) for k in
              ("counted_rss_bytes", "page_cache_resident_bytes", "inflight_bytes"))
    for key, label, color in (("max_process_rss_bytes", "RSS cap", "tab:red"),
                              ("max_inflight_bytes", "in-flight cap", "tab:green")):
        cap = timeline.get(key)
        if cap:
            top = max(top, cap)
            ax_mem.axhline(cap / _MIB, color=color, linestyle="--", linewidth=1,
                           label=f"{label} {cap / _MIB:,.0f} MiB")
    ax_mem.set_ylabel("MiB")
    ax_mem.set_yscale("symlog", linthresh=1.0)
    ax_mem.set_ylim(0, top / _MIB * 3)
    ax_mem.legend(fontsize=7, loc="upper left", ncols=3)
    ax_mem.set_title("memory vs caps (log scale)", fontsize=9)

    ax_queue.step(t, [s["queue_depth"] for s in samples], where="post", label="ready batches")
    ax_queue.step(t, [s["batches_in_flight"] for s in samples], where="post",
                  label="batches in flight", alpha=0.7)
    window = timeline.get("effective_max_queue_batches")
    if timeline.get("autotune_enabled"):  # the tuner's decisions, as they were taken
        ax_queue.step(t, [s.get("threads", 0) for s in samples], where="post", color="black",
                      label=f"threads (tuned, {timeline.get('autotune_adjustments') or 0} "
                            "adjustments)")
        ax_queue.step(t, [s.get("effective_max_queue_batches", 0) for s in samples],
                      where="post", color="black", linestyle="--", linewidth=1,
                      label="window (threads + prefetch, tuned)")
    elif window:
        ax_queue.axhline(window, color="black", linestyle="--", linewidth=1,
                         label=f"queue cap {window}")
    ax_queue.set_ylabel("batches")
    ax_queue.set_ylim(bottom=0)
    ax_queue.legend(fontsize=7, loc="upper left", ncols=3)
    ax_queue.set_title("queue depth", fontsize=9)

    ax_time.plot(t, [100 * s["consumer_wait_fraction"] for s in samples], color="tab:purple",
                 label=f"consumer waiting ({summary['consumer_wait_fraction']:.0%} overall)")
    ax_time.plot(t, [100 * s["worker_busy_fraction"] for s in samples], color="tab:cyan",
                 label=f"workers busy ({summary['worker_busy_fraction']:.0%} of "
                       f"{summary['threads']} threads)")
    ax_time.plot(t, [100 * s["budget_wait_fraction"] for s in samples], color="tab:olive",
                 alpha=0.7, label=f"budget wait ({summary['budget_wait_fraction']:.0%})")
    ax_time.set_ylim(0, 105)
    ax_time.set_ylabel("% of time")
    ax_time.set_xlabel("seconds")
    ax_time.legend(fontsize=7, loc="upper left", ncols=3)
    ax_time.set_title("where time went", fontsize=9)

    lines = [title] if title else []
    lines.append(summary["verdict"])
    fig.suptitle("\n".join(lines), fontsize=12)
    path = Path(out)
    fig.savefig(path)
    return path
