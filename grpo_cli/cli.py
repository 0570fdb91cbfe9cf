"""The ``grpo-cli`` command line: parses options and calls the library, nothing more.

Heavy modules (torch, pyarrow) are imported only when a command runs, so ``--help``
and ``--version`` answer at once.
"""

from __future__ import annotations

import io
import os
import re
import signal
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
import typer.core

try:  # recent Typer releases carry their own copy of Click
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - Typer on the Click package
    from click import exceptions as click_exceptions  # type: ignore[no-redef]

from grpo_cli import __version__
from grpo_cli.choices import (
    Aggregation,
    Color,
    Compression,
    Engine,
    EpsilonMode,
    Estimator,
    InputFormat,
    NanPolicy,
    Preset,
    Scale,
    Singleton,
    Std,
)
from grpo_cli.errors import GrpoError

if TYPE_CHECKING:
    from grpo_cli.config import ComputeConfig, VerifySpec
    from grpo_cli.progress import RichProgress
    from grpo_cli.summary import RunSummary

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_WRITTEN_THEN_FAILED = 3
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a Unix tool killed by a closed pipe

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


def _label(param: Any) -> None:
    """A help label a user can read: ``N``, ``F``, ``a|b`` or ``NAME`` plus its choices, none on a flag.

    Typer labels every value with its Python type (``<int range>``, ``<bool>`` for a flag,
    ``<list[str]>``); options that set ``metavar`` keep theirs.
    """
    if param.param_type_name == "argument":
        param.display_type_rich = lambda ctx: None  # the argument's name says it
        return
    if param.metavar is not None:
        return
    if getattr(param, "is_flag", False):
        param.metavar = ""
        return
    descriptor = param.type_descriptor
    if descriptor.is_choice:
        choices = [str(choice) for choice in descriptor.choices or ()]
        if len("|".join(choices)) <= 30:
            param.metavar = "|".join(choices)
        else:
            param.metavar = param.name.upper()
            if not all(choice in (param.help or "") for choice in choices):
                param.help = f"{param.help} One of: {', '.join(choices)}."
    elif descriptor.annotation is int:
        param.metavar = "N"
    elif descriptor.annotation is float:
        param.metavar = "F"
    else:
        param.metavar = param.name.upper()


def _label_types(command: Any) -> None:
    """:func:`_label` for every parameter of ``command``, its ``--help`` included."""
    help_option = command.get_help_option

    def labeled_help_option(ctx: Any) -> Any:
        option = help_option(ctx)
        if option is not None:
            _label(option)
        return option

    command.get_help_option = labeled_help_option
    for param in command.params:
        _label(param)


