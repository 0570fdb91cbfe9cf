"""What a command reads and how it is configured: INPUT's paths, a trainer's dump (``--from``)
or the primitives' derived inputs (``--key-before``, ``--blocks-per-file``, ``--json-col``), each
opened for the command's life, and the :class:`~grpo_cli.options.config.ComputeConfig` the
options resolve to, with ``check``'s verification (what an output recorded, or a dump's own
advantage)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from grpo_cli.errors import GrpoError, mention
from grpo_cli.options.catalog import offered

if TYPE_CHECKING:
    from grpo_cli.options.config import ComputeConfig, VerifySpec
    from grpo_cli.trainers.dumps import DerivedInputs, OpenedDump


def job_inputs(
    resources: contextlib.ExitStack, input: list[str], values: dict[str, Any], *, verifying: bool
) -> tuple[Any, ComputeConfig]:
    """What a job reads (INPUT's paths, or a dump's or the primitives' inputs, opened for the
    command's life, in ``resources``) and its config, resolved from the options, the dump's
    defaults and, for ``check``, what an output recorded."""
    from grpo_cli.options.config import resolve_config

    dump = resources.enter_context(_opened_dump(input, values))
    derived = resources.enter_context(_derived(input, values, dump))
    if derived is not None:
        values.update(derived.overrides)
    recorded, verify = _verification(input, values, dump) if verifying else (None, None)
    config = resolve_config(
        values, recorded=recorded, verify=verify, dump=None if dump is None else dump.defaults
    )
    return _inputs(input, dump, derived), config


def targeted(values: dict[str, Any], command: str, target: str) -> dict[str, Any]:
    """The values of ``command``'s options that set ``target``'s fields, by field."""
    return {row.setting: values[row.name] for row in offered(command) if row.target == target}


def _opened_dump(
    input: list[str], values: dict[str, Any]
) -> contextlib.AbstractContextManager[OpenedDump | None]:
    """The trainer's dump ``--from`` names, opened (its private files removed on exit), or ``None``."""
    if values["from_"] is None:
        return contextlib.nullcontext()
    from grpo_cli.trainers.dumps import opened

    return opened(values["from_"], input, group_size=values["group_size"])


def _derived(
    input: list[str], values: dict[str, Any], dump: OpenedDump | None
) -> contextlib.AbstractContextManager[DerivedInputs | None]:
    """INPUT read through the primitives (``--key-before``, ``--blocks-per-file``, ``--json-col``),
    or ``None`` when none is given."""
    if not (values["key_before"] is not None or values["blocks_per_file"] or values["json_col"]):
        return contextlib.nullcontext()
    if dump is not None:
        raise GrpoError(
            f"{mention('from_')} {values['from_']} derives the group key itself; {mention('key_before')}, "
            f"{mention('blocks_per_file')} and "
            f"{mention('json_col')} are for dumps no adapter reads"
        )
    from grpo_cli.trainers.dumps import derived_inputs

    found = derived_inputs(
        input,
        input_format=values["input_format"],
        group_cols=values["group_col"] or (),
        key_before=values["key_before"],
        group_size=values["group_size"],
        blocks_per_file=values["blocks_per_file"],
        json_cols=values["json_col"] or (),
    )
    found.inputs.about = {
        "trainer": None,
        "dump": "its files, with derived columns",
        "writer": None,
        "files": len(found.inputs.shards),
        "steps": None,
        "group_key": "; ".join(found.notes) or "as given",
        "rewards": None,
        "notes": [],
    }
    return _closing(found)


@contextlib.contextmanager
def _closing(found: DerivedInputs) -> Iterator[DerivedInputs]:
    try:
        yield found
    finally:
        found.inputs.close()


def _inputs(input: list[str], dump: OpenedDump | None, derived: DerivedInputs | None) -> Any:
    """What the job reads: INPUT's paths, or the inputs a dump or the primitives resolved."""
    if dump is not None:
        return dump.inputs
    if derived is not None:
        return derived.inputs
    return input


def _verification(
    input: list[str], values: dict[str, Any], dump: OpenedDump | None = None
) -> tuple[ComputeConfig | None, VerifySpec | None]:
    """``check``'s verification: the options an output recorded (``--verify``), or the trainer's
    own advantage a dump holds (``--from X --verify``), and what to verify."""
    from grpo_cli.jobs import recorded_config
    from grpo_cli.options.config import VerifySpec

    column = values["verify_advantage_col"]
    verifying = values["verify"] or column is not None
    if values["strict"] and not verifying:
        raise GrpoError(f"{mention('strict')} needs {mention('verify')} or {mention('verify_advantage_col')}")
    recorded = None
    if dump is not None:
        if values["verify"] and column is None:
            column = dump.dump.advantage_col
            if column is None:
                raise GrpoError(
                    f"{mention('verify')}: a {dump.dump.trainer} dump holds no advantage of the trainer's to "
                    "compare with; "
                    f"name one with {mention('verify_advantage_col')}"
                )
    elif verifying:
        recorded = recorded_config(input, column=column)
    column = column or (recorded.advantage_col if recorded is not None else None)
    verify = None if column is None else VerifySpec(column, **targeted(values, "check", "verify"))
    return recorded, verify
