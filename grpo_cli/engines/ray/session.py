"""Starting and stopping Ray: a local instance in a private folder short enough for its socket
paths, or a cluster's address checked first; every exit path stops what the run started."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from grpo_cli import interrupts
from grpo_cli.allocator import MALLOC_ENV
from grpo_cli.errors import GrpoError, mention, os_reason
from grpo_cli.scratch import socket_root
from grpo_cli.threads import IDLE_THREADS_ENV

WORKER_ENV = {**MALLOC_ENV, **IDLE_THREADS_ENV}
"""Settings a process reads when it starts (glibc's malloc, OpenMP), for the private instance's
workers: see :mod:`grpo_cli.allocator` and :mod:`grpo_cli.threads`."""


def import_ray() -> Any:
    try:
        import ray
        import ray.data
    except ImportError:
        raise GrpoError(
            f"{mention('engine')} ray needs Ray Data: pip install 'grpo-cli[ray]' (or pip install "
            "'ray[data]')"
        ) from None
    return ray


@contextmanager
def ray_session(address: str | None, *, quiet: bool = True, num_cpus: int | None = None) -> Iterator[Any]:
    """Join ``address`` (``auto`` or host:port), or start a private local instance (with
    ``num_cpus`` worker slots: all of this machine's by default).

    A local instance is started quietly (no dashboard, no log forwarding, no usage
    stats), keeps its files and its auth token in a temporary folder rather than in
    /tmp/ray and ``~/.ray``, and is shut down on every exit path. An instance already
    running in this process is reused and left running.
    """
    running = sys.modules.get("ray")
    if running is not None and running.is_initialized():
        yield running
        return
    saved_env = {k: os.environ.get(k) for k in (*_RAY_ENV, *WORKER_ENV)}
    temp_dir = tempfile.mkdtemp(prefix="grpo-ray-", dir=_short_temp_root()) if address is None else None
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if temp_dir is not None:  # the private instance's workers start as the CLI's process runs
        for setting, wanted_value in WORKER_ENV.items():
            os.environ.setdefault(setting, wanted_value)
    unset = saved_env["RAY_AUTH_MODE"] is None and not saved_env["RAY_AUTH_TOKEN"]
    # Every private instance of the process uses one token file (a second instance started with
    # another timed out waiting for its GCS). Ray reads its auth settings when it is imported:
    # where something imported it first, it is told to read them again, since without a token it
    # turns token auth on for a new local instance and writes one to ~/.ray/auth_token.
    reread = temp_dir is not None and unset
    if reread:
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(_process_token.get())
        if running is not None:
            _reread_ray_auth()
    ray = None
    try:
        ray = import_ray()
        handlers = _signal_handlers()
        _keep_our_sigterm_handler(ray)
        try:
            if temp_dir is not None:
                ray.init(
                    include_dashboard=False,
                    log_to_driver=False,
                    logging_level="ERROR",
                    _temp_dir=temp_dir,
                    num_cpus=num_cpus,
                )
            else:
                assert address is not None  # no private instance is started: one is joined
                _check_reachable(address)
                ray.init(address=address, log_to_driver=False, logging_level="ERROR")
        except SystemExit as exc:
            # ray.init's own SIGTERM handler exits with the signal's number while it starts the
            # instance: the run was stopped, as by Ctrl-C (exit 130, everything started stopped)
            if exc.code in _STOP_SIGNALS:
                raise KeyboardInterrupt from None
            raise
        except (ConnectionError, RuntimeError) as exc:
            where = "start a local Ray instance" if address is None else f"join the Ray cluster at {address}"
            raise GrpoError(f"cannot {where} ({str(exc).strip().splitlines()[0]})") from None
        # Ray's driver installs handlers that dump stacks on SIGTERM: keep grpo-cli's, which
        # end the run cleanly (exit 130, temporaries removed).
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        interrupts.raise_if_requested()  # a stop while Ray started (its exception may be lost)
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = not quiet
        context.print_on_execution_start = False
        context.execution_options.preserve_order = True  # output files follow the input's order
        for name in ("ray", "ray.data"):
            logging.getLogger(name).setLevel(logging.ERROR)
        yield ray
    finally:
        if ray is not None and (ray.is_initialized() or temp_dir is not None):
            # a private instance stopped while it started is not "initialized", yet runs
            ray.shutdown(**({"wait_for_processes": True} if _shutdown_waits(ray) else {}))
        if temp_dir is not None:
            _stop_leftovers(temp_dir)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if reread and "ray" in sys.modules:  # Ray sees the process's own settings again
            _reread_ray_auth()
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)


JOIN_TIMEOUT_SECONDS = 10.0


def _check_reachable(address: str) -> None:
    """Refuse a ``host:port`` that nothing answers at within :data:`JOIN_TIMEOUT_SECONDS`:
    Ray itself retries such an address for many minutes, logging each try to the terminal.
    ``auto`` and ``ray://`` client addresses are left to Ray.

    >>> _check_reachable("auto")
    """
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=JOIN_TIMEOUT_SECONDS).close()
    except OSError as exc:
        if isinstance(exc, TimeoutError):
            raise ConnectionError(f"nothing answered there within {JOIN_TIMEOUT_SECONDS:g} s") from None
        raise ConnectionError(os_reason(exc)) from None


def _reread_ray_auth() -> None:
    """Have an imported Ray read its auth settings (``RAY_AUTH_MODE``, the token) from the
    environment again, as Ray itself does when it turns token auth on."""
    import importlib

    try:
        raylet = importlib.import_module("ray._raylet")
        config, loader = raylet.Config, raylet.AuthenticationTokenLoader
    except (ImportError, AttributeError):  # a Ray without token auth
        return
    config.initialize("")
    loader.instance().reset_cache()


class _ProcessToken:
    """The auth token of this process's private Ray instances: a file in a private folder,
    made once, removed when the interpreter exits."""

    def __init__(self) -> None:
        self.path: Path | None = None

    def get(self) -> Path:
        if self.path is None:
            folder = Path(tempfile.mkdtemp(prefix="grpo-ray-token-", dir=_short_temp_root()))
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            path = folder / "auth_token"
            path.write_text(secrets.token_hex(32))
            path.chmod(0o600)
            self.path = path
        return self.path


_process_token = _ProcessToken()


_STOP_SIGNALS = {int(getattr(signal, name)) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)}


RAY_SOCKET_TAIL = len("/grpo-ray-12345678/session_2026-12-07_00-32-57_894933_4194304/sockets/plasma_store")
"""What follows the temporary root in the longest socket path of a private instance: the
folder, Ray's session (its date, time and the largest process ID) and its plasma store."""


def _short_temp_root() -> str | None:
    """A temporary root short enough for Ray's socket paths: ``TMPDIR`` (``None``) where it
    fits, else ``/tmp``; a TMPDIR of 28 characters or more broke them (exit 70)."""
    root = socket_root(RAY_SOCKET_TAIL, program="Ray")
    return None if root is None else str(root)


def _shutdown_waits(ray: Any) -> bool:
    """Whether this Ray's ``shutdown`` can wait for the processes it stops."""
    import inspect

    return "wait_for_processes" in inspect.signature(ray.shutdown).parameters


def _stop_leftovers(temp_dir: str) -> None:
    """Stop every process of this run's private instance still running after ``ray.shutdown``
    (one stopped while it started is not shut down by it): this process's descendants whose
    command line names ``temp_dir`` or that Ray titled ``ray::...`` (its workers). SIGTERM,
    then SIGKILL a few seconds later. Linux only (``/proc``); elsewhere ``ray.shutdown`` alone."""

    proc = Path("/proc")
    if not proc.is_dir():
        return
    children: dict[int, list[int]] = {}
    commands: dict[int, str] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            commands[int(entry.name)] = (
                (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            )
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    ours, stack = [], list(children.get(os.getpid(), []))
    while stack:
        pid = stack.pop()
        ours.append(pid)
        stack += children.get(pid, [])
    leftovers = [
        pid for pid in ours if temp_dir in commands.get(pid, "") or commands.get(pid, "").startswith("ray::")
    ]
    for pid in leftovers:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 3.0
    while leftovers and time.monotonic() < deadline:
        leftovers = [pid for pid in leftovers if _running(pid)]
        time.sleep(0.05)
    for pid in leftovers:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, ended but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    if state == "Z":
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return True


def _keep_our_sigterm_handler(ray: Any) -> None:
    """``ray.init`` installs a SIGTERM handler that exits with the signal's number: raised in
    one of the at-fork callbacks Ray's start runs, its SystemExit was ignored and the signal
    lost (the run went on and exited 0). grpo-cli's handler stays (it records the stop:
    :mod:`grpo_cli.interrupts`)."""
    utils = getattr(getattr(ray, "_private", None), "utils", None)
    if utils is not None and hasattr(utils, "set_sigterm_handler"):
        utils.set_sigterm_handler = lambda handler: None


def _signal_handlers() -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}
    names = ("SIGTERM", "SIGHUP", "SIGINT")
    return {sig: signal.getsignal(sig) for sig in (getattr(signal, n) for n in names if hasattr(signal, n))}


_RAY_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_USAGE_STATS_ENABLED")
