"""vSpec Adaptive behind `vllm serve`'s OpenAI API, under concurrent load.

Spec: 64 concurrent greedy completions (the session's 16 prompts, four
times each) against a server running the online policy all complete, and
each returns the token ids of target-only decoding of its prompt (the
session's `reference`); the server's /metrics carries the vspec metrics.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from conftest import DRAFT, MAX_TOKENS, TARGET, assert_same_tokens
from vllm_vspec.bench.server import SERVED_MODEL_NAME, Server, ServerSpec, free_port, serve_argv
from vllm_vspec.bench.variants import Variant

ONLINE = Variant("online", "online",
                 {"method": "draft_model", "model": str(DRAFT), "num_speculative_tokens": 4},
                 vspec={"policy": "online", "min_gamma": 0})
COPIES = 4      # 64 concurrent requests of the 16 prompts


pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The compiled online-policy server."""
    port = free_port()
    spec = ServerSpec(model=TARGET, max_num_seqs=64, max_model_len=512,
                      kv_cache_memory_bytes=256 << 20)
    with Server(serve_argv(spec, ONLINE.serve_args(), port), port,
                tmp_path_factory.mktemp("adaptive_serving") / "server.log") as srv:
        yield srv


async def _complete_all(base_url: str, prompts: list[str]) -> list[list[int]]:
    """The generated token ids of each prompt's greedy completion."""
    async with httpx.AsyncClient(base_url=base_url, timeout=600.0) as client:
        async def one(prompt: str) -> list[int]:
            r = await client.post("/v1/completions", json={
                "model": SERVED_MODEL_NAME, "prompt": prompt, "max_tokens": MAX_TOKENS,
                "temperature": 0.0, "ignore_eos": True, "return_token_ids": True})
            r.raise_for_status()
            return r.json()["choices"][0]["token_ids"]
        return await asyncio.gather(*(one(p) for p in prompts))


def test_64_concurrent_requests_complete_and_equal_target_only(server, prompts, reference):
    got = asyncio.run(_complete_all(server.base_url, prompts * COPIES))
    assert len(got) == 64
    assert_same_tokens(got, reference * COPIES, "online policy behind vllm serve, 64 concurrent")


def test_metrics_endpoint_exports_vspec_gamma_counts(server, prompts):
    asyncio.run(_complete_all(server.base_url, prompts[:8]))
    text = httpx.get(f"{server.base_url}/metrics", timeout=10.0).text
    assert "vspec:steps_total" in text and "vspec:gamma" in text, (
        "vspec metrics missing from /metrics")


# Last in this module: it stops the module's server.
def test_stopping_the_server_logs_the_vspec_summary_line(server, prompts):
    asyncio.run(_complete_all(server.base_url, prompts[:2]))
    server.stop()
    log = server.log_path.read_text(errors="replace")
    lines = [line for line in log.splitlines() if "vspec summary:" in line]
    assert len(lines) == 1, "summary lines in the server log:\n" + "\n".join(
        lines or log.splitlines()[-20:])
    assert "steps_per_gamma=" in lines[0], lines[0]
