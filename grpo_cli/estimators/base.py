"""What an estimator is: the options it sets, the pass-1 figures it needs, a step between the
passes and a step per row (standard library only at import: the steps import torch and the
kernel when a run calls them, so ``--help`` and the option catalogue load without them).

Both engines call the steps through :class:`~grpo_cli.run.plan.RunPlan`: the between-passes
step on the figures of some of the run's groups (all of them, or a Ray reducer's bucket), the
per-row step on each batch of pass 2. An estimator that needs every reward of its groups
(``"group_rows"``) also builds its state from those rows, and that state travels between
machines as columns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    import numpy as np
    import torch

    from grpo_cli.kernel import GroupStats, TopTwo

Need = Literal[
    "row_lengths", "row_baselines", "length_sums", "batch_nonzero", "top_two", "group_rewards", "step_span"
]
"""What a run needs from pass 1 beyond a reward and a group per row: each row's length
(``--length-col``) or baseline reward (``--baseline-col``), the groups' length sums, each batch's
count of non-zero rewards, each group's top two rewards and first best row, every reward of
each group (held in memory: 16 bytes a row), the watched step column's span of each group
(:func:`~grpo_cli.run.steps.watched_step`, never an estimator's)."""


class Options(Protocol):
    """The advantage options a step reads (:class:`~grpo_cli.options.advantage.AdvantageOptions`;
    the estimators sit below the options, which read them)."""

    @property
    def epsilon(self) -> float: ...
    @property
    def std(self) -> Any: ...
    @property
    def scale(self) -> Any: ...
    @property
    def gpg_f_norm(self) -> float: ...
    @property
    def pass_k(self) -> int | None: ...


class Batches(Protocol):
    """Each group's training batch and each batch's counts (:class:`~grpo_cli.run.outcome.BatchLayout`)."""

    @property
    def of_group(self) -> np.ndarray: ...
    @property
    def rows(self) -> np.ndarray: ...
    @property
    def nonzero_rewards(self) -> np.ndarray | None: ...


class Rewards(Protocol):
    """A batch's combined reward and which rows are scored (:class:`~grpo_cli.run.rewards.RewardBatch`)."""

    @property
    def combined(self) -> torch.Tensor: ...
    @property
    def combined_valid(self) -> torch.Tensor | None: ...


@dataclass(frozen=True)
class GroupFacts:
    """Pass 1's figures of some of the run's groups, as a between-passes step reads them.

    ``stats``: the combined reward's statistics (CPU); ``active``: bool ``(K,)`` on the CPU;
    ``figures``: each :data:`~grpo_cli.run.figures.FIGURES` total the run computes, ``(K,)``;
    ``batches``: each group's training batch and the batches' counts; ``top_two``: each
    group's best two rewards, where the estimator needs them.
    """

    stats: GroupStats
    active: torch.Tensor
    figures: Mapping[str, np.ndarray]
    batches: Batches | None
    top_two: TopTwo | None
    options: Options


@dataclass(frozen=True)
class RowFacts:
    """One batch of pass 2, as a per-row step reads it.

    ``advantages``: the group normalisation's advantage of each row (CPU), what an estimator
    without a per-row step writes; ``ids``: int64 group IDs ``(N,)``; ``first_position``: the
    batch's first row in the whole input; ``batch_ids``: each row's training batch, where the
    run reads them; ``baselines``: ``--baseline-col``'s values where the estimator needs them.
    """

    rewards: Rewards
    ids: torch.Tensor
    first_position: int
    advantages: torch.Tensor
    active: torch.Tensor
    batch_ids: torch.Tensor | None
    baselines: torch.Tensor | None


@dataclass(frozen=True)
class AdvantageEstimator:
    """One ``--estimator``: the options it sets (``settings``, over the preset's), what it
    computes (``summary``, a phrase for ``--help``; ``description``, the documentation's row,
    with the trainer code it matches), the trainer or paper it comes from (``origin``), what it
    needs from pass 1 (``needs``), and its steps (a subclass overrides them; this one's are the
    group normalisation's alone).

    ``own_baseline``: it subtracts a baseline of its own, not the group mean of ``--baseline``;
    ``row_input``: what its per-row column is, where it needs one; ``takes``: the advantage
    options only it reads (field: what the value is); ``range_from_extremes``: within a group
    its advantage increases with the reward, so ``check`` finds the advantages' range from
    each group's extremes without a second pass.
    """

    name: str
    settings: Mapping[str, Any]
    summary: str
    description: str
    origin: str = ""
    needs: tuple[Need, ...] = ()
    own_baseline: bool = False
    row_input: str = ""
    takes: Mapping[str, str] = field(default_factory=dict)
    range_from_extremes: bool = False

    @property
    def group_only(self) -> bool:
        """Whether the kernel's group normalisation alone computes it (no batch-wide step, no
        per-row input, no per-row step): the tensor API's direct path."""
        return not self.needs and not self.whitens and type(self).per_row is AdvantageEstimator.per_row

    @property
    def whitens(self) -> bool:
        """Whether it whitens its advantages over the batch by its own settings."""
        return bool(self.settings.get("whiten", "none") != "none")

    @property
    def help(self) -> str:
        """Its phrase in ``--estimator``'s help: ``gpg (verl): alpha (r - mean)``."""
        return f"{self.name}{f' ({self.origin})' if self.origin else ''}: {self.summary}"

    def between_passes(self, facts: GroupFacts) -> Any:
        """Its state of these groups, once pass 1 is done (``None``: it keeps none)."""
        return None

    def of_group_rows(
        self, facts: GroupFacts, ids: torch.Tensor, values: torch.Tensor, scored: torch.Tensor
    ) -> Any:
        """With the need ``"group_rewards"``: its state of these groups from every row of them
        (group ID, combined reward in float64, bool scored, each group's rows in input order)."""
        raise NotImplementedError(f"estimator {self.name!r} reads no rows between the passes")

    def state_columns(self, state: Any) -> dict[str, np.ndarray]:
        """The state :meth:`of_group_rows` built, as columns of equal length, the first the
        entry's group (ID within the groups it was built of), to travel between machines."""
        raise NotImplementedError(f"estimator {self.name!r} keeps no state of rows")

    def state_of_columns(self, parts: Sequence[Mapping[str, np.ndarray]], sizes: Sequence[int]) -> Any:
        """The states of parts of the groups (:meth:`state_columns`, ``sizes``: each part's
        groups) laid end to end, the groups numbered in the parts' order."""
        raise NotImplementedError(f"estimator {self.name!r} keeps no state of rows")

    def per_row(self, state: Any, rows: RowFacts) -> torch.Tensor:
        """Each row's advantage before the batch transform (CPU), from its state."""
        return rows.advantages
