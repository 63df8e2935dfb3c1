"""What `vllm-vspec serve` runs: vLLM's server as a child process, supervised.

The launcher stays the process a service manager sees (its pid, its exit
status, its signals); vLLM's API server and everything it starts (engine
core, workers, multiprocessing's resource tracker) run in a process group
of their own, so that one `killpg` reaches all of them and a terminal's
Ctrl-C reaches the launcher only. The guarantees (docs/lifecycle.md):

- start-up lasts until the server first answers `GET /health` with 200. A
  stop signal (SIGTERM, SIGINT, SIGHUP) during start-up cancels it: one
  log line, SIGTERM to the API server, and the whole group is killed once
  the API server has not ended within `startup_grace(shutdown_timeout)`
  seconds. vLLM 0.32's API server cannot be trusted to end on its own
  there (docs/host-defects.md: it swallows the signal while it waits for
  its engine core);
- once serving, a stop signal reaches the API server as SIGTERM: it drains
  its requests for up to `--shutdown-timeout` seconds and stops its engine
  in order; it has TEARDOWN_S more to exit before the group is killed;
- a second stop signal kills the group at once;
- whatever way the API server ends, the rest of its group gets SIGTERM,
  and SIGKILL after LEFTOVER_GRACE_S; the launcher exits only once no
  process of the group is left (as a child subreaper it also reaps engine
  processes the API server orphaned);
- exit status: 0 after a requested stop (a cancelled start-up included,
  killed or not; a drained server's own non-zero status is passed on); 1
  when a serving server had to be killed; the server's own status when it
  ended unasked, and 1 where that status is 0: vLLM's API server exits 0
  when its engine core has died, and a server that stops without being
  asked to has failed.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# Seconds a cancelled start-up gives the API server to end by itself (less
# where the shutdown timeout is shorter) before its group is killed: only a
# server still in its imports, or one that just became ready, ends by itself.
STARTUP_GRACE_S = 5.0
# Seconds beyond the drain window for the engine's and the HTTP server's
# own shutdown after a forwarded stop signal.
TEARDOWN_S = 30.0
# Seconds the group's other processes get after SIGTERM, once the API
# server has ended, before SIGKILL.
LEFTOVER_GRACE_S = 5.0
# Seconds to wait for SIGKILLed processes to be gone.
KILL_WAIT_S = 10.0
POLL_S = 0.1        # how often the supervisor looks at its child and its signals
PROBE_EVERY_S = 1.0  # how often start-up probes /health
PROBE_TIMEOUT_S = 1.0

PREFIX = "vllm-vspec serve: "


def log(message: str) -> None:
    print(PREFIX + message, file=sys.stderr, flush=True)


def startup_grace(shutdown_timeout: float) -> float:
    """Seconds a cancelled start-up waits for the API server to end by itself."""
    return max(0.0, min(STARTUP_GRACE_S, shutdown_timeout))


def drain_deadline(shutdown_timeout: float) -> float:
    """Seconds a forwarded stop signal gives the API server to exit."""
    return max(0.0, shutdown_timeout) + TEARDOWN_S


# ------------------------------------------------------------- arguments
def last_flag(argv: list[str], flag: str) -> str | None:
    """The value of the last `FLAG VALUE` or `FLAG=VALUE` in `argv` (vLLM's
    parser lets the last one win; `_` and `-` are the same in its flags)."""
    names = {flag, flag.replace("-", "_").replace("__", "--", 1)}
    value = None
    for i, arg in enumerate(argv):
        name, sep, rest = arg.partition("=")
        if name in names:
            if sep:
                value = rest
            elif i + 1 < len(argv):
                value = argv[i + 1]
    return value


@dataclass(frozen=True)
class Endpoint:
    """Where the server answers /health: `host:port`, or a unix socket."""
    host: str
    port: int
    uds: str | None = None
    tls: bool = False

    @classmethod
    def from_argv(cls, argv: list[str]) -> "Endpoint":
        host = last_flag(argv, "--host") or ""
        # A wildcard bind answers on loopback too.
        host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        port = last_flag(argv, "--port")
        return cls(host=host, port=int(port) if port else 8000,
                   uds=last_flag(argv, "--uds"),
                   tls=last_flag(argv, "--ssl-keyfile") is not None)

    def healthy(self, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
        """True when `GET /health` answers 200 now."""
        if self.uds:
            conn: http.client.HTTPConnection = _UnixConnection(self.uds, timeout_s)
        elif self.tls:
            context = ssl.create_default_context()
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=timeout_s,
                                               context=context)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout_s)
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout_s: float):
        super().__init__("localhost", timeout=timeout_s)
        self.path = path

    # extends http.client.HTTPConnection.connect: a unix socket instead of TCP.
    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


# ------------------------------------------------------------- processes
def _prctl(option: int, arg: int) -> None:
    """Linux prctl(2); nothing elsewhere or where libc has none."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)
    except (OSError, AttributeError):
        pass


PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _child_setup(parent: int):
    """Run in the child between fork and exec: SIGTERM when the launcher
    dies (its stop cannot be forwarded then), and the default action for
    the stop signals (this process may have had them ignored)."""
    def setup() -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:   # the launcher died before prctl
            os.kill(os.getpid(), signal.SIGTERM)
    return setup


