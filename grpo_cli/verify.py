"""``check --verify-advantage-col``: compare an existing advantage column with recomputed values.

A row *differs* when ``|given - expected| > atol + rtol * |expected|`` (NaN always
differs). A differing row is a trainer's rounding *residue*, not a mismatch, when the
exact value is decided by arithmetic a trainer does in floating point:

* its group is exactly constant (two or more identical rewards): the exact advantage
  is 0, and a trainer's float mean of identical values can leave a residue that its
  division by ``std + eps`` magnifies (OpenRLHF: -119.2 for 13 rewards of 0.7804687);
* with the leave-one-out baseline, the row's *other* rollouts are exactly identical:
  NeMo-RL's std of the others is then a rounding residue (235.9 for
  ``[0.9, 0.9, 0.9, 1.0]`` in float32, where the exact value is 0.1);
* its group's offset swallows its spread in float32 (``(n + 2) ulp32(max |r|)`` is more
  than ``2**-10`` of ``max - min``: float32 resolves the spread to fewer than ten bits)
  and the difference is within what that rounding can move an advantage,
  ``8 (n + 2) ulp32(max |r|) / d`` with ``d`` the group's divisor (std + eps, or 1):
  ``[1e6, 1e6 + 0.0625]`` gives ``[0, 1]`` in verl and OpenRLHF, where the exact value
  is ``[-0.707, 0.707]``.

Residue rows are reported but do not fail the check unless ``strict``.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import torch

from grpo_cli.config import VerifySpec
from grpo_cli.errors import GrpoError
from grpo_cli.kernel import GroupStats, group_std
from grpo_cli.keys import GroupKeyIndex, as_tensor
from grpo_cli.options import AdvantageOptions
from grpo_cli.sources import Shard


class Verifier:
    """Compares batches of an existing column with recomputed advantages; counts and examples."""

    def __init__(
        self, spec: VerifySpec, stats: GroupStats, options: AdvantageOptions, keys: GroupKeyIndex | None
    ) -> None:
        self.spec = spec
        self.keys = keys
        cpu = stats.to("cpu")
        self._stats = cpu
        self._constant = (cpu.count >= 2) & (cpu.minimum == cpu.maximum)
        self._lost_offset, self._residue_bound = _float32_rounding(cpu, options)
        self.compared = 0
        self.mismatched = 0
        self.residue = 0
        self.max_abs_diff = 0.0
        self.examples: list[dict[str, Any]] = []
        self.residue_examples: list[dict[str, Any]] = []

    def compare(
        self,
        column: pa.Array,
        expected_advantages: torch.Tensor,
        rewards: torch.Tensor,
        ids: torch.Tensor,
        shard: Shard,
        shard_row: int,
    ) -> None:
        """One batch: ``column`` as given, the recomputed advantages, the combined rewards, group IDs."""
        spec = self.spec
        if not (pa.types.is_floating(column.type) or pa.types.is_integer(column.type)):
            raise GrpoError(
                f"{shard.display}: column {spec.column!r} has type {column.type}; "
                "it must be numeric to verify"
            )
        given = as_tensor(
            pc.cast(column, pa.float64()).fill_null(float("nan")).to_numpy(zero_copy_only=False)
        )
        expected = expected_advantages.to(torch.float64)
        diff = (given - expected).abs()
        differs = ~(diff <= spec.atol + spec.rtol * expected.abs())  # NaN differs
        self.compared += given.numel()
        if diff.numel():
            finite = diff[torch.isfinite(diff)]
            if finite.numel():
                self.max_abs_diff = max(self.max_abs_diff, float(finite.max()))
            if not bool(torch.isfinite(diff).all()):
                self.max_abs_diff = float("inf")
        if not bool(differs.any()):
            return
        residue = differs & self._is_residue(rewards.to(torch.float64), ids, diff)
        mismatch = differs & ~residue
        self.residue += int(residue.sum())
        self.mismatched += int(mismatch.sum())
        for rows, examples in ((mismatch, self.examples), (residue, self.residue_examples)):
            for index in rows.nonzero().flatten().tolist():
                if len(examples) >= spec.max_examples:
                    break
                gid = int(ids[index])
                key = self.keys.key_at(gid) if self.keys is not None else gid
                examples.append(
                    {
                        "file": shard.display,
                        "row": shard_row + index,
                        "group": _jsonable(key),
                        "expected": float(expected[index]),
                        "actual": float(given[index]),
                    }
                )

    def _is_residue(self, rewards: torch.Tensor, ids: torch.Tensor, diff: torch.Tensor) -> torch.Tensor:
        stats = self._stats
        residue = self._constant[ids] | (self._lost_offset[ids] & (diff <= self._residue_bound[ids]))
        if stats.at_minimum is not None and stats.at_maximum is not None:
            others = stats.count[ids] - 1
            lone_max = (rewards == stats.maximum[ids]) & (stats.at_maximum[ids] == 1)
            lone_min = (rewards == stats.minimum[ids]) & (stats.at_minimum[ids] == 1)
            others_identical = (lone_max & (stats.at_minimum[ids] == others)) | (
                lone_min & (stats.at_maximum[ids] == others)
            )
            residue |= others_identical & (others >= 2)
        return residue

    @property
    def passed(self) -> bool:
        return self.mismatched == 0 and (not self.spec.strict or self.residue == 0)

    def result(self) -> dict[str, Any]:
        """The summary's ``verify`` object."""
        spec = self.spec
        return {
            "column": spec.column,
            "atol": spec.atol,
            "rtol": spec.rtol,
            "strict": spec.strict,
            "compared": self.compared,
            "mismatched": self.mismatched,
            "residue": self.residue,
            "max_abs_diff": self.max_abs_diff,
            "examples": self.examples,
            "residue_examples": self.residue_examples,
        }


def _float32_rounding(stats: GroupStats, options: AdvantageOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group: does float32 lose the spread to the offset, and how far can that move an advantage."""
    magnitude = torch.maximum(stats.minimum.abs(), stats.maximum.abs())
    magnitude = torch.where(torch.isfinite(magnitude), magnitude, torch.zeros_like(magnitude))
    _, exponent = torch.frexp(magnitude.to(torch.float64))
    ulp32 = torch.ldexp(torch.ones_like(magnitude), (exponent - 24).clamp_min(-149))
    if options.scale == "none":
        divisor = torch.ones_like(magnitude)
    else:
        ddof = 1 if options.std == "sample" else 0
        divisor = group_std(stats, ddof=ddof) + options.epsilon
    rounding = (stats.count.to(torch.float64) + 2) * ulp32
    lost_offset = rounding > (stats.maximum - stats.minimum) * 2.0**-10
    return lost_offset, 8 * rounding / divisor


def _jsonable(key: Any) -> Any:
    if isinstance(key, tuple):
        return [_jsonable(k) for k in key]
    if isinstance(key, (str, int, float, bool)) or key is None:
        return key
    return str(key)
