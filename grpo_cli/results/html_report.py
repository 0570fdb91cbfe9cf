"""``--report FILE``: the run's figures as charts, in one self-contained HTML page or a picture.

The charts are SVG drawn at write time (:mod:`grpo_cli.results.charts`): no plotting library
and no script, so the page is tens of kilobytes, opens offline at once and fetches nothing; a
chart's hover is the browser's own tooltip. Each chart is drawn twice, for a laptop and for a
phone, and the page shows the one its width calls for. The page opens with the verdict and the
counts the terminal prints, then the charts, each the kind its axis calls for: per value of each
``--by`` column the share of groups inactive (all at the minimum reward, all at the maximum,
another value) and the mean reward, each on an axis from zero, as areas and a line over a numeric
column (steps: whole-number ticks, markers only over a few) or as bars ranked worst first and
dots over a text one (data sources: the values past the first 15 summed into one bar); the
group-mean distribution (k of G for binary rewards); the group sizes; then each ``--by``
column's values in a table sortable by any heading. Everything comes from the summary: nothing
is read again.

A ``.svg`` report is the charts stacked in one SVG document under the title and the verdict,
written by Python alone; a ``.png`` is that document drawn by a headless Chromium found on
``PATH``, which runs in a private temporary profile, offline, and leaves nothing.
"""

from __future__ import annotations

import contextlib
import html
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_cli.errors import GrpoError, mention
from grpo_cli.results import charts

PAGE_SUFFIXES = (".html", ".htm")
PICTURE_SUFFIXES = (".png", ".svg")
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
"""The headless browser a PNG is drawn with, the first found on ``PATH``."""
PAGE_WIDTH = 1100
"""The widest the page's text and charts grow (a laptop's charts are drawn at this width)."""
PHONE_WIDTH = 360
"""A phone's charts are drawn at this width (the page shows them up to 600 px)."""
_BROWSER_SECONDS = 120


def check_report_path(path: str) -> None:
    """Refuse, before any work, a report grpo-cli cannot write."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in PAGE_SUFFIXES + PICTURE_SUFFIXES:
        raise GrpoError(
            f"{mention('report')} {path}: write the report to an .html file (a page that opens offline), "
            "or a .png or .svg picture of it"
        )
    if suffix == ".png" and browser() is None:
        raise GrpoError(
            f"{mention('report')} {path}: a .png picture is drawn by a headless Chromium, and none is on "
            "PATH "
            f"({', '.join(BROWSERS[:3])}); install one (Debian: apt-get install chromium), or write "
            "the report to an .html file or an .svg picture, which need no browser"
        )


def browser() -> str | None:
    """The headless browser a PNG is drawn with, or None."""
    return next((found for name in BROWSERS if (found := shutil.which(name)) is not None), None)


def report_bytes(summary: dict[str, Any], path: str) -> bytes:
    """The report of ``summary`` as the file ``path`` names it: the page, or a picture of it."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix == ".svg":
        return picture_svg(summary).encode("utf-8")
    if suffix == ".png":
        document, height = _picture(summary)
        return _screenshot(document, width=PAGE_WIDTH, height=height)
    return render(summary).encode("utf-8")


def _headline(summary: dict[str, Any]) -> tuple[str, str]:
    """The report's title and its line of figures."""
    active = summary["active_groups"]
    groups = summary["groups"]
    share = f"{100 * active / groups:.1f}%" if groups else "0.0%"
    return (
        f"grpo-cli report: {summary['input']['path']}",
        f"{summary['rows']:,} rows, {groups:,} groups, {active:,} active ({share}), "
        f"{summary['inactive_groups']:,} inactive, {summary['singleton_groups']:,} singletons",
    )


DRAWN_BY: dict[str, Callable[..., str]] = {
    "ordered": charts.ordered_chart,
    "ranked": charts.ranked_chart,
    "bars": charts.bar_chart,
}
"""Each kind of chart and the function that draws it."""


@dataclass(frozen=True)
class Chart:
    """One chart of the report: its heading, and how to draw it at a width (with its title
    inside the drawing, for a picture, or without, under the page's own heading)."""

    title: str
    kind: str
    data: dict[str, Any]

    def svg(self, width: float, *, titled: bool = False) -> str:
        draw: Callable[..., str] = DRAWN_BY[self.kind]
        return draw(**self.data, width=width, title=self.title if titled else None)


