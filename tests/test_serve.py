"""`vllm-vspec serve --preset tiny-*` really serves on CPU: one server per
preset (module-scoped), started through the launcher as a subprocess on a
free localhost port, waited for on /health, killed at teardown. The
tiny-draft preset's server is test_serving_faults.py's (the same command):
it answers chat completions there and really speculates."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

pytestmark = pytest.mark.engine

# A deadline for start-up, not a speed assertion: past it the log is shown.
STARTUP_DEADLINE_S = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


@pytest.fixture(scope="module", params=["tiny-eagle"])
def server(request, tmp_path_factory):
    name = request.param
    port = free_port()
    log_path = tmp_path_factory.mktemp(name) / "serve.log"
    with open(log_path, "w") as log:
        # start_new_session: the server and its engine-core children form one
        # process group, so teardown can stop exactly what this test started.
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_vspec.cli", "serve", "--preset", name,
             "--port", str(port), "--", "--host", "127.0.0.1"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_DEADLINE_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"{name}: server exited with {proc.returncode}:\n"
                            + log_path.read_text()[-4000:])
            try:
                if get(base + "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{name}: not healthy after {STARTUP_DEADLINE_S} s:\n"
                            + log_path.read_text()[-4000:])
            time.sleep(1)
        yield name, base, log_path
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def metric_total(text: str, name: str) -> float:
    """Sum of a Prometheus counter over all its label sets."""
    pattern = re.compile(rf"^{re.escape(name)}(?:_total)?(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))


def test_the_preset_answers_a_chat_completion(server):
    name, base, log_path = server
    status, body = post_json(base + "/v1/chat/completions", {
        "model": name, "temperature": 0, "max_tokens": 24,
        "messages": [{"role": "user", "content": "def fibonacci(n):"}]})
    assert status == 200, body
    assert body["choices"][0]["message"]["content"], body
    assert body["usage"]["completion_tokens"] > 0, body


def test_the_preset_really_speculates(server):
    name, base, log_path = server
    post_json(base + "/v1/completions", {"model": name, "prompt": "import os\n",
                                         "temperature": 0, "max_tokens": 24})
    status, text = get(base + "/metrics")
    assert status == 200
    drafts = metric_total(text, "vllm:spec_decode_num_draft_tokens")
    assert drafts > 0, f"{name}: no draft tokens were verified; log:\n" + log_path.read_text()[-3000:]