class _OneLineErrors(typer.core.TyperGroup):
    """Usage errors as one ``error:`` line on stderr and exit 2, like every other error.

    Also gives every command's options readable type labels (:func:`_label_types`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for command in self.commands.values():
            _label_types(command)

    def get_params(self, ctx: Any) -> Any:
        params = super().get_params(ctx)  # Typer adds the completion options late
        for param in params:
            _label(param)
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
InputFormatOpt = Annotated[
    InputFormat | None,
    typer.Option(
        "--input-format",
        rich_help_panel="Input",
        help="Override the format detected from the name (json: an array or lines, told by content).",
    ),
]
RewardColOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--reward-col",
        "-r",
        rich_help_panel="Input",
        envvar="GRPO_CLI_REWARD_COL",
        show_envvar=True,
        metavar="NAME[:WEIGHT]",
        help="Reward column or nested field (reward.score), optionally NAME:WEIGHT; repeat for "
        "several rewards (weighted sum).",
        show_default="reward",
    ),
]
GroupColOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--group-col",
        "-g",
        rich_help_panel="Input",
        envvar="GRPO_CLI_GROUP_COL",
        show_envvar=True,
        metavar="COL",
        help="Group key column or nested field (meta.prompt_id); a list or struct column groups on its "
        "exact value; repeat for a composite key (e.g. prompt_id and step).",
        show_default="group_id",
    ),
]
GroupSizeOpt = Annotated[
    int | None,
    typer.Option(
        "--group-size",
        min=1,
        rich_help_panel="Input",
        metavar="N",
        help="Groups are consecutive blocks of N rows (instead of a key column).",
    ),
]
AggregationOpt = Annotated[
    Aggregation | None,
    typer.Option(
        "--reward-aggregation",
        rich_help_panel="Input",
        help="With several rewards: normalise their weighted sum, or normalise each in its group and "
        "then sum (GDPO).",
        show_default="sum-then-normalize",
    ),
]
PresetOpt = Annotated[
    Preset | None,
    typer.Option(
        "--preset",
        rich_help_panel="Advantage",
        envvar="GRPO_CLI_PRESET",
        show_envvar=True,
        help="Reproduce a trainer's GRPO convention; explicit options override it.",
    ),
]
EstimatorOpt = Annotated[
    Estimator | None,
    typer.Option(
        "--estimator",
        rich_help_panel="Advantage",
        help="grpo: (r - mean) / std; dr_grpo: r - mean; rloo: r - mean of the others; "
        "reinforce_plus_plus_baseline (verl), reinforce_baseline (OpenRLHF): r - mean, whitened over the "
        "batch; gpg (verl): alpha (r - mean); remax (verl): r - --baseline-col; opo (verl): r - "
        "length-weighted mean; grpo_passk (verl): the best rollout only. See the README's table.",
        show_default="grpo",
    ),
]
EpsilonOpt = Annotated[
    float | None,
    typer.Option(
        "--epsilon", rich_help_panel="Advantage", metavar="EPS", help="Added to the std.", show_default="1e-6"
    ),
]
WhitenOpt = Annotated[
    bool,
    typer.Option(
        "--whiten",
        rich_help_panel="Advantage",
        help="Whiten the advantages over each batch as verl's masked_whiten and ROLL do: "
        "(A - mean) * rsqrt(unbiased var + 1e-8).",
    ),
]
ClipOpt = Annotated[
    tuple[float, float] | None,
    typer.Option(
        "--clip-advantage",
        rich_help_panel="Advantage",
        help="Clamp the final advantages to [LO, HI] (ROLL's advantage_clip, NeMo-RL's "
        "advantage_clip_low/high).",
        metavar="LO HI",
    ),
]
BatchColOpt = Annotated[
    str | None,
    typer.Option(
        "--batch-col",
        rich_help_panel="Input",
        metavar="COL",
        help="Training-batch column (e.g. step): --scale batch, whitening, GPG's alpha and the TRL/GDPO "
        "re-normalisation use each batch's statistics. Each group must lie in one batch.",
        show_default="the whole input is one batch",
    ),
]
LengthColOpt = Annotated[
    str | None,
    typer.Option(
        "--length-col",
        rich_help_panel="Input",
        metavar="COL",
        help="Response length (tokens): whitening weighs each rollout by it, as the trainers whiten "
        "over tokens.",
    ),
]
BaselineColOpt = Annotated[
    str | None,
    typer.Option(
        "--baseline-col",
        rich_help_panel="Input",
        metavar="COL",
        help="With --estimator remax: each row's baseline reward (the greedy rollout's).",
    ),
]
GpgFNormOpt = Annotated[
    float | None,
    typer.Option(
        "--gpg-f-norm",
        rich_help_panel="Advantage",
        metavar="F",
        help="With --estimator gpg: the divisor f_norm.",
        show_default="1",
    ),
]
StdOpt = Annotated[
    Std | None,
    typer.Option(
        "--std",
        rich_help_panel="Advantage",
        help="population (divide by n) or sample (n - 1).",
        show_default="population",
    ),
]
ScaleOpt = Annotated[
    Scale | None,
    typer.Option(
        "--scale",
        rich_help_panel="Advantage",
        help="Divide by the group std, the batch std, or nothing.",
        show_default="group",
    ),
]
EpsilonModeOpt = Annotated[
    EpsilonMode | None,
    typer.Option(
        "--epsilon-mode",
        rich_help_panel="Advantage",
        help="add: std + eps; clamp: max(std, eps); add-if-nonzero: divide only where std > 0.",
        show_default="add",
    ),
]
SingletonOpt = Annotated[
    Singleton | None,
    typer.Option(
        "--singleton",
        rich_help_panel="Advantage",
        help="One-rollout groups: zero, or raw (r / (1 + eps), verl).",
        show_default="zero",
    ),
]
NanOpt = Annotated[
    NanPolicy | None,
    typer.Option(
        "--nan",
        rich_help_panel="Advantage",
        help="Null, NaN or infinite rewards: error, or ignore (left out of the statistics, advantage 0).",
        show_default="error",
    ),
]
DeviceOpt = Annotated[
    str,
    typer.Option(
        "--device",
        rich_help_panel="Engine",
        envvar="GRPO_CLI_DEVICE",
        show_envvar=True,
        metavar="DEVICE",
        help="auto, cpu, cuda, cuda:N or mps (auto: CUDA, then MPS, then CPU).",
    ),
]
AdvantageColOpt = Annotated[
    str,
    typer.Option(
        "--advantage-col", rich_help_panel="Output", metavar="NAME", help="Name of the advantage column."
    ),
]
ActiveColOpt = Annotated[
    str,
    typer.Option(
        "--active-col",
        rich_help_panel="Output",
        metavar="NAME",
        help="Name of the per-row group-is-active column.",
    ),
]
SummaryJsonOpt = Annotated[
    str | None,
    typer.Option(
        "--summary-json",
        rich_help_panel="Output",
        help="Write the summary as JSON to PATH, or - for standard output.",
        metavar="PATH",
    ),
]
QuietOpt = Annotated[
    bool,
    typer.Option(
        "--quiet", "-q", rich_help_panel="Run", help="No summary and no progress on standard error."
    ),
]
ColorOpt = Annotated[
    Color,
    typer.Option(
        "--color",
        rich_help_panel="Run",
        help="Colour the report on standard error: auto (on a terminal, unless NO_COLOR is set), always, "
        "never.",
    ),
]
DebugOpt = Annotated[
    bool, typer.Option("--debug", rich_help_panel="Run", help="Show the traceback of unexpected errors.")
]
MemoryLimitOpt = Annotated[
    int,
    typer.Option(
        "--memory-limit-mb",
        min=0,
        rich_help_panel="Engine",
        envvar="GRPO_CLI_MEMORY_LIMIT_MB",
        show_envvar=True,
        metavar="MB",
        help="Inputs that decode to less than this are read once and kept in memory; larger ones stream "
        "in two passes with bounded memory. 0 always streams.",
    ),
]
BatchRowsOpt = Annotated[
    int | None,
    typer.Option(
        "--batch-rows",
        min=1,
        rich_help_panel="Engine",
        metavar="N",
        help="Rows per record batch.",
        show_default="about 64 MiB of data per batch",
    ),
]


# --------------------------------------------------------------------------- running a command


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


class _RunState:
    """What a command has already put on disk, so that no message contradicts it, and its bars."""

    written: str | None = None
    progress: RichProgress | None = None

    def close_progress(self) -> None:
        if self.progress is not None:
            self.progress.close()
            self.progress = None


def _progress_bars(quiet: bool) -> RichProgress | None:
    """Rich progress bars on a terminal; none with --quiet, in CI, or when stderr is redirected.

    Made before the command's slow imports, so a line is on screen at once.
    """
    if quiet or os.environ.get("CI") or not sys.stderr.isatty():
        return None
    from grpo_cli.progress import RichProgress

    return RichProgress()


def _run(debug: bool, body: Callable[[_RunState], int], *, bars: bool = False) -> None:
    """Run a command body, mapping every failure to one line on stderr and an exit code.

    With ``bars``, progress bars (``state.progress``) are drawn on a terminal from the
    start, and put away before any message. SIGTERM and SIGHUP stop the run like Ctrl-C:
    every temporary is removed.
    """
    state = _RunState()
    handled = [signal.SIGTERM] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])
    previous = {signum: signal.getsignal(signum) for signum in handled}

    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for signum in handled:
        signal.signal(signum, on_signal)
    try:
        try:
            state.progress = _progress_bars(not bars)
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
    raise typer.Exit(code)


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


def _config(
    *,
    reward_col: list[str] | None,
    group_col: list[str] | None,
    group_size: int | None,
    reward_aggregation: Aggregation | None,
    preset: Preset | None,
    estimator: Estimator | None,
    epsilon: float | None,
    std: Std | None,
    scale: Scale | None,
    epsilon_mode: EpsilonMode | None,
    singleton: Singleton | None,
    nan: NanPolicy | None,
    device: str,
    input_format: InputFormat | None,
    memory_limit_mb: int,
    batch_rows: int | None,
    advantage_col: str = "advantage",
    active_col: str = "group_active",
    stats_cols: bool = False,
    drop_inactive: bool = False,
    keep_mean_range: tuple[float, float] | None = None,
    rewrite: bool = False,
    compression: Compression = "snappy",
    verify: VerifySpec | None = None,
    whiten: bool = False,
    clip_advantage: tuple[float, float] | None = None,
    batch_col: str | None = None,
    length_col: str | None = None,
    baseline_col: str | None = None,
    gpg_f_norm: float | None = None,
    recorded: ComputeConfig | None = None,
) -> ComputeConfig:
    """The run's :class:`~grpo_cli.config.ComputeConfig` from the options both commands share.

    ``recorded``: the options an output was made with (``check`` reads them from its
    provenance); options given on the command line override them.
    """
    from grpo_cli.config import ComputeConfig
    from grpo_cli.options import AdvantageOptions, RewardSpec

    if group_size is not None and group_col:
        raise GrpoError("--group-size and --group-col cannot be used together")
    base = recorded or ComputeConfig()
    if recorded is not None and not reward_col:
        reward_col = [f"{r.column}:{r.weight!r}" for r in recorded.rewards]
    if recorded is not None and not group_col and group_size is None:
        group_col, group_size = list(recorded.group_cols), recorded.group_size
    advantage = AdvantageOptions.resolve(
        base=None if recorded is None else recorded.advantage,
        preset=preset,
        estimator=estimator,
        epsilon=epsilon,
        std=std,
        scale=scale,
        epsilon_mode=epsilon_mode,
        singleton=singleton,
        nan=nan,
        whiten="unbiased" if whiten else None,
        clip=clip_advantage,
        gpg_f_norm=gpg_f_norm,
    )
    return ComputeConfig(
        rewards=tuple(RewardSpec.parse(text) for text in (reward_col or ["reward"])),
        group_cols=tuple(group_col or (() if group_size is not None else ("group_id",))),
        group_size=group_size,
        aggregation=reward_aggregation or base.aggregation,
        advantage=advantage,
        device=device,
        input_format=input_format,
        memory_budget_bytes=memory_limit_mb << 20,
        batch_rows=batch_rows,
        advantage_col=advantage_col,
        active_col=active_col,
        stats_cols=stats_cols,
        drop_inactive=drop_inactive,
        keep_mean_range=keep_mean_range,
        rewrite=rewrite,
        compression=compression,
        verify=verify,
        batch_col=batch_col or base.batch_col,
        length_col=length_col or base.length_col,
        baseline_col=baseline_col or base.baseline_col,
    )


def _summary_file(summary_json: str | None) -> str | None:
    """The file the run writes the summary to (``-``, standard output, is the CLI's)."""
    return None if summary_json == "-" else summary_json


def _report(
    summary: RunSummary,
    *,
    quiet: bool,
    summary_json: str | None,
    compact: bool = False,
    color: Color = "auto",
) -> None:
    """JSON on stdout where asked (a file was written by the run); the report on stderr."""
    if summary_json == "-":
        try:
            sys.stdout.write(summary.to_json() + "\n")
            sys.stdout.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            written = summary.output is not None
            raise GrpoError(
                f"--summary-json -: cannot write to standard output ({exc.strerror or exc})"
                + ("; the output was written" if written else ""),
                exit_code=EXIT_WRITTEN_THEN_FAILED if written else EXIT_USAGE,
            ) from None
    if quiet:
        return
    from rich.console import Console

    from grpo_cli.report import render_compact, render_plain, render_rich

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


@app.command(no_args_is_help=True, epilog=COMPUTE_EXAMPLES + EXIT_CODES_HELP)
def compute(
    input: InputArg,
    output: Annotated[
        str,
        typer.Option(
            "--output",
            "-o",
            rich_help_panel="Output",
            metavar="PATH",
            help="Output Parquet file (.parquet); JSON lines (.jsonl, .jsonl.gz, .jsonl.zst; - for "
            "standard output); or a directory: one Parquet shard per input shard.",
            show_default=False,
        ),
    ],
    reward_col: RewardColOpt = None,
    group_col: GroupColOpt = None,
    group_size: GroupSizeOpt = None,
    reward_aggregation: AggregationOpt = None,
    preset: PresetOpt = None,
    estimator: EstimatorOpt = None,
    epsilon: EpsilonOpt = None,
    std: StdOpt = None,
    scale: ScaleOpt = None,
    epsilon_mode: EpsilonModeOpt = None,
    singleton: SingletonOpt = None,
    nan: NanOpt = None,
    whiten: WhitenOpt = False,
    clip_advantage: ClipOpt = None,
    batch_col: BatchColOpt = None,
    length_col: LengthColOpt = None,
    baseline_col: BaselineColOpt = None,
    gpg_f_norm: GpgFNormOpt = None,
    device: DeviceOpt = "cpu",
    advantage_col: AdvantageColOpt = "advantage",
    active_col: ActiveColOpt = "group_active",
    stats_cols: Annotated[
        bool,
        typer.Option(
            "--stats-cols", rich_help_panel="Output", help="Also write each row's group mean, std and size."
        ),
    ] = False,
    drop_inactive: Annotated[
        bool,
        typer.Option(
            "--drop-inactive",
            rich_help_panel="Output",
            help="Leave out rollouts of inactive groups (DAPO dynamic sampling).",
        ),
    ] = False,
    keep_mean_range: Annotated[
        tuple[float, float] | None,
        typer.Option(
            "--keep-mean-range",
            rich_help_panel="Output",
            help="Keep only groups whose mean reward lies in [LO, HI] (difficulty filter).",
            metavar="LO HI",
        ),
    ] = None,
    rewrite: Annotated[
        bool,
        typer.Option(
            "--rewrite",
            rich_help_panel="Output",
            help="Re-encode every column instead of splicing the new ones into a copy of each "
            "Parquet input's bytes (e.g. to change --compression).",
        ),
    ] = False,
    compression: Annotated[
        Compression,
        typer.Option(
            "--compression",
            rich_help_panel="Output",
            help="Codec of the columns grpo-cli encodes: the new ones (spliced), or all (--rewrite).",
        ),
    ] = "snappy",
    summary_json: SummaryJsonOpt = None,
    force: Annotated[
        bool, typer.Option("--force", "-f", rich_help_panel="Output", help="Overwrite an existing output.")
    ] = False,
    quiet: QuietOpt = False,
    input_format: InputFormatOpt = None,
    memory_limit_mb: MemoryLimitOpt = 1024,
    batch_rows: BatchRowsOpt = None,
    engine: Annotated[
        Engine,
        typer.Option(
            "--engine",
            rich_help_panel="Engine",
            help="local: this machine, streaming; ray: a Ray cluster with Ray Data.",
        ),
    ] = "local",
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address",
            rich_help_panel="Engine",
            metavar="ADDRESS",
            help="With --engine ray: 'auto' or host:port joins a cluster.",
            show_default="start a local Ray instance",
        ),
    ] = None,
    partitions: Annotated[
        int | None,
        typer.Option(
            "--partitions",
            min=1,
            rich_help_panel="Engine",
            metavar="N",
            help="With --engine ray: hash partitions of the group keys.",
            show_default="input size / 256 MiB",
        ),
    ] = None,
    color: ColorOpt = "auto",
    debug: DebugOpt = False,
) -> None:
    """Compute advantages and write INPUT's rows with two new columns to Parquet or JSON lines.

    Writes the advantage column and a per-row bool column that says whether the rollout's
    group is active; every input column is kept, in order, with rows in input order. The
    summary goes to standard error.
    """

    def body(state: _RunState) -> int:
        config = _config(
            reward_col=reward_col,
            group_col=group_col,
            group_size=group_size,
            reward_aggregation=reward_aggregation,
            preset=preset,
            estimator=estimator,
            epsilon=epsilon,
            std=std,
            scale=scale,
            epsilon_mode=epsilon_mode,
            singleton=singleton,
            nan=nan,
            device=device,
            input_format=input_format,
            memory_limit_mb=memory_limit_mb,
            batch_rows=batch_rows,
            advantage_col=advantage_col,
            active_col=active_col,
            stats_cols=stats_cols,
            drop_inactive=drop_inactive,
            keep_mean_range=keep_mean_range,
            rewrite=rewrite,
            compression=compression,
            whiten=whiten,
            clip_advantage=clip_advantage,
            batch_col=batch_col,
            length_col=length_col,
            baseline_col=baseline_col,
            gpg_f_norm=gpg_f_norm,
        )
        _check_stdout(summary_json)
        if output == "-" and summary_json == "-":
            raise GrpoError("-o - and --summary-json - would both write to standard output")
        _check_stdout(output, "-o")
        if engine == "ray":
            from grpo_cli.jobs import compute_dataset_ray

            summary = compute_dataset_ray(
                input,
                output,
                config,
                address=ray_address,
                partitions=partitions,
                force=force,
                quiet=quiet,
                summary_json=_summary_file(summary_json),
            )
        else:
            if ray_address is not None or partitions is not None:
                raise GrpoError("--ray-address and --partitions need --engine ray")
            from grpo_cli.jobs import compute_dataset

            summary = compute_dataset(
                input,
                output,
                config,
                force=force,
                progress=state.progress,
                summary_json=_summary_file(summary_json),
            )
            state.close_progress()
        state.written = output
        _report(summary, quiet=quiet, summary_json=summary_json, color=color)
        return EXIT_OK

    _run(debug, body, bars=not quiet and engine == "local")


