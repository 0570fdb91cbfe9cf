"""Finding a dump's files: folders, files and globs in step order, empty steps, two files of
one step, links to nothing, a folder one level too high, and which trainer wrote a file."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from grpo_cli.errors import GrpoError, first_line, mention
from grpo_cli.inputs.sources import DANGLING, InputSet, Shard, matching_files
from grpo_cli.trainers.dumps.formats import DUMPS, EVAL_ONLY_STEP, DumpFormat, _pattern_text
from grpo_cli.trainers.dumps.loading import _input_format, _loaded


def _holds(shard: Shard, name: str) -> bool:
    from grpo_cli.inputs.readers import read_schema

    return name in read_schema(shard).names


def _display(path: Path) -> str:
    return os.fspath(path)


def _listed(values: list[int]) -> str:
    return ", ".join(str(v) for v in values[:5]) + (", ..." if len(values) > 5 else "")


def _dump_files(dump: DumpFormat, specs: Sequence[str]) -> tuple[list[tuple[Path, int | None]], bool]:
    """The dump's files in step order, each with its step, and whether a folder was named."""
    found: list[tuple[Path, int | None]] = []
    from_folder = False
    for spec in specs:
        if spec == "-":
            raise GrpoError(f"{mention('from_')} {dump.trainer} reads a dump's files, not standard input")
        path = Path(spec)
        if path.is_dir():
            from_folder = True
            _refuse_dangling(dump, path)
            matched = _files_in(dump, path)
            if not matched:
                _refuse_unread(dump, path)
                others = [
                    other
                    for other in DUMPS.values()
                    if other.trainer != dump.trainer and _files_in(other, path)
                ]
                hint = (
                    f"; it holds {others[0].article} {others[0].trainer} dump "
                    f"({_files_in(others[0], path)[0].name}, ...): "
                    f"use {mention('from_')} {_choice(others[0])}"
                    if others
                    else _below(dump, path) or trainer_hint([spec], but=dump.trainer)
                )
                raise GrpoError(
                    f"{spec}: holds no {dump.trainer} dump file ({dump.trainer} writes "
                    f"{_pattern_text(dump)}, "
                    f"with {dump.switch}){hint}"
                )
            found += [(p, _step_of(dump, p)) for p in matched]
        elif path.is_file():
            _refuse_unread(dump, path)
            found.append((path, _step_of(dump, path)))
        elif any(ch in spec for ch in "*?["):
            matches = matching_files(spec)
            if not matches:
                raise GrpoError(f"{spec}: the pattern matches no file")
            found += [(p, _step_of(dump, p)) for p in matches]
        else:
            raise GrpoError(f"{spec}: no such file or directory")
    found.sort(key=lambda item: (item[1] is None, item[1] or 0, str(item[0])))
    return found, from_folder


def _refuse_two_files_of_a_step(dump: DumpFormat, files: list[tuple[Path, int | None]]) -> None:
    """Refuse two files that name one step (``rollout_dump_data.step_01.jsonl`` beside
    ``..._step_1.jsonl``) of a trainer that writes one file a step: one of them is a copy, or
    another run's, and its rows would count twice."""
    if not dump.one_file_per_step:
        return
    first: dict[int, Path] = {}
    for path, step in files:
        if step is None:
            continue
        seen = first.setdefault(step, path)
        if seen != path:
            raise GrpoError(
                f"{_display(path)}: holds step {step}, as {_display(seen)} does ({dump.trainer} writes one "
                "file a step: a copy, or another run's?); name the files to read"
            )


def _is_empty(dump: DumpFormat, path: Path) -> bool:
    """Whether a dump file holds no record: no bytes, only white space, or a Parquet file of
    no rows."""
    size = path.stat().st_size
    if size == 0:
        return True
    if dump.layout == "parquet":
        try:
            return bool(pq.read_metadata(path).num_rows == 0)
        except (pa.ArrowException, OSError):
            return False  # refused as unreadable where it is read
    if dump.layout == "torch" or size > 1 << 16:
        return False
    return not path.read_bytes().strip()


