"""The checks ``grpo-cli check`` is asked for, each an option declared on its field; their
evaluation is :func:`grpo_cli.results.checks.evaluate_checks`. Plain data, standard library only.

>>> CheckBounds(min_groups=3).min_groups, CheckBounds().uniform_group_size
(3, False)
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_cli.options.declare import option


@dataclass(frozen=True)
class CheckBounds:
    """The checks asked for; ``None`` means not asked."""

    max_inactive_fraction: float | None = option(
        None,
        "--max-inactive-fraction",
        help="Fail if more than F of the groups are inactive.",
        min=0.0,
        max=1.0,
    )
    min_active_groups: int | None = option(
        None, "--min-active-groups", help="Fail if fewer than N groups are active.", min=0
    )
    min_groups: int | None = option(
        None, "--min-groups", help="Fail if there are fewer than N groups.", min=0
    )
    min_group_size: int | None = option(
        None, "--min-group-size", help="Fail if any group has fewer than N rollouts.", min=1
    )
    max_group_size: int | None = option(
        None, "--max-group-size", help="Fail if any group has more than N rollouts.", min=1
    )
    uniform_group_size: bool = option(
        False, "--uniform-group-size", help="Fail unless every group has the same size."
    )
    sound_grouping: bool = option(
        False,
        "--sound-grouping",
        help="Fail if the groups look keyed wrongly: groups that span steps, groups merged to two or more "
        "times the common size, a key that makes most rollouts singletons (the summary's findings; "
        "a trainer's own grouping, read with --from, is not failed).",
    )
    max_singleton_groups: int | None = option(
        None, "--max-singleton-groups", help="Fail if more than N groups have one rollout.", min=0
    )
    max_misclassified_groups: int | None = option(
        None,
        "--max-misclassified-groups",
        help="With --trainer-filter: fail if the trainer's rule decides more than N groups otherwise than "
        "the exact rule.",
        min=0,
        metavar="N",
    )
    validate_pages: bool = option(
        False,
        "--validate-pages",
        help="Decode every page of every Parquet input, verifying page checksums where the writer wrote "
        "them; fail on the first that does not decode (compute's splicing copies the bytes of columns "
        "it does not read without decoding them).",
    )
