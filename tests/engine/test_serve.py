"""`vllm-vspec serve --preset tiny-*` really serves on CPU: one server per
preset, started through the launcher as a subprocess on a free localhost
port (vLLM's engine core in its own process, as users run it), waited for
on /health. The tiny-draft preset's server is test_serving_faults.py's (the
same command): it answers chat completions there and really speculates.

Last, the server's end (docs/lifecycle.md): kill -9 of its engine-core
process ends the launcher with a non-zero status (stock vLLM's API server
exits 0) and "without a stop request", and 10 s later no process of the
server's group is left (the other edges of the served lifecycle:
test_lifecycle_signals.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from test_lifecycle_signals import SERVER_PID, _cmdlines, _engine_core, assert_group_gone
from vllm_vspec.bench.server import Server, free_port

PRESETS = ("tiny-eagle",)


pytestmark = pytest.mark.engine


def get(url: str, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def post_json(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {"error": e.read().decode()}


@pytest.fixture(scope="module", params=PRESETS)
def server(request, tmp_path_factory):
    """The preset's server, started through the launcher as users start it."""
    port = free_port()
    srv = Server([sys.executable, "-m", "vllm_vspec.cli", "serve", "--preset", request.param,
                  "--port", str(port), "--", "--host", "127.0.0.1"],
                 port, tmp_path_factory.mktemp("serve") / f"{request.param}.log",
                 env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"})
    with srv:
        yield request.param, srv
        srv.stop(grace_s=0)   # whatever the last test left: its whole process group at once


def metric_total(text: str, name: str) -> float:
    """Sum of a Prometheus counter over all its label sets."""
    pattern = re.compile(rf"^{re.escape(name)}(?:_total)?(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))


def test_the_preset_answers_a_chat_completion(server):
    name, srv = server
    base = srv.base_url
    status, body = post_json(base + "/v1/chat/completions", {
        "model": name, "temperature": 0, "max_tokens": 24,
        "messages": [{"role": "user", "content": "def fibonacci(n):"}]})
    assert status == 200, body
    assert body["choices"][0]["message"]["content"], body
    assert body["usage"]["completion_tokens"] > 0, body


def test_the_preset_really_speculates(server):
    name, srv = server
    base, log_path = srv.base_url, srv.log_path
    post_json(base + "/v1/completions", {"model": name, "prompt": "import os\n",
                                         "temperature": 0, "max_tokens": 24})
    status, text = get(base + "/metrics")
    assert status == 200
    drafts = metric_total(text, "vllm:spec_decode_num_draft_tokens")
    assert drafts > 0, f"{name}: no draft tokens were verified; log:\n" + log_path.read_text()[-3000:]


# Last in this module: it ends the module's server.
def test_kill_9_of_the_engine_core_ends_the_launcher_non_zero_and_leaves_no_process(server):
    name, srv = server
    log = srv.log_path.read_text(errors="replace")
    m = SERVER_PID.search(log)
    assert m, f"no server pid line:\n{log[-3000:]}"
    pgid = int(m.group(1))
    core = _engine_core(pgid)
    assert core is not None, _cmdlines(pgid)
    os.kill(core, signal.SIGKILL)
    killed = time.monotonic()
    try:
        srv.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the launcher still runs 60 s after its engine core died:\n"
                    + srv.log_tail(40))
    log = srv.log_path.read_text(errors="replace")
    assert srv.proc.returncode != 0, srv.log_tail(40)
    assert "without a stop request" in log, srv.log_tail(40)
    time.sleep(max(0.0, killed + 10 - time.monotonic()))
    assert_group_gone(pgid, log)
