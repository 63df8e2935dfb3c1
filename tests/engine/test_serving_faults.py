"""A vspec server under mixed load, client faults and SIGTERM (issue 25).

One vspec server started the way a user starts it (`vllm-vspec serve
--preset tiny-draft`, the launcher's defaults, so its shutdown timeout) and
one target-only server (bench/server.py), started side by side
(conftest.started). Then:

1. load: 64 concurrent mixed requests (completions and chat, streaming and
   not, sampled, logprobs, stop strings, n=2, an over-long prompt) on both:
   every temperature-0 answer of the vspec server equals the target-only
   server's, the over-long prompt gets a clean 400 from both, and the vspec
   server's `vspec:committed_tokens_total` grew by the completion tokens its
   clients were told (usage), plus at most K a request that a stop string
   cut inside a multi-token step (the frontend drops those after the stop),
   and vLLM verified draft tokens (the preset really speculates);
2. faults: streaming clients hang up mid-answer beside complete requests;
   those still equal target-only, and later requests too; and `vllm-vspec
   bench`'s protocol client completes every request on the target-only
   server (a server of the kind bench starts);
3. SIGTERM with requests in flight (last: it stops the server), what a
   supervisor relies on (docs/lifecycle.md): every request got a complete
   answer or, only when the drain used its whole window, a clean
   finish_reason; the launcher exited with status 0 within the drain
   window and left no process of the server's group; the log has the
   `vspec summary` line and no traceback.

Loopback only, bounded loops (every wait has a deadline).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time

import httpx
import pytest

from conftest import DRAFT, REPO, TARGET, load_prompts, run_command, started
from vllm_vspec.bench.scrape import parse_metrics
from vllm_vspec.bench.server import SERVED_MODEL_NAME, Server, ServerSpec, free_port, serve_argv
from vllm_vspec.launch import presets, supervisor

PRESET = "tiny-draft"
VSPEC_MODEL = "tiny-draft"       # the preset's served_model_name
MAX_TOKENS = 24
CLEAN_FINISH = {"stop", "length", "abort"}
# 32 requests of this many tokens: long enough that SIGTERM lands mid-answer,
# short enough that the drain fits the launcher's 30 s window with room on a
# loaded host (300 tokens took 7 s to drain at load 3-4 on the 2-core host,
# longer under heavier load).
SIGTERM_TOKENS = 192


def _two_ports() -> tuple[int, int]:
    """Two distinct free ports: free_port() closes its socket, so two calls
    in a row may hand out the same one."""
    vport = free_port()
    for _ in range(20):
        if (tport := free_port()) != vport:
            return vport, tport
    raise RuntimeError(f"free_port() returned port {vport} 20 times in a row")


pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """The vspec server and the target-only one, started side by side. They
    run as a user runs them, vLLM's engine core in its own process (conftest
    turns that off for the in-process engine tests); the drain on SIGTERM is that process's busy
    loop (vllm/v1/engine/core.py, EngineCore._handle_shutdown), which an
    in-process engine never runs."""
    tmp_path = tmp_path_factory.mktemp("serving_faults")
    vport, tport = _two_ports()
    own_core = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    vspec = Server([sys.executable, "-m", "vllm_vspec.cli", "serve", "--preset", PRESET,
                    "--port", str(vport), "--", "--host", "127.0.0.1"],
                   vport, tmp_path / "vspec.log", env=own_core)
    preset = presets.load(presets.preset_path(PRESET))
    spec = ServerSpec(model=TARGET, max_model_len=preset.launch.max_model_len,
                      max_num_seqs=preset.launch.max_num_seqs,
                      kv_cache_memory_bytes=preset.launch.kv_cache_memory_bytes,
                      enforce_eager=True)
    target = Server(serve_argv(spec, [], tport), tport, tmp_path / "target.log",
                    env=own_core)
    with started(vspec, target):
        yield vspec, target


def _requests() -> list[dict]:
    """64 requests: (kind, body, compare?) with temperature 0 unless sampled."""
    prompts = (load_prompts("code", 24) + load_prompts("prose", 24)) * 2
    out = []
    for i in range(64):
        p = prompts[i][:400]
        body: dict = {"max_tokens": MAX_TOKENS, "temperature": 0.0}
        kind = ("completions", "chat")[i % 2]
        if kind == "completions":
            body["prompt"] = p
        else:
            body["messages"] = [{"role": "user", "content": p}]
        # Each feature on 8 requests: both kinds, streaming and not.
        j = i // 2
        stream, feature = j % 2 == 1, (j // 2) % 8
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if feature == 1:
            body.update(temperature=0.8, seed=i)        # sampled: not compared
        if feature == 2 and kind == "completions":
            body["logprobs"] = 2
        if feature == 2 and kind == "chat":
            body.update(logprobs=True, top_logprobs=2)
        if feature == 3:
            body["stop"] = ["\n\n", " the "]
        if feature == 4 and not stream:
            body.update(n=2, temperature=0.7, seed=i)   # vLLM: n > 1 only when sampled
        out.append({"kind": kind, "body": body, "exact": body["temperature"] == 0.0})
    long_prompt = " ".join(["word"] * 4000)        # beyond max_model_len 512: a clean 400
    out.append({"kind": "completions", "body": {"prompt": long_prompt, "max_tokens": 8,
                                                "temperature": 0.0}, "exact": True})
    return out


async def _send(client: httpx.AsyncClient, model: str, req: dict,
                hang_up_after: int | None = None) -> dict:
    """{"status", "texts" (one per choice), "finish" (per choice), "tokens"
    (usage.completion_tokens, 0 for an error), "logprobs"}. With
    `hang_up_after` the client closes a stream after that many chunks."""
    body = {**req["body"], "model": model}
    path = "/v1/completions" if req["kind"] == "completions" else "/v1/chat/completions"
    if not body.get("stream"):
        r = await client.post(path, json=body)
        if r.status_code != 200:
            return {"status": r.status_code, "texts": [], "finish": [], "tokens": 0,
                    "logprobs": None, "error": r.text}
        data = r.json()
        choices = sorted(data["choices"], key=lambda c: c["index"])
        texts = [c["text"] if "text" in c else c["message"]["content"] for c in choices]
        logprobs = [c.get("logprobs") for c in choices]
        return {"status": 200, "texts": texts, "finish": [c["finish_reason"] for c in choices],
                "tokens": data["usage"]["completion_tokens"], "logprobs": logprobs}
    text, finish, tokens, chunks = "", None, 0, 0
    async with client.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            return {"status": r.status_code, "texts": [], "finish": [], "tokens": 0,
                    "logprobs": None, "error": (await r.aread()).decode()}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            for c in event.get("choices", []):
                text += c.get("text") or (c.get("delta") or {}).get("content") or ""
                finish = c.get("finish_reason") or finish
            chunks += 1
            if hang_up_after is not None and chunks >= hang_up_after:
                return {"status": 200, "texts": [text], "finish": [None], "tokens": None,
                        "logprobs": None, "hung_up": True}
    return {"status": 200, "texts": [text], "finish": [finish], "tokens": tokens,
            "logprobs": None}


async def _send_all(base_url: str, model: str, reqs: list[dict],
                    hang_ups: dict[int, int] | None = None) -> list[dict]:
    limits = httpx.Limits(max_connections=len(reqs) + 8)
    async with httpx.AsyncClient(base_url=base_url, timeout=300.0, limits=limits) as client:
        return await asyncio.gather(*(_send(client, model, r, (hang_ups or {}).get(i))
                                      for i, r in enumerate(reqs)))


def _counter(base_url: str, name: str) -> float:
    page = httpx.get(f"{base_url}/metrics", timeout=10.0).text
    return sum(v for n, _, v in parse_metrics(page) if n == name)


def _committed(base_url: str) -> float:
    return _counter(base_url, "vspec:committed_tokens_total")


def _differences(reqs, got, want) -> list[str]:
    out = []
    for i, (r, g, w) in enumerate(zip(reqs, got, want)):
        if g["status"] != w["status"]:
            out.append(f"{i}: status {g['status']} vs target-only {w['status']}")
        elif r["exact"] and (g["texts"], g["finish"]) != (w["texts"], w["finish"]):
            out.append(f"{i} ({r['kind']}): {g['texts']!r} {g['finish']} vs "
                       f"target-only {w['texts']!r} {w['finish']}")
    return out


UNWRITABLE = "/proc/vspec-nosuch/trace.jsonl"


def test_plain_vllm_serve_refuses_an_unwritable_trace_path_before_loading_the_model():
    """The plain-vLLM route (no launcher): vspec's model runner resolves the
    settings in its __init__, before vLLM loads any weights."""
    from vllm_vspec.hosts import wiring

    spec = ServerSpec(model=TARGET, max_model_len=256, max_num_seqs=4,
                      kv_cache_memory_bytes=16 << 20, enforce_eager=True)
    out = run_command(serve_argv(spec, wiring.serve_argv(wiring.engine_args(
        {"method": "draft_model", "model": str(DRAFT),
         "num_speculative_tokens": 4}, {"trace_path": UNWRITABLE}, platform="cpu")), free_port()),
        timeout_s=300)
    log = out.stdout + out.stderr
    assert out.returncode != 0, log[-3000:]
    assert f"vspec.trace_path={UNWRITABLE!r} is not allowed" in log, log[-3000:]
    assert "Starting to load model" not in log, log[-3000:]
    print(f"plain vllm serve refused the setting after {out.seconds:.1f} s")


def _log_has_no_traceback(server: Server) -> None:
    log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log, server.log_tail(60)


def test_64_mixed_concurrent_requests_equal_target_only_and_the_metrics_count(servers):
    vspec, target = servers
    reqs = _requests()
    before = _committed(vspec.base_url)
    got = asyncio.run(_send_all(vspec.base_url, VSPEC_MODEL, reqs))
    told = sum(g["tokens"] for g in got)
    # The API server records a step's stats right after handing its outputs
    # to the responses: poll (bounded) for the last step to be counted.
    deadline = time.monotonic() + 10
    while (after := _committed(vspec.base_url)) - before < told and time.monotonic() < deadline:
        time.sleep(0.2)
    want = asyncio.run(_send_all(target.base_url, SERVED_MODEL_NAME, reqs))
    assert not _differences(reqs, got, want), "\n".join(_differences(reqs, got, want)[:8])
    assert got[-1]["status"] == 400 and want[-1]["status"] == 400, got[-1]   # over-long
    assert all(g["status"] == 200 for g in got[:-1])
    assert all(f in CLEAN_FINISH for g in got[:-1] for f in g["finish"]), [g["finish"] for g in got]
    # Top logprob tokens agree too (their values may differ in the last digits).
    for r, g, w in zip(reqs, got, want):
        if r["exact"] and g["logprobs"] and g["logprobs"][0]:
            gl, wl = g["logprobs"][0], w["logprobs"][0]
            key = "tokens" if "tokens" in gl else "content"
            g_tok = gl[key] if key == "tokens" else [t["token"] for t in gl[key]]
            w_tok = wl[key] if key == "tokens" else [t["token"] for t in wl[key]]
            assert g_tok == w_tok
    # Equal, but for stop strings: a step commits up to 1 + K tokens, and
    # when a stop string ends within them vLLM's frontend drops the tokens
    # after it from the answer (and its usage) though the engine committed
    # them; a request can have at most K such tokens.
    k = presets.load(presets.preset_path(PRESET)).launch.gamma
    cut = sum(len(g["texts"]) for r, g in zip(reqs, got) if "stop" in r["body"])
    assert told <= after - before <= told + k * cut, (after - before, told, cut)
    assert _counter(vspec.base_url, "vllm:spec_decode_num_draft_tokens_total") > 0, (
        "the tiny-draft preset verified no draft token")
    _log_has_no_traceback(vspec)


def test_clients_hanging_up_mid_stream_leave_every_other_answer_exact(servers):
    vspec, target = servers
    base = [r for r in _requests()[:-1] if r["exact"]][:24]
    # The clients hang up after 2-4 chunks: ignore_eos keeps every such
    # stream at least 64 tokens long (13+ chunks at 1 + K = 5 tokens a step),
    # so each hangs up mid-answer whatever the answer and the step sizes
    # (base[:8] has no stop strings).
    streaming = [{**r, "body": {**r["body"], "stream": True, "max_tokens": 64,
                                "ignore_eos": True,
                                "stream_options": {"include_usage": True}}} for r in base[:8]]
    assert not any("stop" in r["body"] for r in streaming)
    reqs = streaming + base[8:]
    hang_ups = {i: 2 + i % 3 for i in range(len(streaming))}
    got = asyncio.run(_send_all(vspec.base_url, VSPEC_MODEL, reqs, hang_ups))
    assert all(g.get("hung_up") for g in got[:len(streaming)]), got[:len(streaming)]
    want = asyncio.run(_send_all(target.base_url, SERVED_MODEL_NAME, reqs[len(streaming):]))
    rest = reqs[len(streaming):]
    assert not _differences(rest, got[len(streaming):], want)
    # The server is still whole: the same requests again, all exact.
    again = asyncio.run(_send_all(vspec.base_url, VSPEC_MODEL, base))
    want_all = asyncio.run(_send_all(target.base_url, SERVED_MODEL_NAME, base))
    assert not _differences(base, again, want_all)
    _log_has_no_traceback(vspec)


# Last in this module: it stops the vspec server.
def test_the_bench_protocol_client_completes_every_request_on_the_target_server(servers):
    """`vllm-vspec bench`'s protocol client (arc-easy, 4 requests of 8 tokens,
    2 at a time) against a real server of the kind bench starts
    (bench.server.serve_argv): every request completes with its tokens."""
    from vllm_vspec.bench import protocols, workloads

    _, target = servers
    prompts = workloads.load_prompts(REPO / "models" / "prompts" / "code.jsonl")
    result = protocols.run_protocol_sync(protocols.PROTOCOLS["arc-easy"], target.base_url,
                                         protocols.fixed_count(prompts, 4, 8), 8, 2)
    assert (result["completed"], result["failed"], result["total_output_tokens"]) == (4, 0, 32)


def test_sigterm_with_requests_in_flight_drains_and_exits_with_the_summary(servers):
    vspec, _ = servers
    # 32 requests: two batches of the preset's 16, SIGTERM_TOKENS each.
    prompts = load_prompts("prose", 16) * 2
    reqs = [{"kind": "completions", "exact": False,
             "body": {"prompt": p[:200], "max_tokens": SIGTERM_TOKENS, "temperature": 0.0,
                      "ignore_eos": True, "stream": True,
                      "stream_options": {"include_usage": True}}} for p in prompts]

    async def run() -> tuple[list[dict], float]:
        # one connection per request plus room for the /metrics polls below
        limits = httpx.Limits(max_connections=len(reqs) + 4)
        async with httpx.AsyncClient(base_url=vspec.base_url, timeout=120.0,
                                     limits=limits) as client:
            tasks = [asyncio.create_task(_send(client, VSPEC_MODEL, r)) for r in reqs]
            # Wait (bounded) until the engine holds every request (running or
            # waiting) and runs some, then SIGTERM the server: all of them are
            # in flight, none is still on its way in.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                page = (await client.get("/metrics")).text
                gauges = {n: 0.0 for n in ("vllm:num_requests_running",
                                           "vllm:num_requests_waiting")}
                for name, _, v in parse_metrics(page):
                    if name in gauges:
                        gauges[name] += v
                running, waiting = gauges.values()
                # Requests already answered count as held: on a slow host the
                # first may finish before the last has arrived (the drain of
                # the rest is still what is tested; all 32 are checked below).
                answered = sum(t.done() for t in tasks)
                if running >= 1 and running + waiting + answered >= len(reqs):
                    break
                if answered == len(reqs):
                    break   # nothing left in flight: the checks below say so
                await asyncio.sleep(0.05)
            else:
                done = [t.exception() or t.result() for t in tasks if t.done()]
                pytest.fail(f"the engine did not hold all {len(reqs)} requests within 60 s "
                            f"(running {running}, waiting {waiting}, answered {len(done)}; "
                            f"first answers: {done[:2]!r}); log {vspec.log_path}:\n"
                            + vspec.log_tail(40))
            if answered == len(reqs):
                pytest.fail(f"all {len(reqs)} requests were answered before SIGTERM could be "
                            f"sent (running {running}, waiting {waiting}): the drain was not "
                            f"exercised; log {vspec.log_path}:\n" + vspec.log_tail(40))
            os.kill(vspec.proc.pid, signal.SIGTERM)
            sent = time.monotonic()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            return results, sent

    pgid = _server_pgid(vspec)
    results, sent = asyncio.run(run())
    timeout = presets.LaunchConfig.shutdown_timeout
    try:
        vspec.proc.wait(timeout=timeout + 30)
    except Exception:  # noqa: BLE001 - reported as the failure it is
        pytest.fail(f"the server did not exit within {timeout + 30} s of SIGTERM:\n"
                    + vspec.log_tail(40))
    exited_after = time.monotonic() - sent
    log = vspec.log_path.read_text(errors="replace")
    where = (f"exit {exited_after:.1f} s after SIGTERM, drain "
             f"{_drain_seconds(log.splitlines())} s of the {timeout} s window; "
             f"log {vspec.log_path}:\n{vspec.log_tail(40)}")
    assert vspec.proc.returncode == 0, where
    broken = [r for r in results if isinstance(r, BaseException)]
    assert not broken, f"requests without an answer: {broken[:3]}\n{where}"
    for r in results:
        assert r["status"] == 200 and r["finish"][0] in CLEAN_FINISH, f"{r}\n{where}"
        # Cut short only by the end of the window: a drain that ended
        # earlier answered every request in full.
        if r["finish"][0] != "abort" or exited_after < timeout:
            assert r["tokens"] == SIGTERM_TOKENS, f"{r}\n{where}"
    assert sum("vspec summary:" in line for line in log.splitlines()) == 1, vspec.log_tail(40)
    # No traceback while serving, draining or tearing down (the host's
    # output-handler race at teardown is one INFO line: hosts/vllm/shutdown_log).
    assert "Traceback" not in log, vspec.log_tail(60)
    assert exited_after < timeout + 30
    left = supervisor.group_members(pgid)
    assert not left, f"processes of the server's group {pgid} left: {left}\n{where}"
    lines = log.splitlines()
    finishes = {f: sum(r["finish"][0] == f for r in results) for f in CLEAN_FINISH}
    print(f"SIGTERM -> exit {exited_after:.1f} s, drain {_drain_seconds(lines)} s of the "
          f"{timeout} s window; finish reasons {finishes}")


def _server_pgid(server: Server) -> int:
    """The process group of the launcher's API server (its own session),
    from the launcher's "server pid" line."""
    m = re.search(r"vllm-vspec serve: server pid (\d+)", server.log_path.read_text(errors="replace"))
    assert m, f"no server pid line in {server.log_path}:\n" + server.log_tail(40)
    return int(m.group(1))


def _drain_seconds(lines: list[str]) -> int | None:
    """Seconds (log-stamp resolution) from the engine core's drain start to
    its 'request processing complete' line, None if either is missing."""
    def stamp(marker: str) -> int | None:
        for line in lines:
            if marker in line:
                m = re.search(r" (\d\d):(\d\d):(\d\d) ", line)
                if m:
                    h, mi, se = map(int, m.groups())
                    return h * 3600 + mi * 60 + se
        return None
    start = stamp("[shutdown] EngineCore: start mode=drain")
    end = stamp("[shutdown] EngineCore: request processing complete")
    return None if start is None or end is None else (end - start) % 86400
