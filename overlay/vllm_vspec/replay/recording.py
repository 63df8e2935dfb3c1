"""A recording: per request its token stream and, per decode position, the
drafter's acceptance run a_K (see the package docstring). No vLLM import.

Positions: the prefill step commits the first output token; decode position
d (0-based) is the (d+1)-th decode step's start, after d + 1 output tokens,
so a request of L output tokens has L - 1 decode positions. `accept[d]` is
how many tokens of the K-token chain drafted from prompt + output[:d + 1]
match output[d + 1:]; a step there at gamma g accepts min(g, accept[d]).
Where the drafter has them, `draft_probs[d]` holds the drafter's
probability of each token of that K-token chain (slot j: the token it
proposed j + 1 positions after the prefix), what policy `budget` ranks.

File: gzip'd JSON, one header (what made it: models, method, K, versions,
settings) and one object per request. A request's draft probabilities are
quantised to 1/255 (PROBS_ENCODING: one byte per slot, position-major,
base64); the header names the encoding, and a recording without them
(the field absent) loads all the same, with `draft_probs` None. Loading
checks the schema and names the file and field that is wrong.
"""

from __future__ import annotations

import base64
import gzip
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

SCHEMA = 1
# How a request's draft probabilities are stored: byte b per slot is the
# probability b / 255 (a probability rounds to the nearest step).
PROBS_ENCODING = "uint8/255"
PROBS_STEPS = 255


def quantised(p: float) -> float:
    """`p` on the file's 1/255 grid (what saving and loading keep exactly)."""
    return round(min(max(float(p), 0.0), 1.0) * PROBS_STEPS) / PROBS_STEPS


def encode_probs(rows: Sequence[Sequence[float]]) -> str:
    return base64.b64encode(bytes(round(quantised(p) * PROBS_STEPS)
                                  for row in rows for p in row)).decode("ascii")


def decode_probs(text: str, k: int) -> tuple[tuple[float, ...], ...]:
    raw = base64.b64decode(text.encode("ascii"), validate=True)
    if len(raw) % k:
        raise ValueError(f"{len(raw)} bytes is not a multiple of K={k}")
    return tuple(tuple(b / PROBS_STEPS for b in raw[i:i + k]) for i in range(0, len(raw), k))


class RecordingError(ValueError):
    """A recording file that cannot be used (names the file and the field)."""


@dataclass(frozen=True)
class RecordedRequest:
    key: str                       # "<family>/<index in its prompt file>"
    family: str
    prompt: tuple[int, ...]        # the prompt's token ids
    output: tuple[int, ...]        # the target's greedy output token ids
    accept: tuple[int, ...]        # a_K per decode position (len(output) - 1 values)
    # Decode positions whose probe disagreed with the stream (its prefill
    # token differed: a float near-tie between prefill and decode numerics);
    # their accept value is the probe's all the same.
    disagree: tuple[int, ...] = ()
    # Per decode position, the drafter's probability of each of the K chain
    # tokens drafted there (on the 1/255 grid); None: not recorded (a
    # drafter without them, or a recording made before they were).
    draft_probs: tuple[tuple[float, ...], ...] | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def decode_len(self) -> int:
        """Tokens committed by decode steps (the prefill step commits one)."""
        return len(self.output) - 1

    def rates(self, k: int) -> tuple[float, ...]:
        """Conditional acceptance per draft position over this request's positions."""
        return conditional_rates(self.accept, k)


def conditional_rates(accepts: Sequence[int], k: int) -> tuple[float, ...]:
    """Per draft position 1..k, P(a >= j | a >= j - 1) over acceptance runs
    `accepts`; a position never reached is 0."""
    reach = [sum(1 for a in accepts if a >= j) for j in range(k + 1)]
    return tuple(reach[j] / reach[j - 1] if reach[j - 1] else 0.0 for j in range(1, k + 1))