def report_charts(summary: dict[str, Any]) -> list[Chart]:
    """The report's charts, in page order: one per ``--by`` column, the group means, every
    row's reward, the group sizes."""
    found = [_by_chart(column, values) for column, values in (summary.get("by") or {}).items()]
    found.append(_histogram_chart(summary["group_mean_histogram"]))
    rewards = summary.get("reward_histogram") or {}
    if rewards.get("counts"):
        found.append(_reward_chart(rewards))
    found.append(_size_chart(summary.get("group_size_counts") or {}))
    return found


def render(summary: dict[str, Any]) -> str:
    """The report of a run summary (:meth:`~grpo_cli.results.summary.RunSummary.to_dict`), as HTML."""
    parts = [
        f"<h3>{html.escape(chart.title)}</h3>"
        f'<div class="wide">{chart.svg(PAGE_WIDTH)}</div><div class="narrow">{chart.svg(PHONE_WIDTH)}</div>'
        for chart in report_charts(summary)
    ]
    title, head = _headline(summary)
    dump = summary["input"].get("from")
    read_as = (
        f"<p>Read as {html.escape(dump['dump'])}; groups from {html.escape(dump['group_key'])}.</p>"
        if dump
        else ""
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><p>{html.escape(head)}</p>{read_as}"
        + verdict_html(summary)
        + counts_html(summary)
        + _TERMS
        + "".join(f'<div class="chart">{part}</div>' for part in parts)
        + "".join(by_table_html(column, values) for column, values in (summary.get("by") or {}).items())
        + f"<script>{_SORTABLE}</script></body></html>\n"
    )


def verdict_line(summary: dict[str, Any]) -> str:
    """The verdict in one line, as a picture's header says it.

    >>> verdict_line({"checks": [{"name": "min-groups", "passed": False}, {"name": "x", "passed": True}]})
    'FAIL: 1 of 2 checks failed (min-groups)'
    """
    checks = summary.get("checks") or []
    failed = [check["name"] for check in checks if not check["passed"]]
    if not checks:
        return "No checks asked"
    if failed:
        return f"FAIL: {len(failed)} of {len(checks)} checks failed ({', '.join(failed)})"
    return f"PASS: all {len(checks)} checks passed"


def picture_svg(summary: dict[str, Any]) -> str:
    """The report as one SVG document: the title, its line of figures and the verdict, then
    every chart (drawn at the page's width, each with its title), stacked."""
    return _picture(summary)[0]


def _picture(summary: dict[str, Any]) -> tuple[str, int]:
    """:func:`picture_svg`'s document and its height in pixels (its width is :data:`PAGE_WIDTH`)."""
    title, head = _headline(summary)
    verdict = verdict_line(summary)
    colour = (
        "#a50e0e" if verdict.startswith("FAIL") else "#137333" if verdict.startswith("PASS") else "#3c4043"
    )
    parts, top = [], 104.0
    for chart in report_charts(summary):
        drawn = chart.svg(PAGE_WIDTH, titled=True)
        height = float(re.search(r'height="(\d+)"', drawn).group(1))  # type: ignore[union-attr]
        parts.append(drawn.replace('<svg class="chart-svg"', f'<svg x="0" y="{top:g}" class="chart-svg"', 1))
        top += height + 16
    extent = int(top) - 16
    document = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{PAGE_WIDTH}" height="{extent}" '
        f'viewBox="0 0 {PAGE_WIDTH} {extent}" font-family="{charts.FONT}">'
        '<rect width="100%" height="100%" fill="white"/>'
        f'<text x="8" y="30" font-size="20" font-weight="bold">{html.escape(title)}</text>'
        f'<text x="8" y="56" font-size="14" fill="#333">{html.escape(head)}</text>'
        f'<text x="8" y="82" font-size="15" font-weight="600" fill="{colour}">{html.escape(verdict)}</text>'
        + "".join(parts)
        + "</svg>\n"
    )
    return document, extent