def group_members(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes of process group `pgid`, read
    from /proc; [] where there is no /proc."""
    out = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(entry))
    return out


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _reap() -> None:
    """Collect the exit status of every ended child (the supervised one
    included, once Popen has its status: call only after that)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def exit_status(returncode: int) -> int:
    """A Popen returncode as a shell reports it (128 + N for signal N)."""
    return 128 - returncode if returncode < 0 else returncode


# ------------------------------------------------------------ supervisor
class Supervisor:
    """Runs `argv` (vLLM's server) with `env` and supervises it; `run()`
    returns the launcher's exit status."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.argv, self.env = argv, env
        timeout = last_flag(argv, "--shutdown-timeout")
        self.shutdown_timeout = float(timeout) if timeout else 0.0
        self.endpoint = Endpoint.from_argv(argv)
        self.signals: list[int] = []
        self.proc: subprocess.Popen | None = None

    def _on_signal(self, signum, frame) -> None:
        self.signals.append(signum)

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        try:
            return self._run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run(self) -> int:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        started = time.monotonic()
        if self.signals:   # a stop before the server exists: nothing to start
            log(f"start-up cancelled by {_name(self.signals[0])} before the server started")
            return 0
        self.proc = subprocess.Popen(self.argv, env=self.env, start_new_session=True,
                                     preexec_fn=_child_setup(os.getpid()))
        pgid = self.proc.pid
        log(f"server pid {pgid} (its own process group); stop it with SIGTERM or "
            f"SIGINT to pid {os.getpid()}")
        ready, next_probe = False, 0.0
        while self.proc.poll() is None and not self.signals:
            now = time.monotonic()
            if not ready and now >= next_probe:
                ready = self.endpoint.healthy()
                next_probe = now + PROBE_EVERY_S
            if not self.signals:
                time.sleep(POLL_S)
        if self.proc.returncode is not None:
            code = exit_status(self.proc.returncode)
            self._clear_group(pgid)
            if code == 0:
                log("the server exited with status 0 without a stop request "
                    "(vLLM's API server does so when its engine core has died): exit 1")
                return 1
            log(f"the server exited with status {code} without a stop request")
            return code
        sig = self.signals[0]
        if not ready:
            return self._cancel_startup(pgid, sig, time.monotonic() - started)
        return self._drain(pgid, sig)

    def _cancel_startup(self, pgid: int, sig: int, after_s: float) -> int:
        grace = startup_grace(self.shutdown_timeout)
        log(f"start-up cancelled by {_name(sig)} after {after_s:.1f} s: stopping the server "
            f"(SIGKILL to its process group {pgid} if it has not ended in {grace:g} s)")
        end = time.monotonic() + grace
        _signal_pid(self.proc.pid, signal.SIGTERM)
        if not self._wait(grace):
            _killpg(pgid, signal.SIGKILL)
            self.proc.wait()
        self._clear_group(pgid, max(0.0, end - time.monotonic()))
        return 0

    def _drain(self, pgid: int, sig: int) -> int:
        deadline = drain_deadline(self.shutdown_timeout)
        # SIGTERM whatever the stop signal: vLLM's API server drains on
        # SIGTERM and SIGINT alike, and has no handler for SIGHUP.
        _signal_pid(self.proc.pid, signal.SIGTERM)
        if self._wait(deadline):
            code = exit_status(self.proc.returncode)
            self._clear_group(pgid)
            return 0 if code == 0 or self.proc.returncode < 0 else code
        if len(self.signals) > 1:
            log(f"{_name(self.signals[1])} again during the drain: killing process group {pgid}")
        else:
            log(f"the server did not exit within {deadline:g} s of {_name(sig)}: "
                f"killing process group {pgid}")
        _killpg(pgid, signal.SIGKILL)
        self.proc.wait()
        self._clear_group(pgid)
        return 1

    def _wait(self, seconds: float) -> bool:
        """Wait up to `seconds` for the API server to end; False on a second
        stop signal or at the deadline."""
        first = len(self.signals)
        deadline = time.monotonic() + seconds
        while self.proc.poll() is None:
            if len(self.signals) > first or time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)
        return True

    def _clear_group(self, pgid: int, grace_s: float = LEFTOVER_GRACE_S) -> None:
        """End what the API server left in its group: SIGTERM, then SIGKILL
        after `grace_s`; return once no live member is left (or, for a
        process SIGKILL cannot end, after KILL_WAIT_S, saying so)."""
        _reap()
        if not group_members(pgid):
            return
        _killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(POLL_S)
            _reap()
        _killpg(pgid, signal.SIGKILL)
        deadline = time.monotonic() + KILL_WAIT_S
        while (left := group_members(pgid)) and time.monotonic() < deadline:
            time.sleep(POLL_S)
            _reap()
        if left:
            log(f"process group {pgid}: pids {left} still alive after SIGKILL")


def _signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _name(sig: int) -> str:
    return signal.Signals(sig).name


def run(argv: list[str], env: dict[str, str]) -> int:
    """Run vLLM's server `argv` with `env` under the supervisor; the
    launcher's exit status."""
    return Supervisor(argv, env).run()
