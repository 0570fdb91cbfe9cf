"""``python -m grpo_cli`` and the ``grpo-cli`` console script: the CLI, with SIGTERM and SIGHUP
handled from the first instant. The command's imports (typer, rich, then torch) take a second
or more under load; a stop that lands meanwhile ends the process as an interrupt (exit 130,
one line) rather than killing it, and nothing has been written by then."""

from __future__ import annotations

import os
import signal
from typing import NoReturn


def _stopped_while_starting(signum: int, frame: object) -> None:
    os.write(2, b"error: interrupted; no output was written\n")
    os._exit(130)  # grpo_cli.errors.EXIT_INTERRUPTED, without importing anything more


def main() -> NoReturn:
    """Pause the garbage collector while the modules load (:mod:`grpo_cli.collector`; the
    engine resumes it), install the start-up handlers, then run the CLI (which installs its own
    for the run)."""
    from grpo_cli.collector import pause_for_start_up

    pause_for_start_up()
    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), _stopped_while_starting)
    from grpo_cli.cli import main as run

    run()


if __name__ == "__main__":
    main()
