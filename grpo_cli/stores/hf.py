"""``hf://``: outputs on a Hugging Face dataset repo, one commit each."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from grpo_cli.errors import GrpoError, first_line
from grpo_cli.stores.base import CopiedPrefix, redact, refuse_to_replace
from grpo_cli.stores.gcs import _fsspec, _not_found


class HfOutput:
    """An ``hf://`` output: a file, or a folder of shards, in a Hub repo (a dataset's, or a model's),
    at a branch (``owner/name@BRANCH/path``; ``main`` where none is named).

    :meth:`check` runs when the output is claimed, before any work: the repo and the branch must
    exist and be readable with the token at hand, and what is there is replaced only with
    ``force``. :meth:`publish` makes one commit of the finished local files (and, for a folder,
    the removal of the shards of the output it replaces): the Hub applies a commit whole or not
    at all, so the output appears complete or not at all. The commit names the branch's head it
    read just before as its parent, so a push made in between fails the run rather than being
    overwritten. Each output of a run (data, summary, report) is a commit of its own.
    """

    def __init__(self, uri: str, *, directory: bool) -> None:
        self.uri = redact(uri)
        self.directory = directory
        self.fs, self.path = _fsspec(uri)
        self.path = self.path.rstrip("/")

    def _errors(self, doing: str) -> contextlib.AbstractContextManager[None]:
        return _hf_errors(self.uri, doing)

    def _resolved(self) -> Any:
        """The repo, revision and path in the repo the URI names (the repo and revision must exist)."""
        try:
            resolved = self.fs.resolve_path(self.path)
        except FileNotFoundError as missing:
            absent = (
                "no such repo or branch on the Hub; create the repo first "
                "(hf repo create OWNER/NAME --repo-type dataset)"
            )
            raise _not_found(self.uri, missing, absent) from None
        if not hasattr(resolved, "repo_id"):
            raise GrpoError(f"{self.uri}: grpo-cli writes to a repo's files, not to an hf:// bucket")
        if not resolved.path_in_repo:
            raise GrpoError(f"{self.uri}: name the file to write (hf://datasets/OWNER/NAME/path/out.parquet)")
        return resolved

    def check(self, *, force: bool, what: str) -> None:
        """Refuse, before any work, an output that cannot be written or would replace data."""
        with self._errors(f"write the {what} there"):
            resolved = self._resolved()
            existing = self._existing(resolved)
        refuse_to_replace(self.uri, existing, directory=self.directory, force=force)

    def _existing(self, resolved: Any) -> list[str]:
        """The paths in the repo the output would replace."""
        self.fs.invalidate_cache()
        if not self.directory:
            return [resolved.path_in_repo] if self.fs.isfile(self.path) else []
        if not self.fs.isdir(self.path):
            return []
        root = self.path + "/"
        return sorted(resolved.path_in_repo + "/" + name[len(root) :] for name in self.fs.find(self.path))

    def publish(
        self,
        local: Path,
        copied: dict[str, CopiedPrefix],
        *,
        progress: Callable[[int], None] | None = None,
    ) -> dict[str, Any]:
        """Commit ``local`` (the run's finished file, or folder of shards) as the output, in one
        commit. ``copied`` is unused: the Hub copies no byte range. Returns the bytes uploaded
        and the commit."""
        from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

        files = sorted(local.iterdir()) if self.directory else [local]
        with self._errors("commit the output"):
            resolved = self._resolved()
            base = resolved.path_in_repo
            added = {f"{base}/{file.name}" if self.directory else base: file for file in files}
            stale = [path for path in self._existing(resolved) if path not in added]
            api = HfApi()
            head = api.repo_info(
                resolved.repo_id, repo_type=resolved.repo_type, revision=resolved.revision
            ).sha
            operations: list[Any] = [CommitOperationAdd(path, str(file)) for path, file in added.items()]
            operations += [CommitOperationDelete(path) for path in stale]
            commit = api.create_commit(
                resolved.repo_id,
                operations,
                commit_message=f"grpo-cli: {base}",
                repo_type=resolved.repo_type,
                revision=resolved.revision,
                parent_commit=head,
            )
        uploaded = sum(file.stat().st_size for file in files)
        if progress is not None:
            progress(uploaded)
        return {
            "uri": self.uri,
            "objects": len(files),
            "bytes_uploaded": uploaded,
            "bytes_copied_in_store": 0,
            "commit": commit.oid,
        }


@contextlib.contextmanager
def _hf_errors(uri: str, doing: str) -> Iterator[None]:
    """huggingface_hub's errors, in one line each: a refusal (HTTP 401, 403), a branch moved by
    another push (HTTP 412), anything else with its first line."""
    try:
        yield
    except GrpoError:
        raise
    except Exception as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        text = first_line(exc)
        if status in (401, 403):
            raise GrpoError(f"{uri}: access denied when trying to {doing} (HTTP {status}: {text})") from None
        if status == 412:
            raise GrpoError(
                f"{uri}: the branch moved while the run wrote (another push); nothing was committed"
            ) from None
        raise GrpoError(f"{uri}: cannot {doing} ({text})") from None
