"""A run's configuration, and the plan both engines derive from it once.

:class:`ComputeConfig` is what the user asked for (plain data, validated).
:class:`RunPlan` is what follows from it: how many reward channels are normalised,
whether extreme counts are needed, which columns are read and which are written, the
output schema, and, once pass 1 has its statistics, the :class:`~grpo_cli.run.outcome.GroupOutcome`: the
normalisations, the active groups, the groups kept by the filters and the per-group
columns of ``--stats-cols``. The local and the Ray engine both go through it, so a rule
("an inactive group is one whose every channel is constant") is written once.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from grpo_cli.errors import GrpoError, mention
from grpo_cli.estimators import ESTIMATORS, GroupFacts, RowFacts
from grpo_cli.file_names import PROVENANCE_KEY
from grpo_cli.kernel import (
    BatchTransform,
    ExactSum,
    GroupStats,
    GroupStatsAccumulator,
    Normalization,
    RewardTotals,
    WeightedMoments,
    apply_normalization,
    group_std,
    squared_deviations_of,
    whitening,
)
from grpo_cli.options.config import ComputeConfig
from grpo_cli.run.figures import GroupRows, step_spans, top_two_of
from grpo_cli.run.outcome import BatchLayout, GroupOutcome, OutcomeTotals
from grpo_cli.run.rewards import RewardBatch, combined_advantages

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

    import pyarrow as pa

    from grpo_cli.inputs.sources import Shard
    from grpo_cli.run.reward_columns import RewardReader
    from grpo_cli.trainers.filters import FilterPart

# The plan's Arrow side (a shard's reward reader, the output's schema) imports pyarrow where it
# is used: the tensor API plans and runs without it.


def resolve_device(spec: str) -> torch.device:
    """``auto`` picks CUDA, then MPS, then CPU; anything else must be available."""
    available = ["cpu"]
    if torch.cuda.is_available():
        available += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        available.append("mps")
    if spec == "auto":
        return torch.device("cuda" if "cuda" in available else "mps" if "mps" in available else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise GrpoError(
            f"{mention('device')} {spec!r} is not a device name; use auto, cpu, cuda, cuda:N or mps"
        ) from None
    if spec not in available:
        raise GrpoError(
            f"{mention('device')} {spec} is not available here; available: {', '.join(available)}"
        )
    return device


class RunPlan:
    """The facts both engines derive from a :class:`ComputeConfig`, derived once."""

    def __init__(self, config: ComputeConfig, *, device: torch.device | None = None) -> None:
        config.validate()
        self.config = config
        self.device = device if device is not None else resolve_device(config.device)
        self.per_column = config.per_column
        """Each reward column is normalised on its own (GDPO), then the advantages summed."""
        self.channels = len(config.rewards) if self.per_column else 1
        self.count_extremes = config.advantage.baseline == "leave-one-out"
        self.input_columns = config.input_columns
        self.new_columns = config.new_columns
        self.estimator = ESTIMATORS[config.advantage.estimator]
        """The estimator's object: its needs and its steps between the passes and per row."""
        self.needs = self.estimator.needs + (("step_span",) if config.step_col is not None else ())
        """What the estimator needs from pass 1 (:data:`~grpo_cli.options.advantage.Need`), and the
        watched step column's span (:func:`~grpo_cli.run.steps.watched_step`)."""

    # ----------------------------------------------------------------- pass 1

    def accumulators(
        self, *, block_rows: int | None = None, expected_rows: int | None = None
    ) -> tuple[list[GroupStatsAccumulator], bool]:
        """One accumulator per channel, plus one for the combined reward when channels differ
        (``expected_rows``: the rows they will be fed, where known).

        Returns the accumulators (the combined one last when present) and whether it is
        present; with one channel the combined reward *is* the channel.
        """
        rows = block_rows or self.config.stats_block_rows

        def make(extremes: bool) -> GroupStatsAccumulator:
            return GroupStatsAccumulator(
                device=self.device,
                block_rows=rows,
                group_size=self.config.group_size,
                count_extremes=extremes,
                expected_rows=expected_rows,
            )

        channels = [make(self.count_extremes) for _ in range(self.channels)]
        if self.channels > 1:
            return [*channels, make(False)], True
        return channels, False

    # ----------------------------------------------------------------- between the passes

    def normalize(
        self, channel_stats: Sequence[GroupStats], *, batch_std: Sequence[torch.Tensor] | None = None
    ) -> tuple[list[Normalization], torch.Tensor]:
        """Each channel's normalisation, and the active groups (active in any channel).

        ``batch_std``: per channel, the std of each group's batch (``--scale batch`` with
        ``--batch-col``); by default the std of the whole input.
        """
        options = self.config.advantage
        norms = [
            options.normalization(stats, batch_std=None if batch_std is None else batch_std[channel])
            for channel, stats in enumerate(channel_stats)
        ]
        active = norms[0].active
        for extra in norms[1:]:
            active = active | extra.active
        return norms, active

    def outcome(
        self,
        channel_stats: Sequence[GroupStats],
        summary_stats: GroupStats,
        *,
        rows_per_group: np.ndarray,
        rows: int,
        nan_rewards: int,
        figures: Mapping[str, np.ndarray] | None = None,
        batches: BatchLayout | None = None,
        batch_stds: Sequence[Mapping[Any, float]] | None = None,
    ) -> GroupOutcome:
        """Everything pass 2 and the summary need, from pass 1's statistics and ``figures`` (the
        totals of :data:`~grpo_cli.run.figures.FIGURES` the run computes), the estimator's
        between-passes step among them.

        ``batch_stds``: with ``--scale batch``, each channel's std of each batch by its key
        (:meth:`batch_stds`; the key ``None`` without ``--batch-col``), where the groups of
        ``channel_stats`` are some of the run's (a Ray run's bucket); by default the std of
        each batch of these groups."""
        batch_std = None
        if self.config.advantage.scale == "batch":
            if batch_stds is None:
                totals = self.batch_totals(channel_stats, batches)
                batch_stds = self.batch_stds(totals, self.batch_squares(channel_stats, batches, totals))
            batch_std = self._per_group_std(channel_stats, batches, batch_stds)
        norms, active = self.normalize(channel_stats, batch_std=batch_std)
        active_cpu = active.cpu()
        figures = figures if figures is not None else {}
        top_two = top_two_of(figures)
        facts = GroupFacts(summary_stats, active_cpu, figures, batches, top_two, self.config.advantage)
        return GroupOutcome(
            norms=norms,
            active=active_cpu,
            stats=summary_stats,
            rows_per_group=rows_per_group,
            rows=rows,
            nan_rewards=nan_rewards,
            kept=self._kept_groups(active_cpu, summary_stats),
            drops_by_reason=self._drops_by_reason(active_cpu, summary_stats, rows_per_group),
            group_columns=self._group_columns(summary_stats, rows_per_group),
            drop_reasons=self.drop_reasons(),
            batches=batches,
            estimator_state=self.estimator.between_passes(facts),
            step_spans=step_spans(figures),
        )

    def filter_rows(self, rewards: RewardBatch, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``--trainer-filter``: every row's group ID and the reward the trainer's rule sees
        (:meth:`filter_values`), both engines."""
        return ids, self.filter_values(rewards)

    def filter_values(self, rewards: RewardBatch) -> np.ndarray:
        """The reward each row of ``rewards`` shows a trainer's rule, in the rewards' own dtype
        (unshaped with ``--filter-unshaped``): every row, a null as NaN, a NaN in its place, as
        the trainers hold them (TRL's ``nanstd`` counts a group's NaN slots), not only the rows
        grpo-cli scores."""
        seen = rewards.unshaped if self.config.filter_unshaped else rewards.combined
        assert seen is not None
        values: np.ndarray = seen.numpy()
        return values

    def trainer_filter_report(
        self,
        ids: np.ndarray,
        values: np.ndarray,
        active: torch.Tensor,
        *,
        by: Sequence[Any],
        batches: BatchLayout | None,
        key_at: Callable[[int], Any] | None,
    ) -> dict[str, Any]:
        """``--trainer-filter``: the trainer's rule on each group (its rows' ``values`` in input
        order, grouped by ``ids``) against the exact decision ``active``, per value of the first
        ``--by`` column, else of ``--batch-col`` (both engines)."""
        from grpo_cli.trainers.filters import split_by_group

        k = int(active.numel())
        part = self.trainer_filter_part(
            split_by_group(ids.astype(np.int64), values, k),
            active,
            order=np.arange(k, dtype=np.int64),
            key_at=key_at,
            by=by,
            batches=batches,
        )
        return self.trainer_filter_result(part)

    def trainer_filter_part(
        self,
        groups: Sequence[np.ndarray],
        active: torch.Tensor,
        *,
        order: np.ndarray,
        key_at: Callable[[int], Any] | None,
        by: Sequence[Any],
        batches: BatchLayout | None,
    ) -> FilterPart:
        """``--trainer-filter`` on some of the run's groups (each one's rewards in input order,
        ``order``: their places in the run's order), a part that merges with ``+`` (a Ray
        reducer's bucket, where the rule is each group's own)."""
        from grpo_cli.trainers.filters import filter_part

        name = self.config.trainer_filter
        assert name is not None
        return filter_part(
            name,
            groups,
            active.numpy().astype(bool),
            order=order,
            key_at=key_at,
            value_of_group=self.filter_partition(by, batches),
            batch_of_group=self.filter_batches(batches),
        )

    def trainer_filter_result(self, part: FilterPart) -> dict[str, Any]:
        """The summary's ``trainer_filter`` object from the run's merged :class:`FilterPart`."""
        from grpo_cli.trainers.filters import filter_report

        name = self.config.trainer_filter
        assert name is not None
        report = filter_report(name, part, column=self.filter_column)
        if self.config.advantage.shapes_rewards:
            report["rewards"] = "unshaped" if self.config.filter_unshaped else "shaped"
        return report

    @property
    def filter_column(self) -> str | None:
        """The column ``--trainer-filter``'s figures go by (a view of its decisions, which it
        never changes): the first ``--by`` column, else ``--batch-col``, else none."""
        return self.config.by_cols[0] if self.config.by_cols else self.config.batch_col

    def filter_batches(self, batches: BatchLayout | None) -> np.ndarray | None:
        """A whole-batch rule's batches: each group's ``--batch-col`` value ID, or ``None`` (the
        whole input one batch). ``--by`` never cuts them: it is a view of the results."""
        if self.config.batch_col is None:
            return None
        assert batches is not None
        return batches.of_group

    @property
    def whole_batch_filter(self) -> bool:
        """Whether ``--trainer-filter``'s rule decides a batch's groups together."""
        from grpo_cli.trainers.filters import FILTERS

        name = self.config.trainer_filter
        return name is not None and FILTERS[name].batch_rule is not None

    def filter_partition(
        self, by: Sequence[Any], batches: BatchLayout | None
    ) -> tuple[str, np.ndarray, list[Any]] | None:
        """Each group's value of :attr:`filter_column`, as (column, value ID per group, values)."""
        if by:
            return (by[0].column, by[0].of_group, by[0].keys)
        if self.config.batch_col is not None:
            assert batches is not None
            return (self.config.batch_col, batches.of_group, batches.keys)
        return None

    @property
    def keeps_group_rows(self) -> bool:
        """Whether pass 1 keeps every row of the groups (:class:`~grpo_cli.run.figures.GroupRows`:
        the need ``group_rewards``)."""
        return "group_rewards" in self.needs

    def with_group_rows(self, outcome: GroupOutcome, rows: GroupRows) -> GroupOutcome:
        """Where pass 1 keeps the groups' rows (:attr:`keeps_group_rows`): ``outcome`` with the
        estimator's state built from every row of its groups, in input order, in both engines
        (a Ray reducer's bucket) and the tensor API."""
        facts = GroupFacts(outcome.stats, outcome.active, {}, outcome.batches, None, self.config.advantage)
        state = self.estimator.of_group_rows(
            facts, torch.from_numpy(rows.ids), torch.from_numpy(rows.rewards), torch.from_numpy(rows.scored)
        )
        return replace(outcome, estimator_state=state)

    # ------------------------------------------------- --scale batch's divisor, in two rounds

    @staticmethod
    def _batch_parts(stats: GroupStats, batches: BatchLayout | None) -> Iterator[tuple[Any, GroupStats]]:
        """Each batch's key (``None``: the whole run) and its groups of ``stats``."""
        if batches is None or len(batches.keys) == 1:  # every group in it: no copy
            yield None if batches is None else batches.keys[0], stats
            return
        # the groups sorted by batch once (not a mask per batch: many batches of many groups)
        order = np.argsort(batches.of_group, kind="stable")
        bounds = np.searchsorted(batches.of_group[order], np.arange(len(batches.keys) + 1))
        for key, start, stop in zip(batches.keys, bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            yield key, stats.select(torch.from_numpy(order[start:stop]))

    def batch_totals(
        self, channel_stats: Sequence[GroupStats], batches: BatchLayout | None
    ) -> list[dict[Any, RewardTotals]]:
        """Round 1 of ``--scale batch``'s divisor: per channel, each batch's reward count,
        extremes and exact sum, by its key. Parts of the groups merge by ``+`` per key."""
        return [
            {key: RewardTotals.of_stats(part) for key, part in self._batch_parts(stats, batches)}
            for stats in channel_stats
        ]

    def batch_squares(
        self,
        channel_stats: Sequence[GroupStats],
        batches: BatchLayout | None,
        totals: Sequence[Mapping[Any, RewardTotals]],
    ) -> list[dict[Any, ExactSum]]:
        """Round 2, from the whole run's round 1 (``totals``): per channel, each batch's exact
        sum of squared deviations from its mean, by its key; parts merge by ``+`` per key."""
        return [
            {key: squared_deviations_of(part, merged[key]) for key, part in self._batch_parts(stats, batches)}
            for stats, merged in zip(channel_stats, totals, strict=True)
        ]

    def batch_stds(
        self, totals: Sequence[Mapping[Any, RewardTotals]], squares: Sequence[Mapping[Any, ExactSum]]
    ) -> list[dict[Any, float]]:
        """Per channel, each batch's reward std (the whole run's, merged from both rounds):
        the bits of :func:`~grpo_cli.kernel.batch_std` of the batch's groups, however cut."""
        ddof = 1 if self.config.advantage.std == "sample" else 0
        return [
            {key: merged.std(spread[key], ddof=ddof) for key, merged in channel.items()}
            for channel, spread in zip(totals, squares, strict=True)
        ]

    @staticmethod
    def _per_group_std(
        channel_stats: Sequence[GroupStats], batches: BatchLayout | None, stds: Sequence[Mapping[Any, float]]
    ) -> list[torch.Tensor]:
        """Per channel, the std of each group's batch, shape ``(num_groups,)``; of a run in one
        batch, the one std, shape ``()``."""
        out = []
        for stats, by_key in zip(channel_stats, stds, strict=True):
            dtype, device = stats.mean.dtype, stats.mean.device
            if batches is None or len(batches.keys) == 1:
                key = None if batches is None else batches.keys[0]
                out.append(torch.tensor(by_key[key], dtype=dtype, device=device))
                continue
            per_batch = torch.tensor([by_key[key] for key in batches.keys], dtype=dtype, device=device)
            out.append(per_batch[torch.from_numpy(batches.of_group).to(device)])
        return out

    def reward_reader(self, schema: pa.Schema, shard: Shard) -> RewardReader:
        """The reader of ``shard``'s reward columns under this run's options (both engines)."""
        from grpo_cli.run.reward_columns import RewardReader

        return RewardReader(
            self.config.rewards,
            schema,
            shard,
            per_column=self.per_column,
            reward_sum=self.config.advantage.reward_sum,
            shaping=self.config.advantage,
            length_col=self.config.length_col,
            truncated_col=self.config.truncated_col,
        )

    @property
    def needs_moments_pass(self) -> bool:
        """Whether advantages are whitened or re-normalised over their batch (an extra pass)."""
        return self.whitening is not None

    @property
    def whitening(self) -> str | None:
        """The batch transform's method (see :func:`~grpo_cli.kernel.whitening`), or ``None``."""
        options = self.config.advantage
        if self.per_column and options.renormalize != "none":
            return options.renormalize
        return None if options.whiten == "none" else options.whiten

    def transform(self, moments: WeightedMoments) -> BatchTransform:
        assert self.whitening is not None
        return whitening(moments, method=self.whitening)

    def _kept_groups(self, active: torch.Tensor, stats: GroupStats) -> torch.Tensor | None:
        masks = self._filter_masks(active, stats)
        if not masks:
            return None
        keep = torch.ones(active.numel(), dtype=torch.bool)
        for passes in masks:
            keep &= passes
        return keep

    def _filter_masks(self, active: torch.Tensor, stats: GroupStats) -> list[torch.Tensor]:
        """Per filter, in the order of :meth:`drop_reasons`, the groups it keeps."""
        config = self.config
        masks = []
        if config.drop_inactive:
            masks.append(active.clone())
        if config.keep_mean_range is not None:
            low, high = config.keep_mean_range
            mean = stats.mean.cpu()
            masks.append((mean >= low) & (mean <= high))
        return masks

    def _drops_by_reason(
        self, active: torch.Tensor, stats: GroupStats, rows_per_group: np.ndarray
    ) -> list[dict[str, Any]]:
        """Groups and rows each filter drops (a group may fail several)."""
        out = []
        for reason, passes in zip(self.drop_reasons(), self._filter_masks(active, stats), strict=True):
            dropped = (~passes).numpy()
            out.append(
                {"reason": reason, "groups": int(dropped.sum()), "rows": int(rows_per_group[dropped].sum())}
            )
        return out

    def _group_columns(
        self, stats: GroupStats, rows_per_group: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        if not self.config.stats_cols:
            return None
        stats = stats.to("cpu")
        ddof = 1 if self.config.advantage.std == "sample" else 0
        return stats.mean.numpy(), group_std(stats, ddof=ddof).numpy(), rows_per_group

    def drop_reasons(self) -> list[str]:
        config = self.config
        reasons = []
        if config.drop_inactive:
            reasons.append("inactive group (--drop-inactive)")
        if config.keep_mean_range is not None:
            low, high = config.keep_mean_range
            reasons.append(f"group mean reward outside [{low}, {high}] (--keep-mean-range)")
        return reasons

    # ----------------------------------------------------------------- pass 2

    def row_advantages(
        self,
        batch: pa.RecordBatch,
        reader: RewardReader,
        ids: torch.Tensor,
        outcome: GroupOutcome,
        *,
        active_device: torch.Tensor,
        first_row: int = 0,
        global_row: int = 0,
    ) -> tuple[RewardBatch, torch.Tensor, torch.Tensor | None]:
        """One batch's rewards, its advantages before any batch transform (CPU), and batch IDs
        where a batch transform or the estimator reads them (``None`` elsewhere) (``first_row``: the
        batch's first row in its shard, ``global_row``: in the whole input).
        """
        rewards = reader.read(batch, first_row)
        baselines = None
        if "row_baselines" in self.needs:
            assert self.config.baseline_col is not None
            baselines = reader.column(batch, self.config.baseline_col, first_row)
        result, batch_ids = self.advantages_of(
            rewards, ids, outcome, active_device=active_device, global_row=global_row, baselines=baselines
        )
        return rewards, result, batch_ids

    def advantages_of(
        self,
        rewards: RewardBatch,
        ids: torch.Tensor,
        outcome: GroupOutcome,
        *,
        active_device: torch.Tensor,
        global_row: int = 0,
        baselines: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rows' advantages before any batch transform (CPU), from their rewards and group IDs
        (int64 ``(N,)``), and their batch IDs where a batch transform or the estimator reads
        them (``None`` elsewhere); ``baselines``: ``--baseline-col``'s values (float64) where the
        estimator needs them; ``global_row``: the first row's place in the whole input."""
        weights = [spec.weight for spec in self.config.rewards]
        result = combined_advantages(
            rewards, ids, outcome.norms, active_device, weights=weights, device=self.device
        )
        result = result.cpu()
        batch_ids = None  # a gather of every row: only where a batch transform or the estimator reads it
        if "batch_nonzero" in self.needs or outcome.transform is not None or self.needs_moments_pass:
            batches = outcome.batches
            batch_ids = torch.zeros_like(ids) if batches is None else torch.from_numpy(batches.of_group)[ids]
        rows = RowFacts(rewards, ids, global_row, result, outcome.active, batch_ids, baselines)
        return self.estimator.per_row(outcome.estimator_state, rows), batch_ids

    @property
    def range_follows_from_stats(self) -> bool:
        """Whether the advantages' min and max follow from the group statistics alone.

        With the mean baseline, one channel and no batch transform, an advantage is an
        increasing function of the reward within its group, so a group's extremes are the
        advantages of its smallest and largest reward.
        """
        options = self.config.advantage
        return (
            self.channels == 1
            and options.baseline == "mean"
            and self.estimator.range_from_extremes
            and self.whitening is None
            and options.clip is None
        )

    def advantage_range_from_stats(
        self, outcome: GroupOutcome, dtype: torch.dtype
    ) -> tuple[float, float] | None:
        """The min and max advantage, computed bit for bit as pass 2 would, from each group's
        smallest and largest reward (``check`` without a second pass)."""
        norm = outcome.norms[0]
        stats = norm.stats
        seen = (stats.count > 0).nonzero().flatten()
        if not seen.numel():  # no reward counts: every row left out has advantage 0, as pass 2 writes
            return (0.0, 0.0) if outcome.nan_rewards else None
        values = torch.cat([stats.minimum[seen], stats.maximum[seen]])
        ids = torch.cat([seen, seen])
        advantages = apply_normalization(values, ids, norm).to(dtype).to(torch.float64)
        low, high = float(advantages.min()), float(advantages.max())
        if outcome.nan_rewards:  # rows left out of the statistics get advantage 0
            low, high = min(low, 0.0), max(high, 0.0)
        return low, high

    def finish(
        self,
        advantages: torch.Tensor,
        batch_ids: torch.Tensor | None,
        outcome: GroupOutcome,
        *,
        scored: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The batch transform (whitening, re-normalisation) and ``--clip-advantage``, on the CPU.

        ``scored`` (bool, the rows' shape): the rows whose reward counts; a row left out by
        ``--nan ignore`` keeps advantage 0, which a whitening's shift would otherwise move.
        """
        result = advantages.cpu()
        if outcome.transform is not None:
            assert batch_ids is not None  # row_advantages gives them wherever there is a transform
            result = outcome.transform.apply(result, batch_ids)
            if scored is not None:
                result = torch.where(scored.cpu(), result, torch.zeros_like(result))
        clip = self.config.advantage.clip
        if clip is not None:
            result = result.clamp(clip[0], clip[1])
        return result

    def output_dtype(self, schema: pa.Schema) -> torch.dtype:
        """The advantage column's dtype for a shard of ``schema``."""
        from grpo_cli.arrow.columns import field_type
        from grpo_cli.run.reward_columns import advantage_dtype

        if len(schema) == 0:  # an empty JSONL file: JSON numbers read as float64
            return torch.float64
        return advantage_dtype([field_type(schema, r.column) for r in self.config.rewards])

    def output_schema(self, schema: pa.Schema, provenance: bytes) -> pa.Schema:
        """The input's schema with the new columns appended and the provenance entry set."""
        import pyarrow as pa

        config = self.config
        floats = {torch.float16: pa.float16(), torch.float32: pa.float32(), torch.float64: pa.float64()}
        fields = [
            pa.field(config.advantage_col, floats[self.output_dtype(schema)]),
            pa.field(config.active_col, pa.bool_()),
        ]
        if config.stats_cols:
            prefix = config.advantage_col
            fields += [
                pa.field(f"{prefix}_group_mean", pa.float64()),
                pa.field(f"{prefix}_group_std", pa.float64()),
                pa.field(f"{prefix}_group_size", pa.int64()),
            ]
        out = schema
        for f in fields:
            out = out.append(f)
        return out.with_metadata({**(schema.metadata or {}), PROVENANCE_KEY: provenance})

    def provenance(self, inputs: Sequence[str], totals: OutcomeTotals | None = None) -> bytes:
        """The ``grpo_cli`` key-value entry of every Parquet output: how it was made.

        JSON: ``version``, ``options`` (every option in force, after the preset, as in the
        summary), ``inputs``, and from the outcome's ``totals`` the input ``rows``, ``groups``,
        ``active_groups`` and ``rows_written``. ``check --verify`` reads it back
        (:meth:`ComputeConfig.from_provenance`).
        """
        from grpo_cli import __version__

        record: dict[str, Any] = {
            "version": __version__,
            "options": self.config.options_summary(),
            "inputs": list(inputs),
        }
        if totals is not None:
            record.update(
                rows=totals.rows,
                groups=totals.groups,
                active_groups=totals.active_groups,
                rows_written=totals.rows - totals.dropped_rows,
            )
        return json.dumps(record, sort_keys=True).encode()
