"""Dataset checks for ``grpo-cli check``: each one a name, a measured value, a bound, pass/fail."""

from __future__ import annotations

from typing import Any, Literal

from grpo_cli.options.checks import CheckBounds
from grpo_cli.results.summary import RunSummary, short_key

Op = Literal["<=", ">=", "=="]


def evaluate_checks(
    summary: RunSummary, bounds: CheckBounds, *, pages: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Results in a fixed order, each a dict: ``name``; ``value``, the number measured (``None``
    where there was nothing to measure); ``op`` and ``bound``, the number it is held to
    (``value op bound`` passes); ``passed``; ``value_text`` and ``bound_text``, how the report
    reads them (``"1..4"``, ``"min == max"``); and ``detail`` where it names what failed.

    ``pages``: with ``validate_pages``, what :func:`~grpo_cli.inputs.sources.validate_pages` found.

    A dataset with no rows always fails: the ``rows`` check is added, failed, in front
    (a CI gate must never pass on nothing). Group-size checks then pass vacuously.

    >>> from types import SimpleNamespace
    >>> summary = SimpleNamespace(rows=4, groups=2, group_size={"min": 2, "max": 2}, verify=None)
    >>> [check] = evaluate_checks(summary, CheckBounds(min_groups=3))
    >>> check["value"], check["op"], check["bound"], check["passed"], check["bound_text"]
    (2, '>=', 3, False, '>= 3')
    """
    results: list[dict[str, Any]] = []

    def add(
        name: str,
        value: float | None,
        op: Op,
        bound: float,
        passed: bool,
        *,
        value_text: str | None = None,
        bound_text: str | None = None,
        detail: str | None = None,
    ) -> None:
        results.append(
            {
                "name": name,
                "value": value,
                "op": op,
                "bound": bound,
                "passed": bool(passed),
                "value_text": value_text
                if value_text is not None
                else "none"
                if value is None
                else f"{value}",
                "bound_text": bound_text if bound_text is not None else f"{op} {bound}",
            }
        )
        if detail is not None:
            results[-1]["detail"] = detail

    if summary.rows == 0:
        add("rows", 0, ">=", 1, False)

    sizes = summary.group_size
    if bounds.max_inactive_fraction is not None:
        limit = bounds.max_inactive_fraction
        value = round(summary.inactive_fraction, 6)
        add("max-inactive-fraction", value, "<=", limit, value <= limit)
        for column, values in summary.by.items():
            over = [v for v in values if v["inactive_groups"] / v["groups"] > limit]
            named = ", ".join(
                f"{column} {short_key(v['value'])} ({100 * v['inactive_groups'] / v['groups']:.1f}%)"
                for v in over[:8]
            )
            add(
                f"max-inactive-fraction by {column}",
                len(over),
                "==",
                0,
                not over,
                value_text=f"{len(over):,} of {len(values):,} values above",
                bound_text=f"<= {limit} in every value",
                detail=f"{named}{', ...' if len(over) > 8 else ''}" if over else None,
            )
    if bounds.min_active_groups is not None:
        limit = bounds.min_active_groups
        add("min-active-groups", summary.active_groups, ">=", limit, summary.active_groups >= limit)
    if bounds.min_groups is not None:
        add("min-groups", summary.groups, ">=", bounds.min_groups, summary.groups >= bounds.min_groups)
    if bounds.min_group_size is not None:
        smallest = sizes["min"]
        limit = bounds.min_group_size
        add("min-group-size", smallest, ">=", limit, smallest is None or smallest >= limit)
    if bounds.max_group_size is not None:
        largest = sizes["max"]
        limit = bounds.max_group_size
        add("max-group-size", largest, "<=", limit, largest is None or largest <= limit)
    if bounds.uniform_group_size:
        smallest, largest = sizes["min"], sizes["max"]
        off = summary.off_size_groups
        detail = None
        if off:
            named = ", ".join(f"group {short_key(e['group'])} ({e['rows']} rows)" for e in off["examples"])
            rest = off["groups"] - len(off["examples"])
            more = f", and {rest:,} more" if rest else ""
            detail = (
                f"{off['groups']:,} groups are not of the common size {off['common_size']}: {named}{more}"
            )
        add(
            "uniform-group-size",
            None if smallest is None or largest is None else largest - smallest,
            "==",
            0,
            smallest == largest,
            value_text="none" if smallest is None else f"{smallest}..{largest}",
            bound_text="min == max",
            detail=detail,
        )
    if bounds.sound_grouping:
        mistakes = [f for f in summary.findings if f["severity"] == "warning"]
        add(
            "sound-grouping",
            len(mistakes),
            "==",
            0,
            not mistakes,
            bound_text="0 grouping findings",
            detail=", ".join(f"{f['kind']} ({f['groups']:,} groups)" for f in mistakes) if mistakes else None,
        )
    if bounds.max_singleton_groups is not None:
        limit = bounds.max_singleton_groups
        add("max-singleton-groups", summary.singleton_groups, "<=", limit, summary.singleton_groups <= limit)
    if bounds.max_misclassified_groups is not None:
        report = summary.trainer_filter
        limit = bounds.max_misclassified_groups
        if report is None:
            add(
                "max-misclassified-groups",
                None,
                "<=",
                limit,
                False,
                value_text="no --trainer-filter",
                bound_text="a --trainer-filter to count",
            )
        else:
            wrong = report["kept_although_inactive"] + report["dropped_although_active"]
            add(f"max-misclassified-groups ({report['name']})", wrong, "<=", limit, wrong <= limit)
    if bounds.validate_pages and pages is not None:
        decoded = f"{pages['column_chunks']:,} column chunks in {pages['row_groups']:,} row groups decoded"
        failed = pages["error"] is not None
        add(
            "validate-pages",
            int(failed),
            "==",
            0,
            not failed,
            value_text=pages["error"] or decoded,
            bound_text="every page decodes",
        )
    if summary.verify is not None:
        v = summary.verify
        residue = v.get("residue", 0)
        if v.get("strict"):
            differ = v["mismatched"] + residue
            add(
                "verify-advantage-col",
                differ,
                "==",
                0,
                differ == 0,
                value_text=f"{differ} rows differ",
                bound_text="0 rows differ (--strict)",
            )
        else:
            found = f"{v['mismatched']} rows differ" + (
                f" ({residue} more by rounding residue)" if residue else ""
            )
            add(
                "verify-advantage-col",
                v["mismatched"],
                "==",
                0,
                v["mismatched"] == 0,
                value_text=found,
                bound_text="0 rows differ",
            )
    return results
