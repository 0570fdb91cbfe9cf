"""Run chosen mutants against chosen test files, and record each result where mutmut keeps it.

``mutmut run`` gives each mutant every test that covers its function. For a module that most
of the suite reaches (the readers, the reward reader) that is hundreds of tests per surviving
mutant: hours on 2 cores. This runs each mutant against the test files named here instead
(``pytest -x`` in a fork of a process that has imported torch and the package once, with
``MUTANT_UNDER_TEST`` set as mutmut's trampolines read it), a few at a time, and writes the
exit code into the module's mutmut meta file, so that ``mutmut results`` and
``.ci/mutation_report.py`` count it with the rest. A mutant that survives here may still
be caught by a test in another file: run it again with more files, or with ``mutmut run NAME``.

It needs the ``mutants/`` folder that ``mutmut run`` generates (a run over one mutant will do),
made from the same sources: a mutant name that the meta file does not hold is refused.

    python .ci/mutants_targeted.py -m 'grpo_cli.inputs.readers.*' tests/integration/test_readers.py tests/unit/test_sources.py
    python .ci/mutants_targeted.py -m 'grpo_cli.run.rewards.x_*' -m 'grpo_cli.run.reward_columns.xǁRewardReader*' \
        tests/unit/test_rewards.py --only unchecked
    python .ci/mutants_targeted.py -m 'grpo_cli.kernel.*' --sample 300 tests/unit/test_kernel.py

A sample scores a module that is too large to run whole here: its score is an estimate, and the
mutants it did not draw stay "not checked" in the report.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import json
import os
import random
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "mutants"
TIMEOUT_EXIT = 36  # mutmut's "timeout"
SURVIVED, KILLED = 0, 1
SET_UP_ERRORS = {4: "a usage error", 5: "no tests collected"}  # pytest's own exit codes


def meta_path(module: str) -> Path:
    return MUTANTS / (module.replace(".", "/") + ".py.meta")


def preload() -> None:
    """Import once what every run needs (torch alone takes seconds), from mutmut's copy of the
    package: each mutant then runs in a fork of this process, as mutmut's own runner does. The
    trampolines read ``MUTANT_UNDER_TEST`` at each call, so the fork picks its mutant after."""
    os.chdir(MUTANTS)
    sys.path.insert(0, str(MUTANTS))
    for module in ("pytest", "numpy", "torch", "pyarrow.parquet", "polars", "hypothesis", "grpo_cli.jobs"):
        importlib.import_module(module)


def start(name: str, tests: list[str]) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 3
    try:
        os.environ["MUTANT_UNDER_TEST"] = name
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        import pytest

        code = int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", *tests]))
    finally:
        os._exit(code)


def run_all(
    names: list[str], tests: list[str], jobs: int, timeout: float
) -> Iterator[tuple[str, int, float]]:
    """(name, pytest's exit code, seconds) for each mutant, ``jobs`` at a time; a run past
    ``timeout`` seconds is killed and reported as :data:`TIMEOUT_EXIT`."""
    waiting = list(reversed(names))
    running: dict[int, tuple[str, float]] = {}
    while waiting or running:
        while waiting and len(running) < jobs:
            name = waiting.pop()
            running[start(name, tests)] = (name, time.monotonic())
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            name, began = running.pop(pid)
            yield name, os.waitstatus_to_exitcode(status), time.monotonic() - began
            continue
        now = time.monotonic()
        for pid, (name, began) in list(running.items()):
            if now - began > timeout:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                del running[pid]
                yield name, TIMEOUT_EXIT, now - began
        time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-m",
        "--mutants",
        action="append",
        required=True,
        help="names, as a glob: 'grpo_cli.inputs.readers.base.x_read_ahead*'",
    )
    parser.add_argument("tests", nargs="+", help="test files (or node IDs), relative to the repository")
    parser.add_argument("--only", choices=["all", "unchecked", "survivors"], default="all")
    parser.add_argument("--sample", type=int, help="run this many of the matching mutants, drawn at random")
    parser.add_argument(
        "--seed", type=int, default=0, help="the sample's seed (the same seed, the same mutants)"
    )
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per mutant (a hang is caught)")
    args = parser.parse_args()

    modules = {pattern.split(".x_")[0].split(".xǁ")[0].rstrip("*.") for pattern in args.mutants}
    metas: dict[str, tuple[Path, dict[str, Any]]] = {}
    for module in sorted(modules):
        path = meta_path(module)
        if not path.exists():
            print(
                f"no {path.relative_to(ROOT)}: run `mutmut run` once to generate the mutants", file=sys.stderr
            )
            return 2
        metas[module] = path, json.loads(path.read_text())
    meta_of = {name: metas[module] for module in metas for name in metas[module][1]["exit_code_by_key"]}
    names = [
        name
        for name, (_, meta) in meta_of.items()
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in args.mutants)
        and (
            args.only == "all"
            or meta["exit_code_by_key"][name] == {"unchecked": None, "survivors": SURVIVED}[args.only]
        )
    ]
    if not names:
        print(f"no mutant matches {args.mutants} ({args.only})", file=sys.stderr)
        return 2
    if args.sample is not None and args.sample < len(names):
        names = sorted(random.Random(args.seed).sample(sorted(names), args.sample))

    preload()
    for check, expected in (("fail", KILLED), ("", SURVIVED)):  # the set-up catches a mutant and passes clean
        [(_, code, _)] = run_all([check], args.tests, 1, args.timeout)
        if code != expected:
            print(f"with MUTANT_UNDER_TEST={check!r} the tests exit {code}, not {expected}", file=sys.stderr)
            return 2

    counts = {"killed": 0, "survived": 0, "timeout": 0}
    for name, code, seconds in run_all(names, args.tests, args.jobs, args.timeout):
        if code in SET_UP_ERRORS:
            print(f"{name}: pytest exits {code} ({SET_UP_ERRORS[code]}); not recorded", file=sys.stderr)
            continue
        code = code if code in (SURVIVED, TIMEOUT_EXIT) else KILLED  # failed, collection error, signal
        path, meta = meta_of[name]
        meta["exit_code_by_key"][name] = code
        meta["durations_by_key"][name] = seconds
        written = path.with_name(path.name + ".tmp")  # whole or not at all: mutmut may read it now
        written.write_text(json.dumps(meta, indent=4))
        os.replace(written, path)
        status = {KILLED: "killed", SURVIVED: "survived", TIMEOUT_EXIT: "timeout"}[code]
        counts[status] += 1
        if code == SURVIVED:
            print(f"survived: {name}", flush=True)
    print(f"{len(names)} mutants: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
