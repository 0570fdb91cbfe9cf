"""What no output may touch: the inputs of a run, resolved (:class:`ProtectedInputs`), which
the inputs describe and the write guard (:mod:`grpo_cli.outputs.guard`) checks every claim
against."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from grpo_cli.stores import redact


def resolve(path: str | os.PathLike[str]) -> Path:
    """The absolute path with every symbolic link and ``..`` followed (it need not exist)."""
    return Path(os.path.realpath(os.path.abspath(os.fspath(path))))


def is_within(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or lies below it (both resolved)."""
    return path == folder or folder in path.parents


def _same_file(a: Path, b: Path) -> bool:
    """Also true for two hard links to one file."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a == b


@dataclass(frozen=True)
class ProtectedInputs:
    """What no output may touch: the resolved input files and the input directories named,
    and the object-store URIs read."""

    files: tuple[Path, ...] = ()
    directories: tuple[Path, ...] = ()
    labels: dict[Path, str] = field(default_factory=dict)
    uris: tuple[str, ...] = ()

    @classmethod
    def of(
        cls, files: Iterable[tuple[Path, str]], directories: Iterable[Path] = (), uris: Iterable[str] = ()
    ) -> ProtectedInputs:
        resolved = [(resolve(path), label) for path, label in files]
        return cls(
            files=tuple(p for p, _ in resolved),
            directories=tuple(resolve(d) for d in directories),
            labels=dict(resolved),
            uris=tuple(uris),
        )

    def remote_conflict(self, uri: str) -> str | None:
        """Why writing the object-store ``uri`` (or below it) would touch an input read from a store."""
        from grpo_cli.stores import same_or_within

        for read in self.uris:
            if same_or_within(uri, read) or same_or_within(read, uri):
                return f"overwrite the input {redact(read)}"
        return None

    def conflict(self, target: Path) -> str | None:
        """Why writing ``target`` (resolved) or anything inside it would touch an input."""
        for path in self.files:
            if target == path or _same_file(target, path):
                return f"overwrite the input {self.labels.get(path, path)}"
            if is_within(path, target):
                return f"contain the input {self.labels.get(path, path)}"
        for folder in self.directories:
            if is_within(folder, target):
                return f"contain the input directory {folder}"
            if is_within(target, folder):
                return f"lie inside the input directory {folder}"
        return None
