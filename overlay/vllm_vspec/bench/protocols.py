"""Serving protocols of the seed project (ARC-Easy and GSM8K style) against
an already-running server: a fixed prompt count from a local JSONL dataset,
a fixed output length, unlimited request rate, temperature 0, and B16 / B128
(at most that many requests in flight).

Dataset lines are JSON objects. A string `prompt` (the materialized form, as
`vllm bench serve --dataset-name custom` reads) is used as is; otherwise the
protocol builds the prompt from the raw record (ARC: `question` and
`choices`; GSM8K: `question`).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import httpx

from vllm_vspec.bench.loadgen import Completion, client_for, run_phase
from vllm_vspec.bench.workloads import Request


def _arc_prompt(record: dict[str, Any]) -> str:
    """ARC record (question text or {stem, choices}, choices {label, text} or a list)."""
    q = record["question"]
    stem, choices = (q["stem"], q["choices"]) if isinstance(q, dict) else (q, record["choices"])
    if isinstance(choices, dict):  # column form: {"label": [...], "text": [...]}
        choices = [{"label": l, "text": t} for l, t in zip(choices["label"], choices["text"])]
    options = "\n".join(f"{c['label']}. {c['text']}" for c in choices)
    return f"Question: {stem}\n{options}\nAnswer:"


def _gsm8k_prompt(record: dict[str, Any]) -> str:
    return f"Question: {record['question']}\nAnswer: Let's think step by step."


@dataclass(frozen=True)
class Protocol:
    name: str
    num_prompts: int
    output_len: int
    concurrency: int  # the B of B16 / B128
    prompt_of_record: Callable[[dict[str, Any]], str]


# ARC-Easy: the seed's engineering-regression protocol (200 prompts, 256
# output tokens, B16). GSM8K: the seed's B128 performance setting; its prompt
# count and output length are not given there, so the ARC figures are reused.
PROTOCOLS: dict[str, Protocol] = {
    "arc-easy": Protocol("arc-easy", 200, 256, 16, _arc_prompt),
    "gsm8k": Protocol("gsm8k", 200, 256, 128, _gsm8k_prompt),
}


def load_dataset(path: Path, protocol: Protocol) -> list[str]:
    """Prompts of a protocol dataset; a bad line fails naming file, line and why."""
    prompts = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                prompt = record.get("prompt")
                if not isinstance(prompt, str):
                    prompt = protocol.prompt_of_record(record)
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise ValueError(
                    f"{path}:{lineno}: not a {protocol.name} record: need a string `prompt` "
                    f"or the protocol's raw fields ({type(e).__name__}: {e})") from None
            prompts.append(prompt)
    if not prompts:
        raise ValueError(f"{path}: no records")
    return prompts


def fixed_count(prompts: list[str], n: int, output_len: int) -> list[Request]:
    """Exactly n requests: the first n prompts, wrapping around a smaller dataset."""
    return [Request(f"0/{i}", prompts[i % len(prompts)], output_len) for i in range(n)]


def summarize(completions: list[Completion], duration_s: float) -> dict[str, Any]:
    ok = [c for c in completions if not c.error]
    lat = sorted((c.end - c.start) * 1000 for c in ok)
    out_tokens = sum(c.tokens for c in ok)
    return {
        "completed": len(ok), "failed": len(completions) - len(ok),
        "total_output_tokens": out_tokens, "duration_s": duration_s,
        "output_throughput_tok_s": out_tokens / duration_s if duration_s > 0 else 0.0,
        "request_throughput_req_s": len(ok) / duration_s if duration_s > 0 else 0.0,
        "mean_latency_ms": statistics.fmean(lat) if lat else None,
        "median_latency_ms": statistics.median(lat) if lat else None,
        "p99_latency_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None,
    }


async def served_model(client: httpx.AsyncClient, base_url: str) -> str:
    resp = await client.get(f"{base_url}/v1/models")
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]


async def run_protocol(protocol: Protocol, base_url: str, requests: list[Request],
                       output_len: int, concurrency: int,
                       on_done: Callable[[Completion], None] = lambda c: None,
                       ) -> dict[str, Any]:
    async with client_for(concurrency) as client:
        model = await served_model(client, base_url)
        t0 = time.time()
        completions = await run_phase(client, base_url, model, requests, concurrency, on_done)
        duration = time.time() - t0
    return {"protocol": protocol.name, "base_url": base_url, "model": model,
            "num_prompts": len(requests), "output_len": output_len,
            "max_concurrency": concurrency, "request_rate": "inf", "temperature": 0.0,
            **summarize(completions, duration),
            "errors": [f"{c.key}: {c.error}" for c in completions if c.error][:10]}


def run_protocol_sync(*args, **kwargs) -> dict[str, Any]:
    return asyncio.run(run_protocol(*args, **kwargs))
