"""The ``grpo-cli`` command line: parses options and calls the library, nothing more.

Heavy modules (torch, pyarrow) are imported only when a command runs, so ``--help``
and ``--version`` answer at once.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import io
import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from inspect import Parameter, Signature, signature
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
import typer.core

try:  # recent Typer releases carry their own copy of Click
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - Typer on the Click package
    from click import exceptions as click_exceptions  # type: ignore[no-redef]

from grpo_cli import __version__, interrupts
from grpo_cli.choices import Color
from grpo_cli.cli.help import escaped, label, label_types, summary_of
from grpo_cli.cli.inputs import job_inputs, targeted
from grpo_cli.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_CHECK_FAILED,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_WRITTEN_THEN_FAILED,
    GrpoError,
    mention,
)
from grpo_cli.options.catalog import offered
from grpo_cli.options.command import CommandOptions
from grpo_cli.options.declare import Option

if TYPE_CHECKING:
    from grpo_cli.jobs import Engine
    from grpo_cli.results.summary import RunSummary
    from grpo_cli.run.progress import RichProgress

EXIT_CODES_HELP = (
    "**Exit codes:** 0 success, 1 a check failed, 2 usage or input error (nothing written), "
    "3 output written but the summary failed, 70 internal error, 130 interrupted, "
    "141 standard output closed by its reader."
)
COMPUTE_EXAMPLES = """**Examples**

`grpo-cli compute rollouts.parquet -o with_adv.parquet -r correct -g prompt_id`

`grpo-cli compute shards/ -o out/ --preset trl --drop-inactive --summary-json -`

`grpo-cli compute rollouts.parquet -o out.parquet -r score --estimator reinforce_plus_plus_baseline
--length-col n_tokens --batch-col step`

"""
CHECK_EXAMPLES = """**Examples**

`grpo-cli check rollouts.parquet -r correct --max-inactive-fraction 0.5 --min-group-size 8`

`grpo-cli check export.parquet --verify-advantage-col advantage --preset verl`