def _without_empty_steps(
    dump: DumpFormat, files: list[tuple[Path, int | None]]
) -> tuple[list[tuple[Path, int | None]], list[str]]:
    """The dump's files less those it writes empty (``dump.writes_empty_steps``), with a note
    naming each; an empty file of a trainer that never writes one (a run stopped mid-write, a
    file truncated by a copy) is refused by name."""
    kept, skipped = [], []
    for path, step in files:
        if not _is_empty(dump, path):
            kept.append((path, step))
            continue
        what = (
            "no rows" if dump.layout == "parquet" else "no bytes" if not path.stat().st_size else "no record"
        )
        if dump.writes_empty_steps is None:
            raise GrpoError(
                f"{_display(path)}: an empty {dump.trainer} dump file ({what}); {dump.trainer} writes "
                "none (a run stopped while writing it, or a copy cut short?): name the files to read "
                "without it"
            )
        skipped.append(f"skipped {_display(path)}: empty ({what}); {dump.writes_empty_steps}")
    if not kept:
        raise GrpoError(
            f"{_display(files[0][0])}: every {dump.trainer} dump file named is empty ({len(files)} file(s))"
        )
    return kept, skipped


def _below(dump: DumpFormat, path: Path) -> str:
    """Where ``dump``'s files sit in a subfolder of ``path`` (a folder named a level or two too
    high: ``slime`` for ``slime/rollout_data``), the hint that names it, else ``""``."""
    for folder in _subfolders(path, depth=2):
        matched = _files_in(dump, folder)
        if matched:
            where = _display(folder)
            return f"; its {dump.trainer} files ({matched[0].name}, ...) sit in {where}: name that folder"
    return ""


def _subfolders(path: Path, *, depth: int) -> list[Path]:
    """The folders below ``path``, ``depth`` levels deep at most, nearest first (links not
    followed, hidden ones left out)."""
    found, level = [], [path]
    for _ in range(depth):
        level = [
            child
            for folder in level
            for child in sorted(folder.iterdir())
            if child.is_dir() and not child.is_symlink() and not child.name.startswith(".")
        ]
        found += level
    return found


def trainer_hint(specs: Sequence[str], *, but: str | None = None) -> str:
    """What a run's INPUT looks like when its columns do not fit the options: a trainer's dump
    (its files named as that trainer names them, with its fields), as ``"; it looks like a
    verl dump: use --from verl"`` with the folder to name, or ``""``. ``but``: a trainer not
    to name (the one ``--from`` already named)."""
    for spec in specs:
        path = Path(spec)
        if path.is_file():
            looks = _looks_like(path)
            if looks is not None and looks.trainer != but:
                return (
                    f"; it looks like {looks.article} {looks.trainer} dump: use {mention('from_')} "
                    f"{_choice(looks)}"
                )
            continue
        if not path.is_dir():
            continue
        for folder in (path, *_subfolders(path, depth=2)):
            for dump in DUMPS.values():
                if dump.trainer == but:
                    continue
                matched = _files_in(dump, folder)
                if not matched or _looks_like(matched[0]) is not dump:
                    continue
                where = "" if folder == path else f" {_display(folder)}"
                return (
                    f"; it holds {dump.article} {dump.trainer} dump ({matched[0].name}, ...): "
                    f"use {mention('from_')} {_choice(dump)}{where}"
                )
    return ""


def _files_in(dump: DumpFormat, path: Path) -> list[Path]:
    """The files of ``path`` (a folder) named as ``dump`` names its files, in name order."""
    folder = path / dump.subfolder if dump.subfolder and (path / dump.subfolder).is_dir() else path
    if dump.tree is not None:
        glob, rule = dump.tree
        return [p for p in sorted(folder.glob(glob)) if p.is_file() and rule.search(p.as_posix())]
    return [p for p in sorted(folder.glob("*")) if p.is_file() and dump.file_name.match(p.name)]


