"""The option vocabulary: every fixed set of choices, defined once (standard library only),
at the bottom of the layers: the kernel and the options both read it.

The kernel types its keyword arguments with these ``Literal`` types, the CLI's
options take their choices from them (Typer validates a ``Literal`` annotation), and
:func:`check_choice` is the one validation of a value that did not come through
the CLI.

>>> choices_of(Std)
('population', 'sample')
>>> check_choice("--std", "sample", Std)
>>> check_choice("--std", "bessel", Std)
Traceback (most recent call last):
...
grpo_cli.errors.GrpoError: --std must be one of population, sample, got 'bessel'
>>> check_choice("--std", "smaple", Std)
Traceback (most recent call last):
...
grpo_cli.errors.GrpoError: --std must be one of population, sample, got 'smaple'; did you mean 'sample'?
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from grpo_cli.errors import GrpoError

Std = Literal["population", "sample"]
Scale = Literal["group", "batch", "none", "mean"]
Baseline = Literal["mean", "leave-one-out"]
EpsilonMode = Literal["add", "clamp", "add-if-nonzero"]
Singleton = Literal["zero", "raw"]
NanPolicy = Literal["error", "ignore"]
Estimator = Literal[
    "grpo",
    "dr_grpo",
    "rloo",
    "reinforce_plus_plus_baseline",
    "reinforce_baseline",
    "gpg",
    "remax",
    "opo",
    "grpo_passk",
    "maxrl",
    "pass_at_k",
    "reinforce",
]
OverlongStyle = Literal["capped", "uncapped"]
Whiten = Literal["none", "unbiased", "population", "areal", "trl-rloo"]
Renormalize = Literal["none", "trl", "gdpo"]
Aggregation = Literal["sum-then-normalize", "normalize-then-sum"]
RewardSum = Literal["sum", "nansum"]
InputFormat = Literal["parquet", "jsonl", "json", "csv", "arrow", "json-columns"]
Engine = Literal["local", "ray"]
Color = Literal["auto", "always", "never"]
CheckFormat = Literal["text", "github", "junit"]
"""How ``check`` reports its checks to a CI system (``--output-format``)."""
Compression = Literal["snappy", "zstd", "gzip", "lz4", "brotli", "none"]
Preset = Literal["trl", "trl-rloo", "verl", "openrlhf", "nemo-rl", "roll", "torchrl", "slime", "areal"]
TrainerFilterName = Literal[
    "dapo",
    "dapo-float64",
    "verl-v1",
    "skyrl",
    "slime",
    "slime-fallback",
    "roll",
    "nemo-rl",
    "prime-rl",
    "trl",
    "trl-batch",
]
"""The trainers' no-signal rules ``check --trainer-filter`` applies (:mod:`grpo_cli.trainers.filters`)."""
Trainer = Literal["verl", "trl", "nemo-rl", "roll", "slime", "skyrl", "prime-rl", "areal", "open-instruct"]
"""The trainers whose rollout dumps ``--from`` reads (:mod:`grpo_cli.trainers.dumps`)."""


def choices_of(vocabulary: Any) -> tuple[str, ...]:
    """The values of a ``Literal`` vocabulary, in their documented order."""
    return tuple(get_args(vocabulary))


def check_choice(option: str, value: object, vocabulary: Any) -> None:
    """Raise :class:`~grpo_cli.errors.GrpoError` unless ``value`` is one of ``vocabulary``."""
    allowed = choices_of(vocabulary)
    if value not in allowed:
        import difflib

        close = (
            difflib.get_close_matches(str(value), allowed, n=1, cutoff=0.6) if isinstance(value, str) else []
        )
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise GrpoError(f"{option} must be one of {', '.join(allowed)}, got {value!r}{hint}")