"""


class _OneLineErrors(typer.core.TyperGroup):
    """Usage errors as one ``error:`` line on stderr and exit 2, like every other error.

    Also gives every command's options readable type labels (:func:`~grpo_cli.cli.help.label_types`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for command in self.commands.values():
            label_types(command)

    def get_params(self, ctx: Any) -> Any:
        params = super().get_params(ctx)  # Typer adds the completion options late
        for param in params:
            label(param)
        return params

    def main(  # type: ignore[override]
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            argv = list(sys.argv[1:] if args is None else args)
            if _completion_for_named_shell(argv):
                result = EXIT_OK
            else:
                result = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
        except click_exceptions.NoArgsIsHelpError as exc:
            # building the error rendered the help; with rich, it is already on the screen
            help_text = exc.format_message()
            if help_text.strip():
                typer.echo(help_text)
            result = exc.exit_code
        except click_exceptions.UsageError as exc:
            command = exc.ctx.command_path if exc.ctx is not None else "grpo-cli"
            message = _with_suggestion(" ".join(exc.format_message().split()))
            typer.echo(f"error: {message} (see '{command} --help')", err=True)
            result = exc.exit_code
        except click_exceptions.ClickException as exc:
            typer.echo(f"error: {' '.join(exc.format_message().split())}", err=True)
            result = exc.exit_code
        except typer.Abort:
            typer.echo("error: aborted", err=True)
            result = EXIT_INTERRUPTED
        if not standalone_mode:
            return result
        sys.exit(result if isinstance(result, int) else EXIT_OK)


SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")


def _completion_for_named_shell(argv: list[str]) -> bool:
    """``--install-completion zsh`` / ``--show-completion fish``: for the shell named, not the
    one detected (Typer takes these as flags and would install the bash completion)."""
    options = ("--install-completion", "--show-completion")
    if len(argv) != 2 or argv[0] not in options or argv[1] not in SHELLS:
        return False
    from typer._completion_shared import get_completion_script, install

    complete_var = "_GRPO_CLI_COMPLETE"
    if argv[0] == "--show-completion":
        typer.echo(get_completion_script(prog_name="grpo-cli", complete_var=complete_var, shell=argv[1]))
        return True
    shell, path = install(shell=argv[1], prog_name="grpo-cli", complete_var=complete_var)
    typer.echo(f"{shell} completion installed in {path}")
    typer.echo("Completion will take effect once you restart the terminal")
    return True


_NOT_ONE_OF = re.compile(r"'([^']*)' is not one of ((?:'[^']*'(?:, )?)+)")


def _with_suggestion(message: str) -> str:
    """A choice's usage error, with the closest choice when the value looks like a typo of one.

    >>> _with_suggestion("Invalid value for '--preset': 'trll' is not one of 'trl', 'verl'.")
    "Invalid value for '--preset': 'trll' is not one of 'trl', 'verl'; did you mean 'trl'?"
    """
    import difflib

    found = _NOT_ONE_OF.search(message)
    if found is None:
        return message
    choices = re.findall(r"'([^']*)'", found[2])
    close = difflib.get_close_matches(found[1], choices, n=1, cutoff=0.6)
    return f"{message.rstrip('.')}; did you mean {close[0]!r}?" if close else message


app = typer.Typer(
    name="grpo-cli",
    cls=_OneLineErrors,
    help="Exact, fast GRPO group-relative advantages over rollout datasets (Parquet, JSONL).",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    add_completion=True,
    epilog=EXIT_CODES_HELP,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"grpo-cli {__version__}")
        raise typer.Exit()


@app.callback()
def main_callback(
    version: Annotated[
        bool,
        typer.Option("--version", "-V", help="Show the version and exit.", callback=_version, is_eager=True),
    ] = False,
) -> None:
    """Exact, fast GRPO group-relative advantages over rollout datasets.

    Exit codes: 0 success, 1 a check failed, 2 usage or input error (nothing written),
    3 output written but the summary failed, 70 internal error, 130 interrupted,
    141 standard output closed by its reader.
    """


# Shared option declarations: both commands read the same inputs and advantage options.
InputArg = Annotated[
    list[str],
    typer.Argument(
        metavar="INPUT",
        help="One or more of: a Parquet, JSON lines, JSON array, CSV or Arrow IPC file (.gz and .zst "
        "text too), a directory of shards (a datasets save_to_disk folder too), a quoted glob, "
        "or - for standard input.",
        show_default=False,
    ),
]


def _typer_option(row: Option, command: str) -> Any:
    """The ``Annotated`` type Typer reads for ``row`` in ``command``."""
    settings: dict[str, Any] = {"rich_help_panel": row.panel, "help": escaped(row.help_for(command))}
    if row.metavar is not None:
        settings["metavar"] = row.metavar
    if row.envvar is not None:
        settings.update(envvar=row.envvar, show_envvar=True)
    if row.show_default is not True:
        settings["show_default"] = row.show_default
    if row.min is not None:
        settings["min"] = row.min
    if row.max is not None:
        settings["max"] = row.max
    return Annotated[row.kind, typer.Option(*row.flags, **settings)]


LONG_HELP = {"help_option_names": ["--help"]}  # a command's -h is its summary (_short_help)


def _short_help(ctx: typer.Context, value: bool) -> None:
    """``-h``: the command's options one line each, as ``ruff check -h`` gives them; ``--help``
    stays the whole text (every option's help, default and environment variable)."""
    if value and not ctx.resilient_parsing:
        typer.echo(summary_of(ctx.info_name or "", ctx.command.help or ""))
        raise typer.Exit()


def _options_of(command: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command ``def name(ARGUMENTS, *, options, values)`` the options the catalogue offers
    it, in help order: Typer reads the signature this builds; the command gets its own options as
    one typed :class:`~grpo_cli.options.command.CommandOptions` and every value by name."""

    def decorate(func: Callable[..., None]) -> Callable[..., None]:
        own = [
            p
            for p in signature(func, eval_str=True).parameters.values()
            if p.name not in ("options", "values")
        ]
        options = [
            Parameter(
                row.name,
                Parameter.KEYWORD_ONLY,
                default=Parameter.empty if row.default is ... else row.default,
                annotation=_typer_option(row, command),
            )
            for row in offered(command)
        ]

        @functools.wraps(func)
        def command_function(**values: Any) -> None:
            arguments = {p.name: values.pop(p.name) for p in own}
            values.pop("short_help", None)
            func(**arguments, options=CommandOptions(**targeted(values, command, "run")), values=values)

        summary = Parameter(
            "short_help",
            Parameter.KEYWORD_ONLY,
            default=False,
            annotation=Annotated[
                bool,
                typer.Option(
                    "-h",
                    help="Show a summary of the options, one line each, and exit (--help: the whole text).",
                    is_eager=True,
                    callback=_short_help,
                ),
            ],
        )
        parameters = [*own, *options, summary]
        command_function.__signature__ = Signature(parameters)  # type: ignore[attr-defined]
        command_function.__annotations__ = {p.name: p.annotation for p in parameters}
        return command_function

    return decorate


# --------------------------------------------------------------------------- running a command


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


class _RunState:
    """What a command has already put on disk, so that no message contradicts it, its bars, and
    what it holds open until it ends (a dump's private files)."""

    written: str | None = None
    progress: RichProgress | None = None

    def __init__(self) -> None:
        self.resources = contextlib.ExitStack()

    def start_progress(self, show: bool) -> None:
        """Progress bars from here on where ``show`` (on a terminal: :func:`_progress_bars`);
        started before the command's slow imports, so a line is on screen at once."""
        self.progress = _progress_bars(not show)

    def close_progress(self) -> None:
        if self.progress is not None:
            self.progress.close()
            self.progress = None


def _data_on_terminal(output: str | None) -> bool:
    """Whether ``-o -`` streams the rows to a terminal, where bars on standard error would draw
    over them (the same screen): then the run draws none.

    >>> _data_on_terminal("out.parquet")
    False
    """
    if output != "-":
        return False
    try:
        return os.isatty(sys.stdout.fileno())
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return False


def _progress_bars(quiet: bool) -> RichProgress | None:
    """Rich progress bars on a terminal; none with --quiet, in CI, or when stderr is redirected.

    Made before the command's slow imports, so a line is on screen at once.
    """
    if quiet or os.environ.get("CI") or not sys.stderr.isatty():
        return None
    from grpo_cli.run.progress import RichProgress

    return RichProgress()


def _run(debug: bool, body: Callable[[_RunState], int]) -> None:
    """Run a command body, mapping every failure to one line on stderr and an exit code.

    Progress bars the body starts (``state.start_progress``) are put away before any
    message. SIGTERM and SIGHUP stop the run like Ctrl-C:
    every temporary is removed.
    """
    from grpo_cli.allocator import reuse_freed_memory  # ctypes: not on the --help path
    from grpo_cli.threads import let_idle_threads_sleep

    reuse_freed_memory()
    let_idle_threads_sleep()  # before the command's work imports torch
    state = _RunState()
    handled = [signal.SIGINT, signal.SIGTERM] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])
    previous = {signum: signal.getsignal(signum) for signum in handled}
    interrupts.clear()

    def on_signal(signum: int, frame: object) -> None:
        interrupts.request(signum)  # kept where the exception below is swallowed (grpo_cli.interrupts)
        raise KeyboardInterrupt

    for signum in handled:
        signal.signal(signum, on_signal)
    _signals_to_python()
    try:
        try:
            with state.resources:
                code = body(state)
        finally:
            state.close_progress()
    except GrpoError as exc:
        _fail(exc.message, exc.exit_code)
    except KeyboardInterrupt:
        if state.written is not None:
            _fail(f"interrupted after the output {state.written} was written", EXIT_INTERRUPTED)
        _fail("interrupted; no output was written", EXIT_INTERRUPTED)
    except BrokenPipeError:
        # The reader of standard output went away (| head): end quietly, as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise typer.Exit(EXIT_BROKEN_PIPE) from None
    except MemoryError:
        _fail("out of memory; try --device cpu or a smaller --memory-limit-mb", EXIT_INTERNAL)
    except (typer.Exit, typer.Abort):
        raise
    except Exception as exc:
        _internal_error(exc, debug)
    except BaseException as exc:
        # pyo3's PanicException (a Rust panic inside polars) is a BaseException
        if type(exc).__name__ != "PanicException":
            raise
        _internal_error(exc, debug)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        interrupts.clear()  # a caller's later library work (or the next test) starts unasked
    raise typer.Exit(code)


def _signals_to_python() -> None:
    """Let Ctrl-C and SIGTERM reach the run's own handlers whatever pyarrow is doing: pyarrow
    otherwise takes them over for the length of a read, to cancel it, and a cancel that lands
    as a read error can be caught as one. The command reads with pyarrow anyway: its import
    costs nothing extra here."""
    import pyarrow.lib

    pyarrow.lib.enable_signal_handlers(False)


def _internal_error(exc: BaseException, debug: bool) -> NoReturn:
    if debug:
        traceback.print_exc()
    first = (str(exc).strip().splitlines() or [""])[0]
    _fail(
        f"internal error: {type(exc).__name__}: {first} (rerun with --debug for the traceback)",
        EXIT_INTERNAL,
    )


def _check_stdout(value: str | None, option: str = "--summary-json") -> None:
    """``--summary-json -`` and ``-o -`` need an open standard output: checked before any work."""
    if value != "-":
        return
    try:
        if sys.stdout is None:  # Python's stand-in when file descriptor 1 is closed
            raise OSError
        os.fstat(sys.stdout.fileno())
    except io.UnsupportedOperation:
        pass  # an in-memory stream (tests): writable
    except (OSError, ValueError):
        raise GrpoError(f"{option} -: standard output is closed") from None


def _summary_file(summary_json: str | None) -> str | None:
    """The file the run writes the summary to (``-``, standard output, is the CLI's)."""
    return None if summary_json == "-" else summary_json


def _report(
    summary: RunSummary,
    *,
    quiet: bool,
    silent: bool,
    summary_json: str | None,
    compact: bool = False,
    color: Color = "auto",
) -> None:
    """JSON on stdout where asked (a file was written by the run); the report on stderr: all of
    it, or with ``quiet`` the failed checks' lines alone, or with ``silent`` nothing."""
    if summary_json == "-":
        try:
            sys.stdout.write(summary.to_json() + "\n")
            sys.stdout.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            written = summary.output is not None
            raise GrpoError(
                f"{mention('summary_json')} -: cannot write to standard output ({exc.strerror or exc})"
                + ("; the output was written" if written else ""),
                exit_code=EXIT_WRITTEN_THEN_FAILED if written else EXIT_USAGE,
            ) from None
    if silent:
        return
    if quiet:
        if compact:
            from grpo_cli.cli.report import failure_lines

            for line in failure_lines(summary):
                sys.stderr.write(line + "\n")
        return
    from rich.console import Console

    from grpo_cli.cli.report import render_compact, render_plain, render_rich

    if color == "always":
        console = Console(stderr=True, force_terminal=True, no_color=False)
    elif color == "never":
        console = Console(stderr=True, no_color=True, color_system=None)
    else:  # rich honours NO_COLOR
        console = Console(stderr=True)
    colored = console.is_terminal and console.color_system is not None and not console.no_color
    if compact:
        for line in render_compact(summary).splitlines():
            style = "green" if line.startswith("PASS") else "red" if line.startswith("FAIL") else None
            console.print(
                line, style=style if colored else None, highlight=False, markup=False, soft_wrap=True
            )
    elif console.is_terminal and color != "never":
        render_rich(summary, console)
    else:
        sys.stderr.write(render_plain(summary) + "\n")


# --------------------------------------------------------------------------- commands


@app.command(no_args_is_help=True, epilog=COMPUTE_EXAMPLES + EXIT_CODES_HELP, context_settings=LONG_HELP)
@_options_of("compute")
def compute(input: InputArg, *, options: CommandOptions, values: dict[str, Any]) -> None:
    """Compute advantages and write INPUT's rows with two new columns to Parquet or JSON lines.

    Writes the advantage column and a per-row bool column that says whether the rollout's
    group is active; every input column is kept, in order, with rows in input order. The
    summary goes to standard error.
    """
    output, summary_json = options.output, options.summary_json

    def body(state: _RunState) -> int:
        engine = _engine(options)
        state.start_progress(options.reports and engine.shows_progress and not _data_on_terminal(output))
        from grpo_cli.jobs import compute_dataset

        inputs, config = job_inputs(state.resources, input, values, verifying=False)
        _check_stdout(summary_json)
        if output == "-" and summary_json == "-":
            raise GrpoError(f"-o - and {mention('summary_json')} - would both write to standard output")
        _check_stdout(output, "-o")
        summary = compute_dataset(
            inputs,
            output,
            config,
            engine=engine,
            force=options.force,
            progress=state.progress,
            summary_json=_summary_file(summary_json),
            report=options.report,
        )
        state.close_progress()
        state.written = output
        _report(
            summary,
            quiet=options.quiet,
            silent=options.silent,
            summary_json=summary_json,
            color=options.color,
        )
        return EXIT_OK

    _run(options.debug, body)


@app.command(no_args_is_help=True, epilog=CHECK_EXAMPLES + EXIT_CODES_HELP, context_settings=LONG_HELP)
@_options_of("check")
def check(input: InputArg, *, options: CommandOptions, values: dict[str, Any]) -> None:
    """Check that a rollout dataset is fit to train on; exit 1 if any check fails.

    Reads INPUT like compute, writes no data, prints one line per check (name, measured
    value, bound, PASS or FAIL) on standard error. With no check options it prints the
    summary and exits 0.
    """
    summary_json = options.summary_json

    def body(state: _RunState) -> int:
        engine = _engine(options)
        state.start_progress(options.reports and engine.shows_progress)
        from grpo_cli.jobs import check_dataset
        from grpo_cli.options.checks import CheckBounds

        inputs, config = job_inputs(state.resources, input, values, verifying=True)
        _check_stdout(summary_json)
        if options.output_format != "text" and summary_json == "-":
            raise GrpoError(
                f"{mention('output_format')} {options.output_format} and {mention('summary_json')} - would "
                "both write to "
                "standard output"
            )
        bounds = CheckBounds(**targeted(values, "check", "bounds"))
        summary = check_dataset(
            inputs,
            bounds,
            config,
            engine=engine,
            force=options.force,
            progress=state.progress,
            summary_json=_summary_file(summary_json),
            report=options.report,
        )
        state.close_progress()
        _report(
            summary,
            quiet=options.quiet,
            silent=options.silent,
            summary_json=summary_json,
            compact=bool(summary.checks),
            color=options.color,
        )
        if options.output_format != "text":
            from grpo_cli.cli.report import github_annotations, junit_report

            render = github_annotations if options.output_format == "github" else junit_report
            sys.stdout.write(render(summary))
            sys.stdout.flush()
        return EXIT_OK if all(c["passed"] for c in summary.checks) else EXIT_CHECK_FAILED

    _run(options.debug, body)


def _engine(options: CommandOptions) -> Engine:
    """The engine ``--engine`` names, with its options (a value: :func:`grpo_cli.jobs.engine_named`)."""
    from grpo_cli.jobs import engine_named

    return engine_named(
        options.engine,
        address=options.ray_address,
        partitions=options.partitions,
        quiet=options.quiet or options.silent,
    )


INSPECT_EXAMPLES = """**Examples**

`grpo-cli inspect with_adv.parquet`

`grpo-cli inspect out/ | jq .options.preset`

"""


@app.command(no_args_is_help=True, epilog=INSPECT_EXAMPLES + EXIT_CODES_HELP, context_settings=LONG_HELP)
@_options_of("inspect")
def inspect(
    input: Annotated[
        str,
        typer.Argument(
            metavar="FILE",
            help="A Parquet file grpo-cli wrote, or a directory of them.",
            show_default=False,
        ),
    ],
    *,
    options: CommandOptions,
    values: dict[str, Any],
) -> None:
    """Print how a grpo-cli output was made: its provenance entry, as JSON on standard output.

    The entry records the grpo-cli version, every option in force after the preset, the
    inputs, and the rows and groups; `grpo-cli check FILE --verify` recomputes the
    advantages with those options.
    """

    def body(state: _RunState) -> int:
        import json

        from grpo_cli.jobs import recorded_provenance

        if input == "-":
            raise GrpoError("inspect reads a file or a directory, not standard input")
        record = recorded_provenance(input)
        if record is None:
            raise GrpoError(f"{input}: no grpo-cli provenance (not written by grpo-cli compute)")
        sys.stdout.write(json.dumps(record, indent=2, sort_keys=True) + "\n")
        sys.stdout.flush()
        return EXIT_OK

    _run(options.debug, body)


def main() -> NoReturn:
    """Console-script entry point (and ``python -m grpo_cli``): runs the command, then ends the
    process with its exit code (:func:`_end_process`)."""
    try:
        app()
    except SystemExit as done:
        _end_process(done.code)
    _end_process(EXIT_OK)


def _end_process(code: str | int | None) -> NoReturn:
    """End the process with ``code`` (a ``SystemExit`` code) once everything it wrote is out,
    without the interpreter's teardown: freeing torch's modules and C++ state at exit takes about
    0.3 s, as long as the rest of a run on a small file. Every output is already committed (fsync,
    rename) by then; the exit handlers run and standard output and error are flushed here. While
    another thread still runs, the interpreter's own exit, which waits for it, is taken instead."""
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    if code is None:
        status = EXIT_OK
    elif isinstance(code, int):
        status = code
    else:  # as the interpreter does with sys.exit("message")
        sys.stderr.write(f"{code}\n")
        status = 1
    atexit._run_exitfuncs()
    try:
        if sys.stdout is not None:  # None: the shell closed it (>&-)
            sys.stdout.flush()
    except BrokenPipeError:
        status = status or EXIT_BROKEN_PIPE
    except OSError as exc:  # what was left in the buffer (the command flushes what it writes)
        with contextlib.suppress(OSError, AttributeError):
            sys.stderr.write(f"error: cannot write to standard output ({exc.strerror or exc})\n")
        status = status or EXIT_WRITTEN_THEN_FAILED
    with contextlib.suppress(OSError, AttributeError):
        sys.stderr.flush()
    os._exit(status)