_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:16px;max-width:1100px}"
    "h1{font-size:20px;overflow-wrap:anywhere}h2{font-size:16px;margin-top:20px}p{color:#333}"
    "h3{font-size:15px;margin:18px 0 0;font-weight:600}table{display:block;overflow-x:auto;max-width:100%}"
    ".chart svg{display:block;width:100%;height:auto}.chart .narrow{display:none}"
    "@media (max-width:600px){.chart .wide{display:none}.chart .narrow{display:block}}"
    "table{border-collapse:collapse;margin:8px 0}td,th{padding:3px 10px;text-align:left;"
    "border-bottom:1px solid #e5e5e5;vertical-align:top}"
    "td.n{text-align:right;font-variant-numeric:tabular-nums}"
    ".verdict{font-size:18px;font-weight:600;padding:8px 12px;border-radius:4px;display:inline-block}"
    ".pass{background:#e6f4ea;color:#137333}.fail{background:#fce8e6;color:#a50e0e}"
    ".none{background:#f1f3f4;color:#3c4043}ul{padding-left:20px}.chart{max-width:100%;overflow-x:auto}"
    "table.sortable th{cursor:pointer;user-select:none}table.sortable{font-size:14px}"
)


_TERMS = (
    "<p>A group is <b>inactive</b> when every rollout in it got the same reward: its advantages "
    "are all zero and it teaches nothing. <b>All at the minimum</b>: every rollout got the lowest "
    "reward the run saw (all failed); <b>all at the maximum</b>: the highest (all solved); "
    "<b>all another value</b>: the same reward in between.</p>"
)

_SORTABLE = (
    "document.querySelectorAll('table.sortable th').forEach((th, col) => th.addEventListener('click', () => {"
    " const body = th.closest('table').tBodies[0]; const rows = Array.from(body.rows);"
    " const up = th.dataset.dir !== 'up'; th.dataset.dir = up ? 'up' : 'down';"
    " const key = r => { const t = r.cells[col].dataset.v ?? r.cells[col].textContent;"
    " const n = parseFloat(t); return isNaN(n) ? t : n; };"
    " rows.sort((a, b) => { const x = key(a), y = key(b);"
    " return (x > y ? 1 : x < y ? -1 : 0) * (up ? 1 : -1); });"
    " rows.forEach(r => body.appendChild(r)); }));"
)


