"""vSpec Adaptive behind `vllm serve`'s OpenAI API, under concurrent load.

Spec: 64 concurrent greedy completions against a server running the online
policy all complete, and each equals target-only decoding of its prompt; the
server's /metrics carries the vspec metrics.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from conftest import DRAFT, TARGET, close_llm, load_prompts, make_llm
from vllm_vspec.bench.server import SERVED_MODEL_NAME, Server, ServerSpec, free_port, serve_argv
from vllm_vspec.bench.variants import Variant

pytestmark = pytest.mark.engine

MAX_TOKENS = 32
ONLINE = Variant("online", "online",
                 {"method": "draft_model", "model": str(DRAFT), "num_speculative_tokens": 4},
                 vspec={"policy": "online", "min_gamma": 0})


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    both = load_prompts("code", 32) + load_prompts("prose", 32)
    return (both * 2)[:64]


@pytest.fixture(scope="module")
def reference(prompts) -> list[str]:
    from vllm import SamplingParams

    llm = make_llm(max_num_seqs=64)
    try:
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS,
                                                    ignore_eos=True), use_tqdm=False)
        return [o.outputs[0].text for o in outs]
    finally:
        close_llm(llm)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    spec = ServerSpec(model=TARGET, max_num_seqs=64, max_model_len=512,
                      kv_cache_memory_bytes=256 << 20)
    log = tmp_path_factory.mktemp("serve") / "server.log"
    with Server(serve_argv(spec, ONLINE.serve_args(), port), port, log) as srv:
        yield srv


async def _complete_all(base_url: str, prompts: list[str]) -> list[str]:
    async with httpx.AsyncClient(base_url=base_url, timeout=600.0) as client:
        async def one(prompt: str) -> str:
            r = await client.post("/v1/completions", json={
                "model": SERVED_MODEL_NAME, "prompt": prompt, "max_tokens": MAX_TOKENS,
                "temperature": 0.0, "ignore_eos": True})
            r.raise_for_status()
            return r.json()["choices"][0]["text"]
        return await asyncio.gather(*(one(p) for p in prompts))


def test_64_concurrent_requests_complete_and_equal_target_only(server, prompts, reference):
    got = asyncio.run(_complete_all(server.base_url, prompts))
    differing = [(i, g, w) for i, (g, w) in enumerate(zip(got, reference)) if g != w]
    assert len(got) == 64
    assert not differing, "requests differing from target-only:\n" + "\n".join(
        f"  {i}: got {g!r}\n      want {w!r}" for i, g, w in differing[:5])


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
