"""A requested shutdown of vLLM's API server logs no traceback.

vLLM 0.32's `AsyncLLM.shutdown` (vllm/v1/engine/async_llm.py) first shuts
its engine client down (`MPClient.shutdown`: the background resources mark
the engine dead and cancel the output-queue task, which then queues an
`EngineDeadError`), and only then cancels its own output handler. The
event loop runs in between (the API server calls shutdown from a worker
thread), so the output handler can read that error first and log it with
`logger.exception("AsyncLLM output_handler failed.")`: a traceback ending
in `EngineDeadError: EngineCore encountered an issue` after every request
has been answered, which reads as a crash in a log search.

The race is the host's and is filtered, not avoided: `install()` (run in
every vLLM process by vspec's plugin) adds logging filters that turn that
one record into a single INFO line without the traceback, when both hold:

- the API server's shutdown was requested: its signal handler
  (`serve_http`, vllm/entrypoints/launchers/launcher.py) logged
  SHUTDOWN_REQUESTED before;
- the engine core did not die: the engine client's liveness monitor
  (`MPClient.start_engine_core_monitor`) did not log ENGINE_DIED.

Every other record passes unchanged, the same record after an engine
death included. Where the API server's INFO records are disabled the
request is not seen and the traceback stays.
"""

from __future__ import annotations

import logging

OUTPUT_HANDLER_LOGGER = "vllm.v1.engine.async_llm"
OUTPUT_HANDLER_FAILED = "AsyncLLM output_handler failed."
LAUNCHER_LOGGER = "vllm.entrypoints.launchers.launcher"
SHUTDOWN_REQUESTED = "[shutdown] API server: shutdown triggered"
CLIENT_LOGGER = "vllm.v1.engine.core_client"
ENGINE_DIED = "[shutdown] MPClient: engine core exited unexpectedly"
FILTERED = ("AsyncLLM output_handler stopped by the requested shutdown "
            "(EngineDeadError from the engine client's own teardown; traceback "
            "filtered by vllm_vspec.hosts.vllm.shutdown_log)")


class ShutdownState:
    """What this process's log has said about its shutdown so far."""

    def __init__(self) -> None:
        self.requested = False
        self.engine_died = False


class Watch(logging.Filter):
    """Notes SHUTDOWN_REQUESTED and ENGINE_DIED records; drops nothing."""

    def __init__(self, state: ShutdownState) -> None:
        super().__init__()
        self.state = state

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg if isinstance(record.msg, str) else ""
        if msg.startswith(SHUTDOWN_REQUESTED):
            self.state.requested = True
        elif msg.startswith(ENGINE_DIED):
            self.state.engine_died = True
        return True


class QuietShutdownRace(logging.Filter):
    """Rewrites the output handler's EngineDeadError record of a requested
    shutdown into one INFO line (see the module docstring); drops nothing."""

    def __init__(self, state: ShutdownState) -> None:
        super().__init__()
        self.state = state

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[0] if record.exc_info else None
        if (record.msg == OUTPUT_HANDLER_FAILED and exc is not None
                and exc.__name__ == "EngineDeadError"
                and self.state.requested and not self.state.engine_died):
            record.msg, record.args = FILTERED, ()
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True


_installed: ShutdownState | None = None


def install() -> ShutdownState:
    """Add the filters to vLLM's loggers (once per process); the state they share."""
    global _installed
    if _installed is None:
        _installed = ShutdownState()
        for name in (LAUNCHER_LOGGER, CLIENT_LOGGER):
            logging.getLogger(name).addFilter(Watch(_installed))
        logging.getLogger(OUTPUT_HANDLER_LOGGER).addFilter(QuietShutdownRace(_installed))
    return _installed
