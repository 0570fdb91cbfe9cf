"""Dataset checks for ``grpo-cli check``: each one a name, a measured value, a bound, pass/fail."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpo_cli.results.summary import RunSummary, short_key


@dataclass(frozen=True)
class CheckBounds:
    """The checks asked for; ``None`` means not asked."""

    max_inactive_fraction: float | None = None
    min_active_groups: int | None = None
    min_groups: int | None = None
    min_group_size: int | None = None
    max_group_size: int | None = None
    uniform_group_size: bool = False
    sound_grouping: bool = False
    max_singleton_groups: int | None = None
    max_misclassified_groups: int | None = None
    validate_pages: bool = False


def evaluate_checks(
    summary: RunSummary, bounds: CheckBounds, *, pages: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Results in a fixed order, as dicts with name, value, bound and passed.

    ``pages``: with ``validate_pages``, what :func:`~grpo_cli.inputs.sources.validate_pages` found.

    A dataset with no rows always fails: the ``rows`` check is added, failed, in front
    (a CI gate must never pass on nothing). Group-size checks then pass vacuously.
    """
    results: list[dict[str, Any]] = []

    def add(name: str, value: Any, bound: str, passed: bool, detail: str | None = None) -> None:
        results.append({"name": name, "value": value, "bound": bound, "passed": bool(passed)})
        if detail is not None:
            results[-1]["detail"] = detail

    if summary.rows == 0:
        add("rows", 0, ">= 1", False)

    sizes = summary.group_size
    if bounds.max_inactive_fraction is not None:
        value = round(summary.inactive_fraction, 6)
        add(
            "max-inactive-fraction",
            value,
            f"<= {bounds.max_inactive_fraction}",
            value <= bounds.max_inactive_fraction,
        )
        for column, values in summary.by.items():
            over = [v for v in values if v["inactive_groups"] / v["groups"] > bounds.max_inactive_fraction]
            named = ", ".join(
                f"{column} {short_key(v['value'])} ({100 * v['inactive_groups'] / v['groups']:.1f}%)"
                for v in over[:8]
            )
            add(
                f"max-inactive-fraction by {column}",
                f"{len(over):,} of {len(values):,} values above",
                f"<= {bounds.max_inactive_fraction} in every value",
                not over,
                f"{named}{', ...' if len(over) > 8 else ''}" if over else None,
            )
    if bounds.min_active_groups is not None:
        add(
            "min-active-groups",
            summary.active_groups,
            f">= {bounds.min_active_groups}",
            summary.active_groups >= bounds.min_active_groups,
        )
    if bounds.min_groups is not None:
        add("min-groups", summary.groups, f">= {bounds.min_groups}", summary.groups >= bounds.min_groups)
    if bounds.min_group_size is not None:
        smallest = sizes["min"]
        add(
            "min-group-size",
            smallest,
            f">= {bounds.min_group_size}",
            smallest is None or smallest >= bounds.min_group_size,
        )
    if bounds.max_group_size is not None:
        largest = sizes["max"]
        add(
            "max-group-size",
            largest,
            f"<= {bounds.max_group_size}",
            largest is None or largest <= bounds.max_group_size,
        )
    if bounds.uniform_group_size:
        smallest, largest = sizes["min"], sizes["max"]
        spread = "none" if smallest is None else f"{smallest}..{largest}"
        off = summary.off_size_groups
        detail = None
        if off:
            named = ", ".join(f"group {short_key(e['group'])} ({e['rows']} rows)" for e in off["examples"])
            rest = off["groups"] - len(off["examples"])
            more = f", and {rest:,} more" if rest else ""
            detail = (
                f"{off['groups']:,} groups are not of the common size {off['common_size']}: {named}{more}"
            )
        add("uniform-group-size", spread, "min == max", smallest == largest, detail)
    if bounds.sound_grouping:
        mistakes = [f for f in summary.findings if f["severity"] == "warning"]
        add(
            "sound-grouping",
            len(mistakes),
            "0 grouping findings",
            not mistakes,
            ", ".join(f"{f['kind']} ({f['groups']:,} groups)" for f in mistakes) if mistakes else None,
        )
    if bounds.max_singleton_groups is not None:
        add(
            "max-singleton-groups",
            summary.singleton_groups,
            f"<= {bounds.max_singleton_groups}",
            summary.singleton_groups <= bounds.max_singleton_groups,
        )
    if bounds.max_misclassified_groups is not None:
        report = summary.trainer_filter
        if report is None:
            add("max-misclassified-groups", "no --trainer-filter", "a --trainer-filter to count", False)
        else:
            wrong = report["kept_although_inactive"] + report["dropped_although_active"]
            add(
                f"max-misclassified-groups ({report['name']})",
                wrong,
                f"<= {bounds.max_misclassified_groups}",
                wrong <= bounds.max_misclassified_groups,
            )
    if bounds.validate_pages and pages is not None:
        decoded = f"{pages['column_chunks']:,} column chunks in {pages['row_groups']:,} row groups decoded"
        add("validate-pages", pages["error"] or decoded, "every page decodes", pages["error"] is None)
    if summary.verify is not None:
        v = summary.verify
        residue = v.get("residue", 0)
        if v.get("strict"):
            differ = v["mismatched"] + residue
            add("verify-advantage-col", f"{differ} rows differ", "0 rows differ (--strict)", differ == 0)
        else:
            found = f"{v['mismatched']} rows differ" + (
                f" ({residue} more by rounding residue)" if residue else ""
            )
            add("verify-advantage-col", found, "0 rows differ", v["mismatched"] == 0)
    return results