@app.command(no_args_is_help=True, epilog=CHECK_EXAMPLES + EXIT_CODES_HELP)
def check(
    input: InputArg,
    max_inactive_fraction: Annotated[
        float | None,
        typer.Option(
            "--max-inactive-fraction",
            min=0.0,
            max=1.0,
            rich_help_panel="Checks",
            help="Fail if more than F of the groups are inactive.",
        ),
    ] = None,
    min_active_groups: Annotated[
        int | None,
        typer.Option(
            "--min-active-groups",
            min=0,
            rich_help_panel="Checks",
            help="Fail if fewer than N groups are active.",
        ),
    ] = None,
    min_groups: Annotated[
        int | None,
        typer.Option(
            "--min-groups", min=0, rich_help_panel="Checks", help="Fail if there are fewer than N groups."
        ),
    ] = None,
    min_group_size: Annotated[
        int | None,
        typer.Option(
            "--min-group-size",
            min=1,
            rich_help_panel="Checks",
            help="Fail if any group has fewer than N rollouts.",
        ),
    ] = None,
    max_group_size: Annotated[
        int | None,
        typer.Option(
            "--max-group-size",
            min=1,
            rich_help_panel="Checks",
            help="Fail if any group has more than N rollouts.",
        ),
    ] = None,
    uniform_group_size: Annotated[
        bool,
        typer.Option(
            "--uniform-group-size",
            rich_help_panel="Checks",
            help="Fail unless every group has the same size.",
        ),
    ] = False,
    max_singleton_groups: Annotated[
        int | None,
        typer.Option(
            "--max-singleton-groups",
            min=0,
            rich_help_panel="Checks",
            help="Fail if more than N groups have one rollout.",
        ),
    ] = None,
    validate_pages: Annotated[
        bool,
        typer.Option(
            "--validate-pages",
            rich_help_panel="Checks",
            help="Decode every page of every Parquet input, verifying page checksums where the writer "
            "wrote them; fail on the first that does not decode (compute's splicing copies the bytes of "
            "columns it does not read without decoding them).",
        ),
    ] = False,
    verify_advantage_col: Annotated[
        str | None,
        typer.Option(
            "--verify-advantage-col",
            rich_help_panel="Checks",
            help="Recompute advantages with the chosen options or preset and compare them with this column.",
            metavar="NAME",
        ),
    ] = None,
    atol: Annotated[
        float,
        typer.Option(
            "--atol", min=0.0, rich_help_panel="Checks", help="Absolute tolerance for --verify-advantage-col."
        ),
    ] = 1e-6,
    rtol: Annotated[
        float,
        typer.Option(
            "--rtol", min=0.0, rich_help_panel="Checks", help="Relative tolerance for --verify-advantage-col."
        ),
    ] = 1e-5,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            rich_help_panel="Checks",
            help="Recompute the advantage column a grpo-cli output records, with the options it records "
            "(its provenance); options given beside it override them.",
        ),
    ] = False,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            rich_help_panel="Checks",
            help="With --verify-advantage-col: rows that differ only by a trainer's float rounding residue "
            "(constant groups, identical other rollouts, float32 offsets) fail the check too.",
        ),
    ] = False,
    reward_col: RewardColOpt = None,
    group_col: GroupColOpt = None,
    group_size: GroupSizeOpt = None,
    reward_aggregation: AggregationOpt = None,
    preset: PresetOpt = None,
    estimator: EstimatorOpt = None,
    epsilon: EpsilonOpt = None,
    std: StdOpt = None,
    scale: ScaleOpt = None,
    epsilon_mode: EpsilonModeOpt = None,
    singleton: SingletonOpt = None,
    nan: NanOpt = None,
    whiten: WhitenOpt = False,
    clip_advantage: ClipOpt = None,
    batch_col: BatchColOpt = None,
    length_col: LengthColOpt = None,
    baseline_col: BaselineColOpt = None,
    gpg_f_norm: GpgFNormOpt = None,
    device: DeviceOpt = "cpu",
    summary_json: SummaryJsonOpt = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force", "-f", rich_help_panel="Output", help="Overwrite an existing --summary-json file."
        ),
    ] = False,
    quiet: QuietOpt = False,
    input_format: InputFormatOpt = None,
    memory_limit_mb: MemoryLimitOpt = 1024,
    batch_rows: BatchRowsOpt = None,
    color: ColorOpt = "auto",
    debug: DebugOpt = False,
) -> None:
    """Check that a rollout dataset is fit to train on; exit 1 if any check fails.

    Reads INPUT like compute, writes no data, prints one line per check (name, measured
    value, bound, PASS or FAIL) on standard error. With no check options it prints the
    summary and exits 0.
    """

    def body(state: _RunState) -> int:
        from grpo_cli.checks import CheckBounds
        from grpo_cli.config import ComputeConfig, VerifySpec
        from grpo_cli.jobs import check_dataset, recorded_provenance

        verifying = verify or verify_advantage_col is not None
        if strict and not verifying:
            raise GrpoError("--strict needs --verify or --verify-advantage-col")
        recorded = None
        if verifying:
            record = recorded_provenance(input)
            if record is not None:
                recorded = ComputeConfig.from_provenance(record)
                if verify_advantage_col is None:
                    recorded.check_recomputable(" ".join(input))
            elif verify_advantage_col is None:
                raise GrpoError(
                    f"{' '.join(input)}: no grpo-cli provenance to verify against "
                    "(not written by grpo-cli compute); "
                    "name the column with --verify-advantage-col and give the options it was made with"
                )
        column = verify_advantage_col or (recorded.advantage_col if recorded is not None else None)
        verify_spec = VerifySpec(column, atol=atol, rtol=rtol, strict=strict) if column is not None else None
        config = _config(
            reward_col=reward_col,
            group_col=group_col,
            group_size=group_size,
            reward_aggregation=reward_aggregation,
            preset=preset,
            estimator=estimator,
            epsilon=epsilon,
            std=std,
            scale=scale,
            epsilon_mode=epsilon_mode,
            singleton=singleton,
            nan=nan,
            device=device,
            input_format=input_format,
            memory_limit_mb=memory_limit_mb,
            batch_rows=batch_rows,
            verify=verify_spec,
            whiten=whiten,
            clip_advantage=clip_advantage,
            batch_col=batch_col,
            length_col=length_col,
            baseline_col=baseline_col,
            gpg_f_norm=gpg_f_norm,
            recorded=recorded,
        )
        _check_stdout(summary_json)
        bounds = CheckBounds(
            max_inactive_fraction=max_inactive_fraction,
            min_active_groups=min_active_groups,
            min_groups=min_groups,
            min_group_size=min_group_size,
            max_group_size=max_group_size,
            uniform_group_size=uniform_group_size,
            max_singleton_groups=max_singleton_groups,
            validate_pages=validate_pages,
        )
        summary = check_dataset(
            input,
            bounds,
            config,
            force=force,
            progress=state.progress,
            summary_json=_summary_file(summary_json),
        )
        state.close_progress()
        _report(summary, quiet=quiet, summary_json=summary_json, compact=bool(summary.checks), color=color)
        return EXIT_OK if all(c["passed"] for c in summary.checks) else EXIT_CHECK_FAILED

    _run(debug, body, bars=not quiet)


INSPECT_EXAMPLES = """**Examples**

`grpo-cli inspect with_adv.parquet`

`grpo-cli inspect out/ | jq .options.preset`

"""


@app.command(no_args_is_help=True, epilog=INSPECT_EXAMPLES + EXIT_CODES_HELP)
def inspect(
    input: Annotated[
        str,
        typer.Argument(
            metavar="FILE",
            help="A Parquet file grpo-cli wrote, or a directory of them.",
            show_default=False,
        ),
    ],
    debug: DebugOpt = False,
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

    _run(debug, body)


def main() -> None:
    """Console-script entry point."""
    app()
