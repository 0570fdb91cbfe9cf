"""File names: which suffix is which format grpo-cli reads, writes or refuses; what an output
name asks for; the footer key that marks grpo-cli's own Parquet files (standard library only).

>>> output_format("out.jsonl.zst"), output_format("-"), output_format("out/")
('jsonl', 'jsonl', 'parquet')
>>> output_is_directory("out.pq"), output_is_directory("shards")
(False, True)
"""

from __future__ import annotations

from pathlib import Path

from grpo_cli.errors import GrpoError

PARQUET_SUFFIXES = (".parquet", ".pq")
ARROW_SUFFIXES = (".arrow", ".feather", ".ipc")
COMPRESSION_SUFFIXES = {".gz": "gzip", ".zst": "zstd"}
TEXT_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv"}
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz", ".jsonl.zst", ".ndjson.zst")
READ_SUFFIXES = (
    *PARQUET_SUFFIXES,
    *ARROW_SUFFIXES,
    *(text + comp for text in TEXT_SUFFIXES for comp in ("", *COMPRESSION_SUFFIXES)),
)
PROVENANCE_KEY = b"grpo_cli"
# Data formats grpo-cli does not read: refused in an input directory or glob rather than
# skipped, so that no rows are left out silently.
OTHER_DATA_SUFFIXES = (
    ".json",
    ".csv",
    ".tsv",
    ".arrow",
    ".feather",
    ".ipc",
    ".gz",
    ".zst",
    ".bz2",
    ".xz",
    ".orc",
    ".avro",
)
# Names grpo-cli cannot honour as a Parquet output: a data format of another kind.
FOREIGN_SUFFIXES = (".jsonl", ".ndjson", ".txt", ".zip", *OTHER_DATA_SUFFIXES)


def output_format(path: str) -> str:
    """``jsonl`` for ``-`` (standard output) and .jsonl/.ndjson names (.gz, .zst), else ``parquet``."""
    return "jsonl" if path == "-" or Path(path).name.lower().endswith(JSONL_SUFFIXES) else "parquet"


def output_is_directory(path: str) -> bool:
    """``-o`` names one file when it ends in .parquet, .pq or a JSONL suffix (or is ``-``),
    else a directory of Parquet shards.

    A name grpo-cli cannot honour (another data format) is refused.
    """
    name = Path(path).name.lower()
    if path == "-" or name.endswith(PARQUET_SUFFIXES + JSONL_SUFFIXES):
        return False
    for suffix in FOREIGN_SUFFIXES:
        if name.endswith(suffix):
            raise GrpoError(
                f"{path}: grpo-cli writes Parquet or JSON lines; name a .parquet or .jsonl file, or a "
                f"directory (without a {suffix} suffix) for one Parquet shard per input"
            )
    return True