def _refuse_dangling(dump: DumpFormat, path: Path) -> None:
    """Refuse a link among a dump folder's files that leads to no file (a link to itself, to a
    file since removed): passed over, its step would be missing without a word. (A glob's
    search walks past no link unseen: every entry of the folders is looked at, links too.)"""
    folder = path / dump.subfolder if dump.subfolder and (path / dump.subfolder).is_dir() else path
    entries = folder.rglob("*") if dump.tree is not None else folder.glob("*")
    for entry in entries:
        named = (
            dump.tree[1].search(entry.as_posix())
            if dump.tree is not None
            else dump.file_name.match(entry.name)
        )
        if named and entry.is_symlink() and not entry.exists():
            raise GrpoError(f"{_display(entry)}: {DANGLING}")


def _refuse_unread(dump: DumpFormat, path: Path) -> None:
    """Refuse, without opening it, a file the trainer writes that grpo-cli does not read (or
    a folder that holds only such files), saying why."""
    candidates = [path] if path.is_file() else [p for p in sorted(path.rglob("*")) if p.is_file()]
    for pattern, why in dump.unread:
        hit = next((p for p in candidates if pattern.match(p.name)), None)
        if hit is not None:
            raise GrpoError(f"{_display(hit)}: {why}")


def _step_of(dump: DumpFormat, path: Path) -> int | None:
    if dump.tree is not None:
        found = dump.tree[1].search(path.as_posix())
        if found is None:
            return None
        return EVAL_ONLY_STEP if found["step"] is None else int(found["step"])  # SkyRL's eval_only
    match = dump.file_name.match(path.name)
    step = match.groupdict().get("step") if match is not None else None
    return int(step) if step is not None else None


def _schema_of(dump: DumpFormat, path: Path) -> pa.Schema:
    """The fields of one dump file, read the way its trainer wrote it."""
    if dump.layout == "parquet":
        try:
            return pq.read_schema(path)
        except (pa.ArrowException, OSError) as exc:
            raise GrpoError(f"{path}: not a readable Parquet file ({first_line(exc)})") from None
    if dump.layout in ("torch", "episodes"):
        return _loaded(dump, path).schema
    with InputSet([os.fspath(path)], input_format=_input_format(dump)) as inputs:
        from grpo_cli.inputs.readers import read_schema

        return read_schema(inputs.shards[0])


def _which(candidates: list[DumpFormat], first: tuple[Path, int | None]) -> DumpFormat:
    if len(candidates) == 1:
        return candidates[0]
    schema = _schema_of(candidates[0], first[0])
    for dump in candidates:
        if dump.tells_apart is not None and dump.tells_apart(schema):
            return dump
    return candidates[0]


def _check_fields(dump: DumpFormat, first: tuple[Path, int | None]) -> None:
    path = first[0]
    try:
        schema = _schema_of(dump, path)
    except GrpoError as exc:
        looks = _looks_like(path)
        if looks is None:
            raise
        raise GrpoError(
            f"{exc.template}; it looks like {looks.article} {looks.trainer} dump: use {mention('from_')} "
            f"{_choice(looks)}"
        ) from None
    missing = [name for name in dump.fields if name not in schema.names]
    if missing:
        looks = _looks_like(path, schema)
        hint = (
            f"; it looks like {looks.article} {looks.trainer} dump: use {mention('from_')} {_choice(looks)}"
            if looks
            else ""
        )
        raise GrpoError(
            f"{path}: not {dump.article} {dump.trainer} dump: it has no {', '.join(missing)} field "
            f"(its fields: {', '.join(schema.names[:8])}{', ...' if len(schema.names) > 8 else ''}){hint}"
        )


def _choice(dump: DumpFormat) -> str:
    return dump.name.split("-v")[0] if dump.name.startswith("verl") else dump.name


def _looks_like(path: Path, schema: pa.Schema | None = None) -> DumpFormat | None:
    """The dump format whose file name and fields ``path`` has, if any."""
    for dump in DUMPS.values():
        if not dump.file_name.match(path.name):
            continue
        try:
            found = schema if schema is not None else _schema_of(dump, path)
        except GrpoError:
            continue
        if all(name in found.names for name in dump.fields) and (
            dump.tells_apart is None or dump.tells_apart(found)
        ):
            return dump
    if schema is not None:
        for dump in DUMPS.values():
            if all(name in schema.names for name in dump.fields):
                return dump
    return None
