"""Pass 1's group IDs kept packed for pass 2: every row's ID comes back as int64, in order,
however the chunks are cut, packed (runs or narrow IDs) and taken, in memory and on disk."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_cli.engines.local.spool import MIN_MEAN_RUN, _IdSpool, _PackedIds

ID_RANGES = st.sampled_from([3, 1000, 2**31 - 1, 2**31, 2**40])


@st.composite
def chunked_ids(draw: st.DrawFn) -> tuple[list[np.ndarray], list[int]]:
    """IDs in runs of random lengths (some of one row, as shuffled input has), cut into chunks,
    and the sizes of the takes that read them back."""
    high = draw(ID_RANGES)
    runs = draw(st.lists(st.tuples(st.integers(0, high), st.integers(1, 12)), max_size=60))
    ids = np.repeat(
        np.array([v for v, _ in runs], dtype=np.int64), np.array([n for _, n in runs], dtype=np.int64)
    )
    cuts = sorted(draw(st.lists(st.integers(0, ids.size), max_size=6)))
    chunks = np.split(ids, cuts)
    takes = draw(st.lists(st.integers(0, ids.size + 2), min_size=1, max_size=8))
    return chunks, takes


def runs_of(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each run's ID and first row, as the key index gives them."""
    starts = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1])))
    return ids[starts], starts


@settings(max_examples=300, deadline=None)
@given(chunked_ids(), st.booleans(), st.booleans())
def test_every_id_comes_back_in_order_as_int64(case, on_disk, runs_given):
    """Whether the spool finds the runs or is given them (as the key index finds them)."""
    chunks, takes = case
    expected = np.concatenate(chunks) if chunks else np.zeros(0, np.int64)
    spool = _IdSpool(on_disk=on_disk)
    try:
        for chunk in chunks:
            spool.append(chunk, runs_of(chunk) if runs_given and chunk.size else None)
        for _ in range(2):  # the moments pass reads the spool, and then pass 2 again
            take = spool.reader()
            got = [take(n) for n in takes]
            got.append(take(expected.size))  # the rest
            assert all(part.dtype == np.int64 for part in got)
            assert np.concatenate(got).tolist() == expected.tolist()
    finally:
        spool.close()


def test_sorted_ids_are_kept_as_runs_and_others_narrow():
    sorted_ids = np.repeat(np.arange(1000, dtype=np.int64), 8)
    runs = _PackedIds.of(sorted_ids)
    assert runs.ends is not None and runs.values.size == 1000 and runs.values.dtype == np.int32
    shuffled = np.random.default_rng(0).permutation(sorted_ids)
    plain = _PackedIds.of(shuffled)
    assert plain.ends is None and plain.values.dtype == np.int32 and plain.values.size == shuffled.size
    wide = _PackedIds.of(shuffled + 2**31)
    assert wide.ends is None and wide.values.dtype == np.int64
    assert wide.take(5, 9).tolist() == (shuffled[5:9] + 2**31).tolist()


@pytest.mark.parametrize("mean_run", [MIN_MEAN_RUN - 1, MIN_MEAN_RUN])
def test_runs_are_kept_from_the_mean_run_length_on(mean_run):
    ids = np.repeat(np.arange(100, dtype=np.int64), mean_run)
    assert (_PackedIds.of(ids).ends is not None) == (mean_run >= MIN_MEAN_RUN)


@pytest.mark.parametrize("mean_run", [1, MIN_MEAN_RUN - 1, MIN_MEAN_RUN, 9])
def test_runs_given_are_kept_as_the_runs_found(mean_run):
    ids = np.repeat(np.arange(5, 105, dtype=np.int64), mean_run)
    found, given = _PackedIds.of(ids), _PackedIds.of(ids, runs_of(ids))
    assert (given.ends is None) == (found.ends is None) == (mean_run < MIN_MEAN_RUN)
    assert given.values.tolist() == found.values.tolist() and given.values.dtype == found.values.dtype
    assert given.ends is None or given.ends.tolist() == found.ends.tolist()  # type: ignore[union-attr]
