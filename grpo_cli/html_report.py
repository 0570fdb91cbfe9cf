"""``--report FILE.html``: the run's figures as charts in one self-contained HTML file.

Drawn with plotly (the ``report`` extra): its HTML embeds plotly.js, so the file opens
offline, fetches nothing, and keeps plotly's zoom and hover. The charts are what users plot by
hand from their rollouts: per value of each ``--by`` column the inactive fraction (all at
the minimum reward, all at the maximum, other constant) and the mean reward, a line over a
numeric column (steps) or bars over a text one (data sources); the group-mean distribution;
the group-size distribution. Everything comes from the summary: nothing is read again.
"""

from __future__ import annotations

import html
import importlib.util
from typing import Any

from grpo_cli.errors import GrpoError

REPORT_SUFFIXES = (".html", ".htm")


def check_report_path(path: str) -> None:
    """Refuse, before any work, a report grpo-cli cannot write."""
    if not path.lower().endswith(REPORT_SUFFIXES):
        raise GrpoError(f"--report {path}: write the report to an .html file (a page that opens offline)")
    if importlib.util.find_spec("plotly") is None:
        raise GrpoError("--report needs plotly: pip install 'grpo-cli[report]'")


def render(summary: dict[str, Any]) -> str:
    """The report of a run summary (:meth:`~grpo_cli.summary.RunSummary.to_dict`), as HTML."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    figures: list[Any] = []
    for column, values in (summary.get("by") or {}).items():
        figures.append(_by_figure(go, make_subplots, column, values))
    figures.append(_histogram_figure(go, summary["group_mean_histogram"]))
    figures.append(_size_figure(go, summary.get("group_size_counts") or {}))
    parts = []
    for number, figure in enumerate(figures):
        figure.update_layout(template="plotly_white", height=420, margin={"l": 60, "r": 30, "t": 60, "b": 50})
        parts.append(
            figure.to_html(full_html=False, include_plotlyjs=number == 0, config={"displaylogo": False})
        )
    title = f"grpo-cli report: {summary['input']['path']}"
    active = summary["active_groups"]
    groups = summary["groups"]
    share = f"{100 * active / groups:.1f}%" if groups else "0.0%"
    head = (
        f"{summary['rows']:,} rows, {groups:,} groups, {active:,} active ({share}), "
        f"{summary['inactive_groups']:,} inactive, {summary['singleton_groups']:,} singletons"
    )
    dump = summary["input"].get("from")
    read_as = (
        f"<p>Read as {html.escape(dump['dump'])}; groups from {html.escape(dump['group_key'])}.</p>"
        if dump
        else ""
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:24px;max-width:1100px}"
        "h1{font-size:20px}p{color:#333}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><p>{html.escape(head)}</p>{read_as}"
        + "".join(f'<div class="chart">{part}</div>' for part in parts)
        + "</body></html>\n"
    )


def _numeric(values: list[dict[str, Any]]) -> bool:
    return all(isinstance(v["value"], int | float) and not isinstance(v["value"], bool) for v in values)


def _by_figure(go: Any, make_subplots: Any, column: str, values: list[dict[str, Any]]) -> Any:
    x = [v["value"] for v in values] if _numeric(values) else [str(v["value"]) for v in values]
    groups = [v["groups"] or 1 for v in values]
    series = {
        "inactive: all at the minimum": [
            v["inactive"]["all_min"] / g for v, g in zip(values, groups, strict=True)
        ],
        "inactive: all at the maximum": [
            v["inactive"]["all_max"] / g for v, g in zip(values, groups, strict=True)
        ],
        "inactive: other": [
            (v["inactive_groups"] - v["inactive"]["all_min"] - v["inactive"]["all_max"]) / g
            for v, g in zip(values, groups, strict=True)
        ],
    }
    figure = make_subplots(specs=[[{"secondary_y": True}]])
    line = _numeric(values)
    for name, ys in series.items():
        if line:
            figure.add_trace(
                go.Scatter(x=x, y=ys, name=name, mode="lines+markers", stackgroup="inactive"),
                secondary_y=False,
            )
        else:
            figure.add_trace(go.Bar(x=x, y=ys, name=name), secondary_y=False)
    figure.add_trace(
        go.Scatter(
            x=x,
            y=[v["reward_mean"] for v in values],
            name="mean reward",
            mode="lines+markers",
            line={"color": "black", "dash": "dot"},
        ),
        secondary_y=True,
    )
    if not line:
        figure.update_layout(barmode="stack")
    figure.update_layout(title=f"Inactive groups and mean reward by {column}")
    figure.update_xaxes(title_text=column)
    figure.update_yaxes(title_text="fraction of groups", tickformat=".0%", secondary_y=False)
    figure.update_yaxes(title_text="mean reward", secondary_y=True)
    return figure


def _histogram_figure(go: Any, histogram: dict[str, Any]) -> Any:
    counts = histogram["counts"]
    edges = histogram["edges"]
    labels = histogram.get("labels") or [
        f"[{edges[i]:.3g}, {edges[i + 1]:.3g}{']' if i == len(counts) - 1 else ')'}"
        for i in range(len(counts))
    ]
    figure = go.Figure(go.Bar(x=labels, y=counts, marker_color="#4C78A8"))
    title = (
        "Group solve rate (k of G correct)" if histogram.get("kind") == "solve_rate" else "Group mean reward"
    )
    figure.update_layout(title=f"{title}: groups per bin", xaxis_title="group mean", yaxis_title="groups")
    return figure


def _size_figure(go: Any, counts: dict[str, int]) -> Any:
    sizes = sorted(counts, key=int)
    figure = go.Figure(
        go.Bar(x=[str(s) for s in sizes], y=[counts[s] for s in sizes], marker_color="#72B7B2")
    )
    figure.update_layout(
        title="Group sizes: groups of each size", xaxis_title="rollouts in the group", yaxis_title="groups"
    )
    figure.update_xaxes(type="category")
    return figure
