"""The served lifecycle's edges (docs/lifecycle.md): what `vllm-vspec serve`
guarantees a supervisor (systemd, Kubernetes, a shell).

Engine tests (`vllm-vspec serve --preset tiny-draft`, as a user starts it,
the engine core in its own process; loopback only, every wait bounded):

- a SIGTERM at three points of start-up (the API server importing; its
  engine-core process started; the model loading) ends the launcher within
  the preset's shutdown timeout with status 0, one "start-up cancelled"
  line, and no process of the server's group left. Stock vLLM 0.32 hangs at
  the second point and ignores the signal at the third (docs/host-defects.md);

The served lifecycle's other edges run on servers other modules start
anyway: SIGTERM with requests in flight (every request answered, status 0,
no traceback, no process of the group left) is test_serving_faults.py's last
test; kill -9 of the engine-core process (the launcher exits non-zero, stock
vLLM's API server exits 0, and 10 s later no process of the group is left)
is test_serve.py's.

The supervisor's own rules run first against stand-in servers (small Python
scripts: no vLLM), where every timing is deterministic, and the shutdown
log filter against records shaped like vLLM's.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from vllm_vspec.bench.server import free_port
from vllm_vspec.hosts.vllm import shutdown_log
from vllm_vspec.launch import presets, supervisor

PRESET = "tiny-draft"
SHUTDOWN_TIMEOUT = presets.load(presets.preset_path(PRESET)).launch.shutdown_timeout
CANCELLED = "start-up cancelled"
SERVER_PID = re.compile(r"vllm-vspec serve: server pid (\d+)")


# ----------------------------------------------------------- launchers
class Launch:
    """A launcher process (its own session) with its log; on exit, whatever
    is left of it and of its server's process group is killed."""

    def __init__(self, argv: list[str], log_path: Path, env: dict[str, str] | None = None):
        self.log_path = log_path
        log = open(log_path, "wb")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=env)
        log.close()

    def __enter__(self) -> "Launch":
        return self

    def __exit__(self, *exc) -> None:
        pgid = self.server_pgid()
        for group in (self.proc.pid, pgid):
            if group is not None:
                try:
                    os.killpg(group, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def server_pgid(self) -> int | None:
        m = SERVER_PID.search(self.log())
        return int(m.group(1)) if m else None

    def wait_for(self, what: str, ready, timeout_s: float):
        """ready()'s first truthy value, polled until `timeout_s`; the test
        fails if the launcher ends first or the time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (value := ready()):
                return value
            if self.proc.poll() is not None:
                pytest.fail(f"the launcher exited ({self.proc.returncode}) before {what}:\n"
                            + self.tail())
            time.sleep(0.1)
        pytest.fail(f"no {what} within {timeout_s:.0f} s:\n" + self.tail())

    def stop_and_wait(self, sig: int, timeout_s: float) -> float:
        """Send `sig` to the launcher; seconds until it exited (the test
        fails past `timeout_s`)."""
        os.kill(self.proc.pid, sig)
        sent = time.monotonic()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the launcher still runs {timeout_s:.0f} s after "
                        f"{signal.Signals(sig).name}:\n" + self.tail())
        return time.monotonic() - sent


def assert_group_gone(pgid: int, log: str) -> None:
    left = supervisor.group_members(pgid)
    assert not left, f"processes of the server's group {pgid} left: {left}\n{log[-3000:]}"


# ------------------------------------------------ stand-in servers (fast)
def stand_in(tmp_path: Path, body: str, *args: str) -> list[str]:
    """argv of a stand-in server: a Python script (`body`) that gets the
    launcher's flags (`args`, e.g. --port) like vLLM's server would."""
    script = tmp_path / "server.py"
    script.write_text("import os, signal, subprocess, sys, time\n" + body)
    return [sys.executable, str(script), *args]


def supervised(argv: list[str], tmp_path: Path) -> Launch:
    code = ("import os, sys; from vllm_vspec.launch import supervisor; "
            f"sys.exit(supervisor.run({argv!r}, dict(os.environ)))")
    return Launch([sys.executable, "-c", code], tmp_path / "launcher.log")


IGNORES_SIGTERM = """
signal.signal(signal.SIGTERM, signal.SIG_IGN)
# a child of its own that ignores SIGTERM too (an engine still loading)
subprocess.Popen([sys.executable, "-c",
                  "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
time.sleep(600)
"""


def test_a_start_up_that_ignores_sigterm_is_killed_with_its_children_after_the_grace(tmp_path):
    argv = stand_in(tmp_path, IGNORES_SIGTERM, "--port", str(free_port()),
                    "--shutdown-timeout", "30")
    with supervised(argv, tmp_path) as launch:
        pgid = launch.wait_for("the server pid line", launch.server_pgid, 60)
        launch.wait_for("the stand-in's child", lambda: len(supervisor.group_members(pgid)) >= 2, 60)
        seconds = launch.stop_and_wait(signal.SIGTERM, 30)
        log = launch.log()
        assert launch.proc.returncode == 0, log
        assert log.count(CANCELLED) == 1, log
        assert_group_gone(pgid, log)
    grace = supervisor.startup_grace(30)
    assert grace <= seconds < grace + 5, seconds


def test_a_zero_shutdown_timeout_cancels_start_up_at_once(tmp_path):
    argv = stand_in(tmp_path, IGNORES_SIGTERM, "--port", str(free_port()),
                    "--shutdown-timeout", "0")
    with supervised(argv, tmp_path) as launch:
        pgid = launch.wait_for("the server pid line", launch.server_pgid, 60)
        seconds = launch.stop_and_wait(signal.SIGINT, 30)
        assert launch.proc.returncode == 0 and CANCELLED in launch.log(), launch.log()
        assert_group_gone(pgid, launch.log())
    assert seconds < supervisor.STARTUP_GRACE_S, seconds   # no grace at all


HEALTHY = """
import http.server, threading
port = int(sys.argv[sys.argv.index("--port") + 1])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", port), Health)
threading.Thread(target=server.serve_forever, daemon=True).start()
MODE = sys.argv[-1]
def on_term(*_):
    print("server: got SIGTERM", flush=True)
    if MODE == "drains":
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
while True:
    time.sleep(0.1)
"""


def _serving(tmp_path: Path, mode: str) -> Launch:
    port = free_port()
    launch = supervised(stand_in(tmp_path, HEALTHY, "--port", str(port),
                                 "--shutdown-timeout", "30", mode), tmp_path)
    launch.port = port
    return launch


def _healthy_probe_seen(launch: Launch, pgid: int) -> None:
    """Wait until the stand-in answers /health, then one probe period more
    for the launcher to have seen it."""
    def healthy() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{launch.port}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False
    launch.wait_for("a healthy stand-in", healthy, 60)
    time.sleep(supervisor.PROBE_EVERY_S + supervisor.PROBE_TIMEOUT_S + 0.5)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_serving_server_gets_sigterm_and_its_clean_exit_is_status_0(tmp_path, sig):
    with _serving(tmp_path, "drains") as launch:
        pgid = launch.wait_for("the server pid line", launch.server_pgid, 60)
        _healthy_probe_seen(launch, pgid)
        launch.stop_and_wait(sig, 30)
        log = launch.log()
        assert launch.proc.returncode == 0, log
        assert "server: got SIGTERM" in log and CANCELLED not in log, log
        assert_group_gone(pgid, log)


def test_a_second_signal_during_the_drain_kills_the_server_and_exits_1(tmp_path):
    with _serving(tmp_path, "hangs") as launch:
        pgid = launch.wait_for("the server pid line", launch.server_pgid, 60)
        _healthy_probe_seen(launch, pgid)
        os.kill(launch.proc.pid, signal.SIGTERM)
        launch.wait_for("the forwarded SIGTERM", lambda: "server: got SIGTERM" in launch.log(), 30)
        seconds = launch.stop_and_wait(signal.SIGTERM, 30)
        assert launch.proc.returncode == 1, launch.log()
        assert "SIGTERM again during the drain" in launch.log(), launch.log()
        assert_group_gone(pgid, launch.log())
    assert seconds < supervisor.TEARDOWN_S / 3, seconds   # not the drain deadline


@pytest.mark.parametrize("code, status", [(0, 1), (3, 3)])
def test_a_server_that_ends_unasked_fails_the_launcher(tmp_path, code, status):
    with supervised(stand_in(tmp_path, f"time.sleep(1); sys.exit({code})"), tmp_path) as launch:
        launch.proc.wait(timeout=60)
        assert launch.proc.returncode == status, launch.log()
        assert "without a stop request" in launch.log(), launch.log()


def test_flags_are_read_as_vllms_parser_reads_them():
    argv = ["vllm", "serve", "m", "--port", "8001", "--shutdown-timeout", "30",
            "--host", "0.0.0.0", "--port=9000", "--shutdown_timeout", "7"]
    assert supervisor.last_flag(argv, "--shutdown-timeout") == "7"
    assert supervisor.Endpoint.from_argv(argv) == supervisor.Endpoint("127.0.0.1", 9000)
    assert supervisor.Endpoint.from_argv(["--host", "::"]).host == "::1"
    assert supervisor.Endpoint.from_argv([]).port == 8000
    assert supervisor.exit_status(-9) == 137 and supervisor.exit_status(2) == 2


# ------------------------------------------------- shutdown log filter
class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(logging.Formatter("%(levelname)s %(message)s").format(record))


class EngineDeadError(Exception):
    """Stands for vllm.v1.engine.exceptions.EngineDeadError (matched by name)."""


def _log_the_race(request: str | None) -> list[str]:
    """What the output handler's record becomes after `request` (a
    launcher or engine-client message, or none) was logged."""
    state = shutdown_log.ShutdownState()
    base = f"test_lifecycle.{id(state)}"
    loggers = {name: logging.getLogger(f"{base}.{name}") for name in ("launcher", "handler")}
    records = _Records()
    for lg in loggers.values():
        lg.setLevel(logging.INFO)
        lg.propagate = False
        lg.addHandler(records)
    loggers["launcher"].addFilter(shutdown_log.Watch(state))
    loggers["handler"].addFilter(shutdown_log.QuietShutdownRace(state))
    if request:
        loggers["launcher"].info(request)
    try:
        raise EngineDeadError("EngineCore encountered an issue.")
    except EngineDeadError:
        loggers["handler"].exception(shutdown_log.OUTPUT_HANDLER_FAILED)
    return records.lines[-1].splitlines()


def test_the_teardown_race_of_a_requested_shutdown_is_one_info_line():
    assert _log_the_race(shutdown_log.SHUTDOWN_REQUESTED) == ["INFO " + shutdown_log.FILTERED]


@pytest.mark.parametrize("before", [None, shutdown_log.ENGINE_DIED + "; starting cleanup"])
def test_the_output_handler_traceback_stays_unless_a_shutdown_was_requested(before):
    lines = _log_the_race(before)
    assert lines[0] == "ERROR " + shutdown_log.OUTPUT_HANDLER_FAILED
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1].endswith("EngineDeadError: EngineCore encountered an issue.")


# --------------------------------------------------- real servers (slow)
def _launch_preset(tmp_path: Path, name: str) -> Launch:
    port = free_port()
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    launch = Launch([sys.executable, "-m", "vllm_vspec.cli", "serve", "--preset", PRESET,
                     "--port", str(port), "--", "--host", "127.0.0.1"],
                    tmp_path / f"{name}.log", env=env)
    launch.base_url = f"http://127.0.0.1:{port}"
    return launch


def _cmdlines(pgid: int) -> dict[int, str]:
    out = {}
    for pid in supervisor.group_members(pgid):
        try:
            out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            pass
    return out


def _engine_core(pgid: int) -> int | None:
    """The engine-core process of the server's group once it exists: the
    API server's (pid `pgid`) child that multiprocessing spawned (titled
    VLLM::EngineCore after its imports)."""
    for pid, cmd in _cmdlines(pgid).items():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2:].split()[1])
        if ppid == pgid and ("EngineCore" in cmd or "spawn_main" in cmd):
            return pid
    return None


def _healthy(launch: Launch) -> bool:
    try:
        return httpx.get(launch.base_url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


START_UP_S = 600   # the most a tiny-draft start-up may take on a loaded 2-core host

START_UP_POINTS = {
    # the API server still importing vLLM
    "importing": lambda launch, pgid: True,
    # its engine-core process started: stock vLLM swallows SIGTERM from here
    "engine core started": lambda launch, pgid: _engine_core(pgid),
    # the engine past its handshake, loading the model
    "model loading": lambda launch, pgid: "Starting to load model" in launch.log(),
}


@pytest.mark.engine
@pytest.mark.parametrize("point", list(START_UP_POINTS))
def test_sigterm_during_start_up_ends_the_server_within_the_shutdown_timeout(tmp_path, point):
    with _launch_preset(tmp_path, point.replace(" ", "-")) as launch:
        pgid = launch.wait_for("the server pid line", launch.server_pgid, 120)
        launch.wait_for(f"start-up point '{point}'",
                        lambda: START_UP_POINTS[point](launch, pgid), START_UP_S)
        assert not _healthy(launch), f"the server was ready before '{point}'"
        seconds = launch.stop_and_wait(signal.SIGTERM, SHUTDOWN_TIMEOUT + 30)
        log = launch.log()
        assert launch.proc.returncode == 0, launch.tail()
        assert log.count(CANCELLED) == 1, launch.tail()
        assert_group_gone(pgid, log)
    assert seconds <= SHUTDOWN_TIMEOUT, f"{seconds:.1f} s"
    print(f"SIGTERM at '{point}': launcher exited after {seconds:.1f} s")
