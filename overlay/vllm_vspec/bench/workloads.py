"""Request schedules: steady concurrency and bursts, over prompt families.

A workload is a sequence of phases; a phase sends `num_requests` prompts of
one family (a `<family>.jsonl` file of the prompts directory) with at most
`concurrency` in flight (unlimited request rate). The prompts and output
lengths each request gets are a pure function of the workload, so every
variant answers the same requests and outputs can be compared one by one.

Workloads are built per family (`build_workloads`) or written by the user
as `NAME=CONC:FAMILY:N[,CONC:FAMILY:N...]` (`parse_workload`).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path


# Completion tokens per request when the bench is not told otherwise: (lo, hi).
DEFAULT_OUTPUT_LEN = (64, 64)


@dataclass(frozen=True)
class Phase:
    concurrency: int
    family: str  # prompt family: a JSONL file name under the prompts directory
    num_requests: int


@dataclass(frozen=True)
class Request:
    key: str  # stable across variants: "<phase>/<index>"
    prompt: str
    output_len: int  # completion tokens (sent as max_tokens with ignore_eos)


@dataclass(frozen=True)
class Workload:
    name: str
    phases: tuple[Phase, ...]

    def requests(self, prompts: dict[str, list[str]],
                 output_len: tuple[int, int] = DEFAULT_OUTPUT_LEN) -> list[list[Request]]:
        """Per phase, the requests in send order. Prompts of a family are taken
        in file order and wrap around; repeated phases of a family continue
        where the previous one stopped so they do not replay the same text.
        Output lengths are uniform in [lo, hi] of `output_len`, drawn in send
        order from a generator seeded by the workload's name."""
        lo, hi = output_len
        lengths = random.Random(self.name)
        cursor = {family: 0 for family in prompts}
        out = []
        for p_idx, phase in enumerate(self.phases):
            pool = prompts[phase.family]
            start = cursor[phase.family]
            out.append([Request(f"{p_idx}/{i}", pool[(start + i) % len(pool)],
                                lengths.randint(lo, hi))
                        for i in range(phase.num_requests)])
            cursor[phase.family] = start + phase.num_requests
        return out

    @property
    def families(self) -> set[str]:
        return {p.family for p in self.phases}


def build_workloads(low: int = 1, high: int = 32, requests_low: int = 8,
                    requests_high: int = 64, families: tuple[str, ...] = ("code", "prose"),
                    ) -> dict[str, Workload]:
    """Steady low and high concurrency per prompt family, plus one bursty load
    alternating low and high phases over the families (half the requests of
    the steady loads per phase, so it costs about as much as one of them per
    family)."""
    workloads: dict[str, Workload] = {}
    for conc, n in ((low, requests_low), (high, requests_high)):
        for fam in families:
            name = f"steady-c{conc}-{fam}"
            workloads[name] = Workload(name, (Phase(conc, fam, n),))
    bursty = []
    for fam in families:
        bursty += [Phase(low, fam, max(1, requests_low // 2)),
                   Phase(high, fam, max(1, requests_high // 2))]
    workloads["bursty"] = Workload("bursty", tuple(bursty))
    return workloads


def parse_workload(text: str) -> Workload:
    """`NAME=CONC:FAMILY:N[,CONC:FAMILY:N...]`: a workload of the phases
    listed, in order (e.g. `mixed=1:csv:8,32:code:64,1:prose:8`)."""
    name, sep, spec = text.partition("=")
    form = "NAME=CONC:FAMILY:N[,CONC:FAMILY:N...], e.g. mixed=1:csv:8,32:code:64"
    if not sep or not name.strip() or not spec.strip():
        raise ValueError(f"workload {text!r} is not allowed: write {form}")
    phases = []
    for part in spec.split(","):
        fields = part.strip().split(":")
        conc = n = 0
        if len(fields) == 3 and fields[0].isdigit() and fields[2].isdigit():
            conc, n = int(fields[0]), int(fields[2])
        if conc < 1 or n < 1 or not fields[1]:
            raise ValueError(f"workload {text!r}: phase {part.strip()!r} is not allowed: "
                             f"CONC and N are positive integers, FAMILY a prompt file "
                             f"name; write {form}")
        phases.append(Phase(conc, fields[1], n))
    return Workload(name.strip(), tuple(phases))


def families_in(prompts_dir: Path) -> list[str]:
    """Every prompt family of a directory: the stems of its `*.jsonl` files."""
    return sorted(p.stem for p in Path(prompts_dir).glob("*.jsonl"))


def load_prompts(path: Path) -> list[str]:
    """Prompts of a JSONL file: one object per line with a string `prompt`."""
    prompts = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            record = json.loads(line)
            prompt = record.get("prompt") if isinstance(record, dict) else None
            if not isinstance(prompt, str) or not prompt:
                raise ValueError(f"{path}:{lineno}: `prompt` must be a non-empty string, "
                                 f"got {prompt!r}")
            prompts.append(prompt)
    if not prompts:
        raise ValueError(f"{path}: no prompts (expected JSONL lines with a `prompt` string)")
    return prompts