@dataclass
class Recording:
    header: dict[str, Any]
    requests: list[RecordedRequest] = field(default_factory=list)

    @property
    def k(self) -> int:
        return int(self.header["num_speculative_tokens"])

    def families(self) -> dict[str, list[RecordedRequest]]:
        out: dict[str, list[RecordedRequest]] = {}
        for r in self.requests:
            out.setdefault(r.family, []).append(r)
        return out

    @property
    def missing_draft_probs(self) -> str | None:
        """Why this recording has no draft probabilities (None: every
        request has them)."""
        if all(r.draft_probs is not None for r in self.requests):
            return None
        method = self.header.get("method")
        return (f"the recording has no draft probabilities (recorded {self.header.get('recorded', '?')}"
                f" for {method}: a drafter without them, or recorded before they were; record "
                f"it again with `vllm-vspec replay record --method {method}`)")

    def mean_rates(self) -> tuple[float, ...]:
        """Conditional acceptance per position over every decode position."""
        return conditional_rates([a for r in self.requests for a in r.accept], self.k)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        header = dict(self.header)
        if any(r.draft_probs is not None for r in self.requests):
            header["draft_probs"] = PROBS_ENCODING
        body = {"schema": SCHEMA, "header": header, "requests": [_request_json(r)
                                                                  for r in self.requests]}
        # mtime 0: the same recording writes the same bytes.
        with open(path, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as f:
            f.write(json.dumps(body, separators=(",", ":")).encode())
        return path


def _request_json(r: RecordedRequest) -> dict:
    out = {**asdict(r), "prompt": list(r.prompt), "output": list(r.output),
           "accept": list(r.accept), "disagree": list(r.disagree)}
    out.pop("draft_probs")
    if r.draft_probs is not None:
        out["draft_probs"] = encode_probs(r.draft_probs)
    return out


REQUIRED_HEADER = ("method", "target", "num_speculative_tokens")


def load(path: str | Path) -> Recording:
    path = Path(path)
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            body = json.load(f)
    except FileNotFoundError:
        raise RecordingError(f"recording {path}: no such file (write one with "
                             f"`vllm-vspec replay record`)") from None
    except (OSError, EOFError, ValueError) as exc:
        raise RecordingError(f"recording {path}: not a gzip'd JSON recording ({exc})") from None
    if not isinstance(body, dict) or body.get("schema") != SCHEMA:
        raise RecordingError(f"recording {path}: schema {body.get('schema') if isinstance(body, dict) else None!r}"
                             f" is not allowed: this version reads schema {SCHEMA}")
    header = body.get("header")
    missing = [k for k in REQUIRED_HEADER if not isinstance(header, dict) or k not in header]
    if missing:
        raise RecordingError(f"recording {path}: header lacks {', '.join(missing)}")
    k = int(header["num_speculative_tokens"])
    encoding = header.get("draft_probs", PROBS_ENCODING)
    if encoding != PROBS_ENCODING:
        raise RecordingError(f"recording {path}: header draft_probs={encoding!r} is not allowed: "
                             f"this version reads {PROBS_ENCODING!r}")
    requests = []
    for i, r in enumerate(body.get("requests") or []):
        try:
            req = RecordedRequest(str(r["key"]), str(r["family"]), tuple(int(t) for t in r["prompt"]),
                                  tuple(int(t) for t in r["output"]),
                                  tuple(int(a) for a in r["accept"]),
                                  tuple(int(d) for d in r.get("disagree", ())),
                                  decode_probs(r["draft_probs"], k) if "draft_probs" in r else None)
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordingError(f"recording {path}: request {i} is malformed ({exc!r})") from None
        if len(req.accept) != req.decode_len or any(not 0 <= a <= k for a in req.accept):
            raise RecordingError(f"recording {path}: request {req.key}: `accept` must hold "
                                 f"len(output) - 1 = {req.decode_len} values in [0, {k}]")
        if req.draft_probs is not None and len(req.draft_probs) != req.decode_len:
            raise RecordingError(f"recording {path}: request {req.key}: `draft_probs` must hold "
                                 f"len(output) - 1 = {req.decode_len} rows of K={k} "
                                 f"probabilities, not {len(req.draft_probs)}")
        requests.append(req)
    if not requests:
        raise RecordingError(f"recording {path}: no requests")
    return Recording(header, requests)


def predicted_accepts(request: RecordedRequest, start: int, gammas: Sequence[int]) -> list[int]:
    """What a request accepts step by step from decode position `start` when
    its verified drafts have the lengths `gammas` (each step commits
    accepted + 1 tokens). Stops at the end of the stream."""
    out, d = [], start
    for g in gammas:
        if d >= request.decode_len:
            break
        a = min(g, request.accept[d], request.decode_len - d - 1)
        out.append(a)
        d += a + 1
    return out
