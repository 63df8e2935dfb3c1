"""`vllm-vspec serve --preset tiny-*` really serves on CPU: one server per
preset, started through the launcher as a subprocess on a free localhost
port, waited for on /health, stopped at the module's teardown. The
tiny-draft preset's server is test_serving_faults.py's (the same command):
it answers chat completions there and really speculates."""

from __future__ import annotations

import json
import re
import sys
import urllib.error
import urllib.request

import pytest

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
                 port, tmp_path_factory.mktemp("serve") / f"{request.param}.log")
    with srv:
        yield request.param, srv.base_url, srv.log_path
        srv.stop(grace_s=0)   # its whole process group at once: no test reads its shutdown


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