def by_table_html(column: str, values: list[dict[str, Any]]) -> str:
    """Every value of a ``--by`` column with its counts, sortable by any column (a click on its
    heading), the worst inactive fraction first.

    >>> page = by_table_html("step", [{"value": 1, "groups": 4, "rows": 32, "inactive_groups": 1,
    ...     "inactive": {"all_min": 1, "all_max": 0, "other": 0}, "reward_mean": 0.5}])
    >>> '<td class="n" data-v="0.25">25.0%</td>' in page and 'class="sortable"' in page
    True
    """
    ranked = sorted(values, key=lambda v: -(v["inactive_groups"] / v["groups"]) if v["groups"] else 0.0)
    rows = []
    for v in ranked:
        parts = _inactive_parts(v)
        share = v["inactive_groups"] / v["groups"] if v["groups"] else 0.0
        mean = v.get("reward_mean")
        cells = [
            f"<td>{html.escape(str(v['value']))}</td>",
            _number_cell(v["groups"], f"{v['groups']:,}"),
            _number_cell(v["rows"], f"{v['rows']:,}"),
            _number_cell(share, f"{100 * share:.1f}%"),
            *(_number_cell(parts[key], f"{parts[key]:,}") for key, _, _ in _INACTIVE_PARTS),
            _number_cell(mean, "" if mean is None else f"{mean:.4g}"),
        ]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    head = "".join(
        f"<th>{html.escape(name)}</th>"
        for name in (column, "groups", "rows", "inactive", "all min", "all max", "another", "mean reward")
    )
    return (
        f"<h2>By {html.escape(column)} (click a heading to sort)</h2>"
        f'<table class="sortable"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )


def _number_cell(value: float | None, shown: str) -> str:
    """A table cell showing ``shown``, sorted by ``value`` (a blank sorts first)."""
    return f'<td class="n" data-v="{"" if value is None else f"{value:.10g}"}">{html.escape(shown)}</td>'


def verdict_html(summary: dict[str, Any]) -> str:
    """The page's first answer: each check with its value, bound and PASS or FAIL (or that none
    was asked), the trainer filter's decisions, and every warning and finding of the run.

    >>> page = verdict_html({"checks": [{"name": "min-groups", "value_text": "2", "bound_text": ">= 3",
    ...     "passed": False}], "trainer_filter": None, "warnings": [], "findings": []})
    >>> "FAIL: 1 of 1 checks failed" in page and "<td>min-groups</td>" in page
    True
    """
    checks = summary.get("checks") or []
    failed = [check for check in checks if not check["passed"]]
    if not checks:
        parts = [
            '<p class="verdict none">No checks asked (grpo-cli check --max-inactive-fraction F, ...)</p>'
        ]
    elif failed:
        parts = [f'<p class="verdict fail">FAIL: {len(failed)} of {len(checks)} checks failed</p>']
    else:
        parts = [f'<p class="verdict pass">PASS: all {len(checks)} checks passed</p>']
    if checks:
        rows = "".join(
            f"<tr><td>{'PASS' if c['passed'] else '<b>FAIL</b>'}</td><td>{html.escape(c['name'])}</td>"
            f'<td class="n">{html.escape(c["value_text"])}</td><td>{html.escape(c["bound_text"])}</td>'
            f"<td>{html.escape(c.get('detail') or '')}</td></tr>"
            for c in checks
        )
        parts.append(
            '<table class="checks"><tr><th>result</th><th>check</th><th>value</th><th>bound</th>'
            f"<th></th></tr>{rows}</table>"
        )
    report = summary.get("trainer_filter")
    if report:
        split = f", {report['split']:,} split (some rows kept, some dropped)" if report.get("split") else ""
        parts.append(
            f"<h2>{html.escape(report['trainer'])}'s filter ({html.escape(report['name'])})</h2>"
            f"<p>{html.escape(report['rule'])}: keeps {report['kept']:,} of {report['groups']:,} groups; "
            f"{report['kept_although_inactive']:,} kept although constant, "
            f"{report['dropped_although_active']:,} dropped although active{split}.</p>"
        )
    notes = [("warning", w if isinstance(w, str) else str(w)) for w in summary.get("warnings") or []]
    notes += [(f["severity"], f["message"]) for f in summary.get("findings") or []]
    if notes:
        items = "".join(f"<li><b>{html.escape(kind)}</b>: {html.escape(text)}</li>" for kind, text in notes)
        parts.append(f"<h2>Warnings and findings</h2><ul>{items}</ul>")
    return '<section id="verdict">' + "".join(parts) + "</section>"


def _value(value: Any) -> str:
    """A reward value as the terminal prints it: a float32 0.1 is 0.1, not 0.10000000149011612."""
    if not isinstance(value, float):
        return str(value)
    shown = f"{value:.7g}"
    return shown if "." in shown or "e" in shown or "n" in shown else f"{shown}.0"


def counts_html(summary: dict[str, Any]) -> str:
    """The figures the terminal prints, as a table: groups active and inactive (by the value
    they all hold), singletons, group sizes, the reward's and the advantage's range."""
    groups = summary["groups"]

    def share(n: int) -> str:
        return f"{n:,} ({100 * n / groups:.1f}%)" if groups else f"{n:,}"

    rows = [
        ("rows", f"{summary['rows']:,}"),
        ("groups", f"{groups:,}"),
        ("active groups", share(summary["active_groups"])),
        ("inactive groups", share(summary["inactive_groups"])),
    ]
    rows += [
        (f"inactive, all {_value(v['value'])}", f"{v['groups']:,}")
        for v in summary.get("inactive_by_value") or []
    ]
    if summary.get("inactive_other_values"):
        rows.append(("inactive, all another value", f"{summary['inactive_other_values']:,}"))
    rows.append(("singleton groups", f"{summary['singleton_groups']:,}"))
    size, reward, advantage = summary.get("group_size"), summary.get("reward"), summary.get("advantage")
    if size:
        rows.append(("group size min / median / max", f"{size['min']} / {size['median']:g} / {size['max']}"))
    if reward and reward.get("mean") is not None:
        rows.append(("reward mean / std", f"{reward['mean']:.4g} / {reward['std']:.4g}"))
        rows.append(("reward min / max", f"{reward['min']:.4g} / {reward['max']:.4g}"))
    if advantage and advantage.get("min") is not None:
        rows.append(("advantage min / max", f"{advantage['min']:.4g} / {advantage['max']:.4g}"))
    body = "".join(f'<tr><td>{html.escape(k)}</td><td class="n">{html.escape(v)}</td></tr>' for k, v in rows)
    return f'<h2>Counts</h2><table id="counts">{body}</table>'


# --------------------------------------------------------------------------- pictures, by a browser

BROWSER_SOCKET_TAIL = len("/org.chromium.Chromium.XXXXXX/SingletonSocket")
"""What follows the browser's temporary folder in its longest socket path (a TMPDIR of 63
characters or more made Chromium abort)."""


def _run_browser(page: str, scratch: Path, *args: str, name: str = "report.html") -> str:
    """Draw ``page`` (a file called ``name``) in the headless browser, with ``scratch`` (a
    private temporary folder) as its profile, home and working folder; its standard output."""
    found = browser()
    if found is None:
        raise GrpoError(f"{mention('report')}: no headless Chromium on PATH to draw the picture")
    source = scratch / name
    source.write_text(page, encoding="utf-8")
    env = {
        **os.environ,
        "HOME": str(scratch),
        "XDG_CONFIG_HOME": str(scratch),
        "XDG_CACHE_HOME": str(scratch),
        "TMPDIR": str(scratch),  # what it leaves there (an abort's socket folder) goes with it
    }
    command = [
        found,
        "--headless",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--disable-extensions",
        f"--user-data-dir={scratch / 'profile'}",
        "--virtual-time-budget=10000",
        *(["--no-sandbox"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),  # root: no sandbox
        *args,
        source.as_uri(),
    ]
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            env=env,
            cwd=scratch,
            timeout=_BROWSER_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GrpoError(f"{mention('report')}: {found} could not draw the picture ({exc})") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise GrpoError(
            f"{mention('report')}: {found} could not draw the picture (exit {done.returncode}: {last})"
        )
    return done.stdout


@contextlib.contextmanager
def _browser_folder() -> Iterator[Path]:
    """A private folder for the browser (its profile, home, working and temporary folder), in
    a root short enough for its socket paths, removed on every exit path and by a later run
    if this one is killed."""
    from grpo_cli.scratch import SCRATCH_NAME_BYTES, scratch_dir, socket_root

    folder = scratch_dir(
        "--report", root=socket_root(SCRATCH_NAME_BYTES + BROWSER_SOCKET_TAIL, program="the browser")
    )
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _screenshot(document: str, *, width: int, height: int) -> bytes:
    """``document`` (the picture's SVG) drawn by the headless browser at its own size, as a PNG."""
    with _browser_folder() as folder:
        shot = folder / "report.png"
        _run_browser(
            document, folder, f"--window-size={width},{height}", f"--screenshot={shot}", name="report.svg"
        )
        try:
            data = shot.read_bytes()
        except OSError:
            raise GrpoError(f"{mention('report')}: the browser drew no picture") from None
    if not data.startswith(b"\x89PNG"):
        raise GrpoError(f"{mention('report')}: the browser's picture is not a PNG")
    return data


def _numeric(values: list[dict[str, Any]]) -> bool:
    return all(isinstance(v["value"], int | float) and not isinstance(v["value"], bool) for v in values)


SHOWN_CATEGORIES = 15
"""A text ``--by`` column's values drawn one bar each, the worst first; the rest are one bar."""

MARKERS_UP_TO = 30
"""Points of a line drawn with markers; past this, the line alone."""

_INACTIVE_PARTS = (
    ("all_min", "inactive: all at the minimum", "#d62728"),
    ("all_max", "inactive: all at the maximum", "#2ca02c"),
    ("other", "inactive: all another value", "#9467bd"),
)


def _inactive_parts(value: dict[str, Any]) -> dict[str, int]:
    parts = dict(value["inactive"])
    parts.setdefault("other", value["inactive_groups"] - parts.get("all_min", 0) - parts.get("all_max", 0))
    return parts


def _ranked(values: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A text column's values, the largest inactive fraction first (then the most groups), the
    values past :data:`SHOWN_CATEGORIES` summed into one."""
    ranked = sorted(
        values, key=lambda v: (-(v["inactive_groups"] / v["groups"]) if v["groups"] else 0.0, -v["groups"])
    )
    shown, rest = ranked[:SHOWN_CATEGORIES], ranked[SHOWN_CATEGORIES:]
    if not rest:
        return shown
    groups = sum(v["groups"] for v in rest)
    rows = sum(v["rows"] for v in rest)
    parts = {key: sum(_inactive_parts(v)[key] for v in rest) for key, _, _ in _INACTIVE_PARTS}
    total_reward = sum(v["reward_mean"] * v["rows"] for v in rest if v.get("reward_mean") is not None)
    other = {
        "value": f"{len(rest)} other values",
        "groups": groups,
        "rows": rows,
        "inactive_groups": sum(parts.values()),
        "inactive": parts,
        "reward_mean": total_reward / rows if rows else None,
    }
    return [*shown, other]


def _by_chart(column: str, values: list[dict[str, Any]]) -> Chart:
    """Per value of a ``--by`` column, the share of its groups inactive (by the value they all
    hold) and its mean reward, each on an axis from zero: areas and a line over a numeric column
    (steps, integer ticks for integers), ranked bars and dots over a text one."""
    title = f"By {column}: inactive groups and mean reward"
    numeric = _numeric(values)
    shown = sorted(values, key=lambda v: v["value"]) if numeric else _ranked(values)
    parts = [
        charts.Series(name, color, *shares)
        for key, name, color in _INACTIVE_PARTS
        if (shares := _shares(shown, key, name, column if numeric else None)) is not None
    ]
    means = [v.get("reward_mean") for v in shown]
    if numeric:
        data = {"column": column, "x": [v["value"] for v in shown], "parts": parts, "means": means}
        return Chart(title, "ordered", {**data, "markers_up_to": MARKERS_UP_TO})
    labels = [str(v["value"]) for v in shown]
    return Chart(title, "ranked", {"column": column, "labels": labels, "parts": parts, "means": means})


def _shares(
    values: list[dict[str, Any]], key: str, name: str, column: str | None
) -> tuple[list[float], list[str]] | None:
    """Each value's share of its groups inactive in the way ``key`` names, with what a hover
    says (that many, of how many groups); ``None`` where no value has one (an empty series would
    be drawn along the top of the stack). ``column``: the hover of an ordered chart, which
    names the value in its first line."""
    counts = [_inactive_parts(v)[key] for v in values]
    if not any(counts):
        return None
    shares = [c / v["groups"] if v["groups"] else 0.0 for c, v in zip(counts, values, strict=True)]
    hovers = [
        f"{name}: {share:.1%} ({count:,} of {v['groups']:,} groups)"
        if column is not None
        else f"{v['value']}: {name} {share:.1%} ({count:,} of {v['groups']:,} groups)"
        for share, count, v in zip(shares, counts, values, strict=True)
    ]
    return shares, hovers


def _histogram_chart(histogram: dict[str, Any]) -> Chart:
    counts = histogram["counts"]
    edges = histogram["edges"]
    labels = histogram.get("labels") or [
        f"[{edges[i]:.3g}, {edges[i + 1]:.3g}{']' if i == len(counts) - 1 else ')'}"
        for i in range(len(counts))
    ]
    title = (
        "Group solve rate (k of G correct)" if histogram.get("kind") == "solve_rate" else "Group mean reward"
    )
    data = {
        "labels": labels,
        "counts": counts,
        "color": "#4C78A8",
        "x_title": "group mean",
        "y_title": "groups",
    }
    return Chart(f"{title}: groups per bin", "bars", data)


def _reward_chart(histogram: dict[str, Any]) -> Chart:
    """Every scored row's reward: a bar a value, or bars of equal width named by where they start."""
    if histogram["kind"] == "values":
        title, labels, x_title = "Rewards: rows of each value", histogram["labels"], "reward"
    else:
        title, x_title = "Rewards: rows per range", "reward, each bar from its value up to the next"
        labels = [f"{low:.6g}" for low in histogram["low"]]
    data = {
        "labels": labels,
        "counts": histogram["counts"],
        "color": "#F58518",
        "x_title": x_title,
        "y_title": "rows",
        "hovers": [f"reward {label}" for label in histogram["labels"]],
    }
    return Chart(title, "bars", data)


def _size_chart(counts: dict[str, int]) -> Chart:
    sizes = sorted(counts, key=int)
    data = {
        "labels": [str(s) for s in sizes],
        "counts": [counts[s] for s in sizes],
        "color": "#72B7B2",
        "x_title": "rollouts in the group",
        "y_title": "groups",
    }
    return Chart("Group sizes: groups of each size", "bars", data)
