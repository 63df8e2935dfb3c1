"""Where engine output goes while a main command runs (`vllm-vspec demo`,
`vllm-vspec bench serve`): into a log file the command names, and onto the
console as well only with `--verbose`. Otherwise the console shows the
command's own output alone: one progress bar, then its tables.

In-process engines (`engine_output`) are redirected at the process's file
descriptors 1 and 2, not at Python objects, so everything lands in the log:
vLLM's loggers (their handler holds `sys.stdout`), Python warnings, the
progress bars of weight loading, torch's and C libraries' own writes, and
every process started meanwhile (it inherits the descriptors). A server
process (bench/server.py) writes to its log through `copy_lines` when it is
echoed, straight into the file otherwise.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, TextIO

# Seconds `engine_output` waits, on exit, for output still in the pipe of a
# --verbose run (a process started inside may hold the pipe open longer).
DRAIN_S = 5.0


def copy_lines(src: BinaryIO, log: BinaryIO,
               echo: Callable[[bytes], None] | None = None) -> threading.Thread:
    """Start a daemon thread that copies `src` to `log` line by line (each
    line flushed, so the log is current while the engine runs) and hands
    each line to `echo` too, until `src` ends; then closes `src`."""
    def run() -> None:
        with src:
            for line in iter(src.readline, b""):
                log.write(line)
                log.flush()
                if echo is not None:
                    echo(line)

    thread = threading.Thread(target=run, name="vspec-engine-log", daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def engine_output(log_path: Path, verbose: bool = False) -> Iterator[TextIO]:
    """Within: what this process and its children write to stdout and
    stderr goes to `log_path` (created or truncated), and to the console's
    stdout as well when `verbose`. Yields a text stream on the console's
    stderr for the command's own progress bar. On exit the descriptors are
    what they were before, whatever the body raised."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    console = os.fdopen(os.dup(saved_err), "w", buffering=1)
    log = open(log_path, "wb")
    copier = None
    try:
        if verbose:
            read_end, write_end = os.pipe()
            copier = copy_lines(os.fdopen(read_end, "rb"), log,
                                lambda line: os.write(saved_out, line))
            target = write_end
        else:
            target = log.fileno()
        os.dup2(target, 1)
        os.dup2(target, 2)
        if verbose:
            os.close(write_end)   # fds 1 and 2 now hold the pipe open
        yield console
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        if copier is not None:
            copier.join(DRAIN_S)   # EOF once no process holds the pipe
        if copier is None or not copier.is_alive():
            log.close()            # else the copier still writes to it
        console.close()
        if copier is None or not copier.is_alive():
            os.close(saved_out)    # else the copier still echoes to it
        os.close(saved_err)


__all__ = ["DRAIN_S", "copy_lines", "engine_output"]
