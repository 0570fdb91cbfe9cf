"""The run summary: figures computed from the per-group statistics, as JSON or text.

The JSON keys are stable and documented in the README ("Summary JSON").
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

    from grpo_cli.kernel import GroupStats
    from grpo_cli.sources import InputSet

HISTOGRAM_BINS = 10
TOP_INACTIVE_VALUES = 10


@dataclass
class RunSummary:
    """What one ``compute`` or ``check`` run found. :meth:`to_dict` is the JSON form."""

    rows: int
    groups: int
    active_groups: int
    inactive_groups: int
    singleton_groups: int
    group_size: dict[str, float | None]
    reward: dict[str, float | None]
    advantage: dict[str, float | None]
    inactive_by_value: list[dict[str, Any]]
    inactive_other_values: int
    group_mean_histogram: dict[str, list[float] | list[int]]
    nan_rewards: int
    dropped: dict[str, Any]
    input: dict[str, Any]
    output: dict[str, Any] | None
    options: dict[str, Any]
    mode: str
    device: str
    elapsed_seconds: float
    verify: dict[str, Any] | None = None
    checks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def active_fraction(self) -> float:
        return self.active_groups / self.groups if self.groups else 0.0

    @property
    def inactive_fraction(self) -> float:
        return self.inactive_groups / self.groups if self.groups else 0.0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rows": self.rows,
            "groups": self.groups,
            "active_groups": self.active_groups,
            "inactive_groups": self.inactive_groups,
            "active_fraction": round(self.active_fraction, 6),
            "singleton_groups": self.singleton_groups,
            "group_size": self.group_size,
            "reward": self.reward,
            "advantage": self.advantage,
            "inactive_by_value": self.inactive_by_value,
            "inactive_other_values": self.inactive_other_values,
            "group_mean_histogram": self.group_mean_histogram,
            "nan_rewards": self.nan_rewards,
            "dropped": self.dropped,
            "input": self.input,
            "output": self.output,
            "options": self.options,
            "mode": self.mode,
            "device": self.device,
            "elapsed_seconds": round(self.elapsed_seconds, 3),
        }
        if self.verify is not None:
            out["verify"] = self.verify
        if self.checks:
            out["checks"] = self.checks
            out["checks_passed"] = all(c["passed"] for c in self.checks)
        return out

    def to_json(self) -> str:
        return json.dumps(_finite_or_none(self.to_dict()), indent=2)


def _finite_or_none(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_or_none(v) for v in value]
    return value


def _float(value: float) -> float:
    return float(value)


def build_summary(
    *,
    stats: GroupStats,
    active: torch.Tensor,
    rows_per_group: np.ndarray,
    rows: int,
    nan_rewards: int,
    advantage_range: tuple[float, float] | None,
    dropped_groups: int,
    dropped_rows: int,
    drop_reasons: list[str],
    inputs: InputSet,
    bytes_read: int,
    output: dict[str, Any] | None,
    options: dict[str, Any],
    mode: str,
    device: str,
    elapsed: float,
    verify: dict[str, Any] | None,
) -> RunSummary:
    from grpo_cli.kernel import batch_moments, batch_std

    cpu = stats.to("cpu")
    count = cpu.count.numpy()
    mean = cpu.mean.numpy()
    minimum = cpu.minimum.numpy()
    maximum = cpu.maximum.numpy()
    active_np = active.numpy().astype(bool)
    groups = int(count.size)
    sizes = rows_per_group if rows_per_group.size == groups else count
    singleton = int((sizes == 1).sum())

    n_all, mean_all, _ = batch_moments(cpu)
    reward: dict[str, float | None] = {"mean": None, "std": None, "min": None, "max": None}
    if n_all:
        seen = count > 0
        reward = {
            "mean": float(mean_all),
            "std": float(batch_std(cpu)),
            "min": _float(minimum[seen].min()),
            "max": _float(maximum[seen].max()),
        }

    constant = (~active_np) & (count >= 2) & (minimum == maximum)
    values, value_counts = np.unique(minimum[constant], return_counts=True)
    order = sorted(range(values.size), key=lambda i: (-int(value_counts[i]), float(values[i])))
    inactive_by_value = [
        {"value": float(values[i]), "groups": int(value_counts[i])} for i in order[:TOP_INACTIVE_VALUES]
    ]
    other = int(sum(int(value_counts[i]) for i in order[TOP_INACTIVE_VALUES:]))

    histogram: dict[str, list[float] | list[int]] = {"edges": [], "counts": []}
    means = mean[count > 0]
    if means.size:
        low, high = float(means.min()), float(means.max())
        if low == high:
            high = low + 1.0 if low == 0 else low + abs(low) * 1e-9 + 1e-12
        counts, edges = np.histogram(means, bins=HISTOGRAM_BINS, range=(low, high))
        histogram = {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]}

    return RunSummary(
        rows=rows,
        groups=groups,
        active_groups=int(active_np.sum()),
        inactive_groups=groups - int(active_np.sum()),
        singleton_groups=singleton,
        group_size={
            "min": int(sizes.min()) if groups else None,
            "median": float(np.median(sizes)) if groups else None,
            "max": int(sizes.max()) if groups else None,
        },
        reward=reward,
        advantage={
            "min": advantage_range[0] if advantage_range else None,
            "max": advantage_range[1] if advantage_range else None,
        },
        inactive_by_value=inactive_by_value,
        inactive_other_values=other,
        group_mean_histogram=histogram,
        nan_rewards=nan_rewards,
        dropped={"groups": dropped_groups, "rows": dropped_rows, "reasons": drop_reasons},
        input={
            "path": "<stdin>" if inputs.is_stdin else inputs.spec,
            "format": sorted({s.format for s in inputs.shards}),
            "shards": len(inputs.shards),
            "bytes": inputs.total_bytes,
            "bytes_decoded": bytes_read,
        },
        output=output,
        options=options,
        mode=mode,
        device=device,
        elapsed_seconds=elapsed,
        verify=verify,
    )


# --------------------------------------------------------------------------- text


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
    if s.output is not None:
        rows.append(
            ("output", f"{s.output['path']} ({s.output['shards']} shard(s), {_bytes(s.output['bytes'])})")
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
        rows.append(("dropped", f"{s.dropped['groups']:,} groups, {s.dropped['rows']:,} rows"))
        for reason in s.dropped["reasons"]:
            rows.append(("  because", reason))
    rows.append(("time", f"{s.elapsed_seconds:.2f} s ({s.mode}, {s.device})"))
    return rows


def histogram_lines(summary: RunSummary, width: int = 30) -> list[str]:
    edges = summary.group_mean_histogram["edges"]
    counts = summary.group_mean_histogram["counts"]
    if not counts:
        return []
    peak = max(int(c) for c in counts) or 1
    lines = []
    for i, c in enumerate(counts):
        bar = "█" * round(width * int(c) / peak)
        close = "]" if i == len(counts) - 1 else ")"
        lines.append(f"  [{float(edges[i]):8.3g}, {float(edges[i + 1]):8.3g}{close} {bar} {c}")
    return lines


def render_compact(summary: RunSummary) -> str:
    """One line of figures, then one line per check (``grpo-cli check`` with checks)."""
    s = summary
    head = (
        f"{s.input['path']}: {s.rows:,} rows, {s.groups:,} groups, "
        f"{s.active_groups:,} active ({_pct(s.active_groups, s.groups)}), "
        f"{s.inactive_groups:,} inactive, {s.singleton_groups:,} singleton"
    )
    return "\n".join([head, *check_lines(summary)])


def render_plain(summary: RunSummary) -> str:
    rows = summary_lines(summary)
    width = max(len(label) for label, _ in rows)
    out = [f"{label.ljust(width)}  {value}" for label, value in rows]
    hist = histogram_lines(summary)
    if hist:
        out.append("group mean reward (solve rate) histogram:")
        out += hist
    out += check_lines(summary)
    return "\n".join(out)


def check_lines(summary: RunSummary) -> list[str]:
    lines = []
    for check in summary.checks:
        status = "PASS" if check["passed"] else "FAIL"
        lines.append(f"{status}  {check['name']}: {check['value']} (bound {check['bound']})")
    if summary.verify is not None:
        v = summary.verify
        lines.append(
            f"verify {v['column']}: {v['mismatched']:,} of {v['compared']:,} rows differ "
            f"(max |diff| {_fmt(v['max_abs_diff'])}, atol {v['atol']}, rtol {v['rtol']})"
        )
        for ex in v["examples"]:
            lines.append(
                f"  {ex['file']} row {ex['row']} group {ex['group']}: expected {ex['expected']:.8g}, "
                f"found {ex['actual']:.8g}"
            )
    return lines


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
        console.print("[bold]group mean reward (solve rate)[/bold]")
        for line in hist:
            console.print(line, highlight=False)
    for line in check_lines(summary):
        style = "green" if line.startswith("PASS") else "red" if line.startswith("FAIL") else ""
        console.print(f"[{style}]{line}[/{style}]" if style else line, highlight=False)


def _bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"
