"""The run summary as text: the plain report, the rich table, and ``check``'s lines.

Pure rendering of a :class:`~grpo_cli.results.summary.RunSummary`; the figures themselves are
computed in :mod:`grpo_cli.results.summary`.
"""

from __future__ import annotations

from typing import Any

from grpo_cli.results.summary import RunSummary, short_key


def _fmt(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{value:.1f}"
    return f"{value:.{digits}g}"


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "0.0%"


def summary_lines(summary: RunSummary) -> list[tuple[str, str]]:
    """Label/value rows shared by the plain and the rich rendering."""
    s = summary
    rows: list[tuple[str, str]] = [
        ("input", f"{s.input['path']} ({s.input['shards']} shard(s), {_bytes(s.input['bytes'])})"),
    ]
    dump = s.input.get("from")
    if dump is not None:
        steps = dump["steps"]
        span = (
            ""
            if not steps
            else f", steps {steps[0]}-{steps[1]}"
            if steps[0] != steps[1]
            else f", step {steps[0]}"
        )
        rows.append(("read as", f"{dump['dump']} ({dump['files']} file(s){span})"))
        rows.append(("groups from", dump["group_key"]))
        rows += [("", note) for note in dump["notes"]]
    if s.output is not None:
        method = {"splice": ", new columns spliced in", "rewrite": ", re-encoded"}.get(
            s.output.get("method", ""), ", some spliced, some re-encoded"
        )
        if s.output.get("format") == "jsonl":
            method = ", JSON lines"
        rows.append(
            (
                "output",
                f"{s.output['path']} ({s.output['shards']} shard(s), {_bytes(s.output['bytes'])}{method})",
            )
        )
        if "rewrite_reason" in s.output and s.output.get("method") != "splice" and method != ", JSON lines":
            rows.append(("re-encoded because", s.output["rewrite_reason"]))
        transfer = s.output.get("transfer")
        if transfer is not None:
            copied = transfer["bytes_copied_in_store"]
            rows.append(
                (
                    "uploaded",
                    f"{_bytes(transfer['bytes_uploaded'])} in {transfer['objects']} object(s)"
                    + (
                        " by the Ray workers, then copied into place in the store"
                        if transfer.get("uploaded_by") == "workers"
                        else ""
                    )
                    + (
                        f"; {_bytes(copied)} of the input's column chunks copied in the store"
                        if copied
                        else ""
                    ),
                )
            )
    rows += [
        ("rows", f"{s.rows:,}"),
        ("groups", f"{s.groups:,}"),
        ("active groups", f"{s.active_groups:,} ({_pct(s.active_groups, s.groups)})"),
        ("inactive groups", f"{s.inactive_groups:,} ({_pct(s.inactive_groups, s.groups)})"),
    ]
    for item in s.inactive_by_value:
        rows.append((f"  all {_fmt(item['value'])}", f"{item['groups']:,}"))
    if s.inactive_other_values:
        rows.append(("  other constant values", f"{s.inactive_other_values:,}"))
    if s.tolerance is not None:
        rows.append(
            (
                "  within the tolerance",
                f"{s.tolerance['groups_beyond_exact']:,} (span <= {s.tolerance['tolerance']:g}, "
                "not constant: --inactive-tolerance)",
            )
        )
    rows.append(("singleton groups", f"{s.singleton_groups:,}"))
    g = s.group_size
    rows.append(("group size min/median/max", " / ".join("-" if v is None else f"{v:g}" for v in g.values())))
    r = s.reward
    rows.append(
        ("reward mean/std", f"{_fmt(r['mean'])} / {_fmt(r['std'])}"),
    )
    rows.append(("reward min/max", f"{_fmt(r['min'])} / {_fmt(r['max'])}"))
    a = s.advantage
    rows.append(("advantage min/max", f"{_fmt(a['min'])} / {_fmt(a['max'])}"))
    if s.nan_rewards:
        rows.append(("NaN rewards left out", f"{s.nan_rewards:,}"))
    if s.dropped["reasons"]:
        written = s.dropped.get("rows_written")
        kept = f"; {written:,} rows written" if written is not None and s.output is not None else ""
        rows.append(("dropped", f"{s.dropped['groups']:,} groups, {s.dropped['rows']:,} rows{kept}"))
        for item in s.dropped.get("by_reason") or [{"reason": r} for r in s.dropped["reasons"]]:
            counts = f": {item['groups']:,} groups, {item['rows']:,} rows" if "groups" in item else ""
            rows.append(("  because", f"{item['reason']}{counts}"))
    rows.append(("time", f"{s.elapsed_seconds:.2f} s ({s.mode}, {s.device})"))
    return rows


def histogram_title(summary: RunSummary) -> str:
    """``solve rate`` only where the rewards are binary."""
    kind = summary.group_mean_histogram.get("kind")
    if kind == "solve_rate":
        return "group solve rate histogram (k of G rollouts correct)"
    return "group mean reward histogram"


def histogram_lines(summary: RunSummary, width: int = 30) -> list[str]:
    histogram = summary.group_mean_histogram
    edges, counts = histogram["edges"], histogram["counts"]
    if not counts:
        return []
    peak = max(int(c) for c in counts) or 1
    labels = histogram.get("labels")
    if labels is None and histogram.get("kind") == "single":  # one mean, or means a few ulps apart
        low, high = edges[0], edges[-1]
        labels = [_fmt(low) if low == high else f"[{_fmt(low, 17)}, {_fmt(high, 17)}]"]
    if labels is None:
        labels = [
            f"[{float(edges[i]):.3g}, {float(edges[i + 1]):.3g}{']' if i == len(counts) - 1 else ')'}"
            for i in range(len(counts))
        ]
    label_width = max(len(label) for label in labels)
    count_width = max(len(f"{int(c):,}") for c in counts)
    lines = []
    for label, c in zip(labels, counts, strict=True):
        bar = "█" * round(width * int(c) / peak)
        lines.append(f"  {label.rjust(label_width)}  {int(c):>{count_width},}  {bar}")
    return lines


BY_ROWS_SHOWN = 12
"""Values of a ``--by`` column shown in the table: a numeric column's last ones (a long step
column's latest steps), a categorical column's most inactive ones; the JSON summary holds
every value."""

_SPARKS = "▁▂▃▄▅▆▇█"

_BY_COLUMNS = (
    (
        "groups",
        "inactive",
        "all-min",
        "all-max",
        "other",
        "eff. rows",
        "mean p10/p50/p90",
        "std p50",
        "homog.",
    ),
    ("groups", "inactive", "all-min", "all-max", "other", "eff. rows", "mean p10/p50/p90", "std p50"),
    ("groups", "inactive", "all-min", "all-max", "other", "eff. rows", "mean p50", "std p50"),
    ("groups", "inactive", "all-min", "all-max", "other", "mean p50"),
    ("groups", "inactive", "mean p50"),
)
"""The ``--by`` table's columns, the widest first: the first that fits the terminal is drawn."""


def by_lines(summary: RunSummary, width: int | None = None) -> list[str]:
    """One table per ``--by`` column, within ``width`` columns (the terminal's; 80 where there is
    none), its widest set of columns that fits. A numeric column (a step) keeps its order, shows
    its last :data:`BY_ROWS_SHOWN` values and the trend of the inactive fraction over every value;
    a categorical one (a data source) has no order: its most inactive values come first."""
    import shutil

    width = width or shutil.get_terminal_size((80, 24)).columns
    out: list[str] = []
    for column, values in summary.by.items():
        ordered = all(
            isinstance(v["value"], int | float) and not isinstance(v["value"], bool) for v in values
        )
        if ordered:
            shown = values[-BY_ROWS_SHOWN:]
            note = f", the last {len(shown)} shown" if len(values) > len(shown) else ""
        else:
            ranked = sorted(values, key=lambda v: (-v["inactive_groups"] / v["groups"], str(v["value"])))
            shown = ranked[:BY_ROWS_SHOWN]
            note = f", the {len(shown)} most inactive shown" if len(values) > len(shown) else ""
        cells = [{"": _by_key(v["value"]), **_by_cells(v)} for v in shown]
        homogeneity = any(c["homog."] != "-" for c in cells)
        names: tuple[str, ...] = ()
        for candidate in _BY_COLUMNS:
            names = tuple(n for n in candidate if n != "homog." or homogeneity)
            table = [[column, *(n if n != "homog." else "homog. obs/exp" for n in names)]]
            table += [[c[""], *(c[n] for n in names)] for c in cells]
            widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
            if 2 + sum(widths) + 2 * (len(widths) - 1) <= width:
                break
        left_out = len(_BY_COLUMNS[0]) - len(names) - (0 if homogeneity else 1)
        out.append(f"by {column} ({len(values):,} values{note}):")
        for r in table:
            out.append(
                "  "
                + "  ".join(
                    cell.rjust(w) if i else cell.ljust(w)
                    for i, (cell, w) in enumerate(zip(r, widths, strict=True))
                )
            )
        fractions = [v["inactive_groups"] / v["groups"] for v in values]
        if ordered and len(values) > 1:
            bars = _sparkline(fractions, width=max(10, min(40, width - 60)))
            trend = f"  inactive fraction over {column}: {bars} "
            out.append(trend + f"({100 * fractions[0]:.1f}% first, {100 * fractions[-1]:.1f}% last)")
        elif len(values) > 1:
            low, high = 100 * min(fractions), 100 * max(fractions)
            out.append(f"  inactive fraction across {column}: {low:.1f}% to {high:.1f}%, most inactive first")
        if left_out:
            columns = "column" if left_out == 1 else "columns"
            out.append(f"  ({left_out} {columns} left out to fit {width} columns; --summary-json holds them)")
    return out


def _by_key(value: Any) -> str:
    return short_key(value) if not isinstance(value, str) else value[:24]


def _by_cells(v: dict[str, Any]) -> dict[str, str]:
    """Every cell the ``--by`` table can show for one value."""
    mean, std, homog = v["group_mean"], v["group_std"], v["homogeneous"]
    return {
        "groups": f"{v['groups']:,}",
        "inactive": _pct(v["inactive_groups"], v["groups"]),
        "all-min": f"{v['inactive']['all_min']:,}",
        "all-max": f"{v['inactive']['all_max']:,}",
        "other": f"{v['inactive']['other']:,}",
        "eff. rows": f"{100 * v['effective_row_fraction']:.1f}%",
        "mean p10/p50/p90": " / ".join(_fmt(mean[k]) for k in ("p10", "p50", "p90")),
        "mean p50": _fmt(mean["p50"]),
        "std p50": _fmt(std["p50"]),
        "homog.": "-" if homog is None else f"{homog['observed']:.2f} / {homog['expected']:.2f}",
    }


def _sparkline(fractions: list[float], width: int = 40) -> str:
    """The fractions (in [0, 1]) as bars; a long series averaged into ``width`` bars."""
    if len(fractions) > width:
        step = len(fractions) / width
        fractions = [
            sum(fractions[int(i * step) : int((i + 1) * step)])
            / len(fractions[int(i * step) : int((i + 1) * step)])
            for i in range(width)
        ]
    return "".join(_SPARKS[min(len(_SPARKS) - 1, int(f * len(_SPARKS)))] for f in fractions)


def render_compact(summary: RunSummary) -> str:
    """One line of figures, then one line per check (``grpo-cli check`` with checks)."""
    s = summary
    head = (
        f"{s.input['path']}: {s.rows:,} rows, {s.groups:,} groups, "
        f"{s.active_groups:,} active ({_pct(s.active_groups, s.groups)}), "
        f"{s.inactive_groups:,} inactive, {s.singleton_groups:,} singleton"
    )
    return "\n".join([head, *by_lines(summary), *check_lines(summary)])


def render_plain(summary: RunSummary) -> str:
    rows = summary_lines(summary)
    width = max(len(label) for label, _ in rows)
    out = [f"{label.ljust(width)}  {value}" for label, value in rows]
    hist = histogram_lines(summary)
    if hist:
        out.append(f"{histogram_title(summary)}:")
        out += hist
    out += by_lines(summary)
    out += check_lines(summary)
    return "\n".join(out)


def filter_lines(summary: RunSummary) -> list[str]:
    """``--trainer-filter``: what the trainer's rule decided against the exact rule."""
    report = summary.trainer_filter
    if report is None:
        return []
    lines = [
        f"trainer filter {report['name']} ({report['trainer']}: {report['rule']}): keeps "
        f"{report['kept']:,} of "
        f"{report['groups']:,} groups; {report['kept_although_inactive']:,} kept although constant, "
        f"{report['dropped_although_active']:,} dropped although active"
        + (f", {report['split']:,} split (some rows kept, some dropped)" if report.get("split") else "")
        + (
            f"; the rule saw the {report['rewards']} rewards, the exact decision the shaped ones"
            if "rewards" in report
            else ""
        ),
    ]
    by = report.get("by")
    if by is not None:
        wrong = [v for v in by["values"] if v["kept_although_inactive"] or v["dropped_although_active"]]
        for v in wrong[-BY_ROWS_SHOWN:]:
            lines.append(
                f"  {by['column']} {short_key(v['value'])}: {v['kept_although_inactive']:,} kept "
                "although constant, "
                f"{v['dropped_although_active']:,} dropped although active (of {v['groups']:,})"
                + (
                    f"; the whole {by['column']} counted as {'non-zero' if v['batch_kept'] else 'zero'} std"
                    if "batch_kept" in v
                    else ""
                )
                + (
                    f"; uneven group sizes: one baseline for the whole {by['column']}"
                    if v.get("uneven")
                    else ""
                )
            )
    for example in report["examples"]:
        shown = ", ".join("nan" if r is None else f"{r:.9g}" for r in example["rewards"]) + (
            ", ..." if example["size"] > 8 else ""
        )
        lines.append(f"  group {short_key(example['group'])}: {example['what']} (rewards {shown})")
    return lines


def check_lines(summary: RunSummary) -> list[str]:
    lines = [f"warning: {warning}" for warning in summary.warnings]
    lines += filter_lines(summary)
    for check in summary.checks:
        status = "PASS" if check["passed"] else "FAIL"
        detail = f": {check['detail']}" if check.get("detail") else ""
        lines.append(
            f"{status}  {check['name']}: {check['value_text']} (bound {check['bound_text']}){detail}"
        )
    if summary.verify is not None:
        v = summary.verify
        lines.append(
            f"verify {v['column']}: {v['mismatched']:,} of {v['compared']:,} rows differ "
            f"(max |diff| {_fmt(v['max_abs_diff'])}, atol {v['atol']}, rtol {v['rtol']})"
        )
        lines += _example_lines(v["examples"])
        residue = v.get("residue", 0)
        if residue:
            fails = " (fails with --strict)" if not v.get("strict") else ""
            lines.append(
                f"verify {v['column']}: {residue:,} more rows differ by a trainer's rounding residue{fails}"
            )
            lines += _example_lines(v.get("residue_examples", []))
    return lines


def failure_lines(summary: RunSummary) -> list[str]:
    """One line for each check that failed (``check -q``: what a CI log must still say)."""
    return [line for line in check_lines(summary) if line.startswith("FAIL")]


def _example_lines(examples: list[dict[str, Any]]) -> list[str]:
    return [
        f"  {ex['file']} row {ex['row']} group {short_key(ex['group'])}: "
        f"expected {ex['expected']:.8g}, found {ex['actual']:.8g}"
        for ex in examples
    ]


def render_rich(summary: RunSummary, console: Any) -> None:
    from rich.table import Table

    table = Table(title="grpo-cli summary", show_header=False, title_justify="left", box=None, pad_edge=False)
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    for label, value in summary_lines(summary):
        style = ""
        if label.startswith("active"):
            style = "green"
        elif label.startswith("inactive"):
            style = "yellow"
        table.add_row(label, f"[{style}]{value}[/{style}]" if style else value)
    console.print(table)
    hist = histogram_lines(summary)
    if hist:
        console.print(f"[bold]{histogram_title(summary)}[/bold]")
        for line in hist:
            console.print(line, highlight=False)
    for line in by_lines(summary):
        console.print(f"[bold]{line}[/bold]" if line.startswith("by ") else line, highlight=False)
    for line in check_lines(summary):
        style = (
            "green"
            if line.startswith("PASS")
            else "red"
            if line.startswith("FAIL")
            else "yellow"
            if line.startswith("warning:")
            else ""
        )
        console.print(f"[{style}]{line}[/{style}]" if style else line, highlight=False)


def _bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def github_annotations(summary: RunSummary) -> str:
    """An ``::error`` workflow command for each failed check, which GitHub Actions shows as an
    annotation on the run (its message escaped as the Actions toolkit escapes it)."""

    def data(text: str) -> str:
        return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")

    def prop(text: str) -> str:
        return data(text).replace(":", "%3A").replace(",", "%2C")

    lines = []
    for check in summary.checks:
        if check["passed"]:
            continue
        detail = f": {check['detail']}" if check.get("detail") else ""
        message = f"{check['name']}: {check['value_text']} (bound {check['bound_text']}){detail}"
        title = f"grpo-cli check {check['name']} failed on {summary.input['path']}"
        lines.append(f"::error title={prop(title)}::{data(message)}")
    return "".join(line + "\n" for line in lines)


def junit_report(summary: RunSummary) -> str:
    """The checks as a JUnit XML report: one test suite, a test case a check, a ``failure`` for
    each that failed (GitLab's ``artifacts:reports:junit``, Jenkins and most CI systems)."""
    from xml.etree import ElementTree

    failures = sum(not check["passed"] for check in summary.checks)
    suites = ElementTree.Element("testsuites", tests=str(len(summary.checks)), failures=str(failures))
    suite = ElementTree.SubElement(
        suites,
        "testsuite",
        name=f"grpo-cli check {summary.input['path']}",
        tests=str(len(summary.checks)),
        failures=str(failures),
        errors="0",
        time=f"{summary.elapsed_seconds:.3f}",
    )
    for check in summary.checks:
        case = ElementTree.SubElement(suite, "testcase", classname="grpo-cli.check", name=check["name"])
        if not check["passed"]:
            failure = ElementTree.SubElement(
                case, "failure", message=f"{check['value_text']} (bound {check['bound_text']})"
            )
            failure.text = check.get("detail") or f"{check['name']}: {check['value_text']}"
    ElementTree.indent(suites)
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n' + ElementTree.tostring(suites, encoding="unicode") + "\n"
    )
