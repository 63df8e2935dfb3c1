"""Async OpenAI-API clients that replay a workload against one server.

Every request is greedy (temperature 0) with its own fixed output length
(`ignore_eos`), so all variants generate the same number of tokens and the
same text when decoding is exact. Requests are sent as fast as the phase's
concurrency allows (unlimited request rate).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable

import httpx

from vllm_vspec.bench.workloads import Request


@dataclass(frozen=True)
class Completion:
    key: str
    start: float  # wall clock (time.time), comparable with the decision trace
    end: float
    tokens: int  # completion tokens reported by the server
    text: str
    error: str | None = None


def completion_body(model: str, prompt: str, output_len: int) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": output_len,
            "temperature": 0.0, "ignore_eos": True}


async def _one(client: httpx.AsyncClient, url: str, model: str, req: Request) -> Completion:
    start = time.time()
    try:
        resp = await client.post(url, json=completion_body(model, req.prompt, req.output_len))
        resp.raise_for_status()
        body = resp.json()
        return Completion(req.key, start, time.time(), int(body["usage"]["completion_tokens"]),
                          body["choices"][0]["text"])
    except (httpx.HTTPError, KeyError, ValueError) as e:
        return Completion(req.key, start, time.time(), 0, "", f"{type(e).__name__}: {e}")


async def run_phase(client: httpx.AsyncClient, base_url: str, model: str,
                    requests: list[Request], concurrency: int,
                    on_done: Callable[[Completion], None] = lambda c: None,
                    ) -> list[Completion]:
    """Send `requests` with at most `concurrency` in flight; results in request order."""
    url = f"{base_url}/v1/completions"
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(requests)):
        queue.put_nowait(i)
    results: list[Completion | None] = [None] * len(requests)

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            results[i] = await _one(client, url, model, requests[i])
            on_done(results[i])

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(requests)))))
    return [r for r in results if r is not None]


# Idle connections are dropped by the client before the server closes them
# (vLLM's API server: 5 s, VLLM_HTTP_TIMEOUT_KEEP_ALIVE). With both at 5 s
# (httpx's default), a request sent on a connection the server was closing
# at that moment failed with ReadError: a bursty run's first request after a
# 5 s low-concurrency phase did.
KEEPALIVE_EXPIRY_S = 2.0


def client_for(concurrency: int, timeout_s: float = 1800.0) -> httpx.AsyncClient:
    """One connection per in-flight request; CPU steps are slow, so a long timeout."""
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency,
                          keepalive_expiry=KEEPALIVE_EXPIRY_S)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s))
