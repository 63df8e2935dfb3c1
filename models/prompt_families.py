"""Prompt families for the prompt-robustness benchmark
(`vllm-vspec bench --prompts models/prompts/families --families all`).

Six families whose draft acceptance on the bundled pair differs clearly,
each PROMPTS_PER_FAMILY prompts, built only from files on this kind of
machine and the bundled tokenizer, deterministically (sorted inputs, one
seeded generator per family), so re-running this script rewrites the same
files:

  code         held-out Python stdlib windows (models/prompts/code.jsonl)
  prose        held-out licence/README windows (models/prompts/prose.jsonl)
  boilerplate  templated Python: dataclasses, argparse options and dispatch
               tables over service names from /etc/services
  csv          rows of /usr/share/distro-info/*.csv, /etc/services and
               /usr/share/zoneinfo/zone1970.tab as comma-separated values
  json         the same records as compact JSON objects, one per line
  random       uniformly random token ids of the bundled tokenizer, decoded

Usage (repository root): .venv/bin/python models/prompt_families.py
"""

from __future__ import annotations

import csv
import io
import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT_DIR = HERE / "prompts" / "families"
TOKENIZER = HERE / "tiny-target" / "tokenizer.json"
PROMPTS_PER_FAMILY = 40
PROMPT_CHARS = 320          # as models/corpus.py: at least this many characters
RANDOM_PROMPT_TOKENS = 96   # random family: token ids per prompt
SEED = 1234

DISTRO_INFO = sorted(Path("/usr/share/distro-info").glob("*.csv"))
SERVICES = Path("/etc/services")
ZONES = Path("/usr/share/zoneinfo/zone1970.tab")


# ------------------------------------------------------------------ sources
def services() -> list[tuple[str, int, str, str]]:
    """(name, port, protocol, aliases) of /etc/services, file order."""
    out = []
    for line in SERVICES.read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) >= 2 and "/" in fields[1]:
            port, proto = fields[1].split("/", 1)
            out.append((fields[0], int(port), proto, " ".join(fields[2:])))
    return out


def zones() -> list[tuple[str, str, str]]:
    """(country codes, coordinates, zone name) of zone1970.tab, file order."""
    out = []
    for line in ZONES.read_text().splitlines():
        if line and not line.startswith("#"):
            fields = line.split("\t")
            out.append((fields[0], fields[1], fields[2]))
    return out


def tables() -> list[tuple[list[str], list[list[str]]]]:
    """(header, rows) of every tabular source."""
    out = []
    for path in DISTRO_INFO:
        rows = list(csv.reader(io.StringIO(path.read_text())))
        out.append((rows[0], rows[1:]))
    out.append((["service", "port", "protocol", "aliases"],
                [[n, str(p), pr, a] for n, p, pr, a in services()]))
    out.append((["countries", "coordinates", "zone"], [list(z) for z in zones()]))
    return out


# ------------------------------------------------------------------ families
def _windows(make_chunk, rng: random.Random) -> list[str]:
    """PROMPTS_PER_FAMILY prompts, each chunks from `make_chunk(rng)` joined
    until PROMPT_CHARS is reached."""
    prompts = []
    for _ in range(PROMPTS_PER_FAMILY):
        text = ""
        while len(text) < PROMPT_CHARS:
            text += make_chunk(rng)
        prompts.append(text)
    return prompts


def _rows_window(rng: random.Random, render) -> str:
    """Consecutive rows of one table from a random start, rendered by
    `render(header, rows)`, as few as reach PROMPT_CHARS (or the table's end)."""
    header, rows = rng.choice(tables())
    start = rng.randrange(max(1, len(rows) - 8))
    end = start + 1
    while end < len(rows) and len(render(header, rows[start:end])) < PROMPT_CHARS:
        end += 1
    return render(header, rows[start:end])


def csv_prompts(rng: random.Random) -> list[str]:
    def render(header, rows):
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
        return buf.getvalue()
    return [_rows_window(rng, render) for _ in range(PROMPTS_PER_FAMILY)]


def json_prompts(rng: random.Random) -> list[str]:
    def render(header, rows):
        return "".join(json.dumps(dict(zip(header, row)), separators=(",", ":")) + "\n"
                       for row in rows)
    return [_rows_window(rng, render) for _ in range(PROMPTS_PER_FAMILY)]


def _ident(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).lower().strip("_") or "svc"


def boilerplate_prompts(rng: random.Random) -> list[str]:
    names = sorted({_ident(s[0]) for s in services()})
    ports = {_ident(s[0]): s[1] for s in services()}

    def chunk(rng: random.Random) -> str:
        picked = rng.sample(names, 4)
        kind = rng.randrange(3)
        if kind == 0:
            cls = picked[0].title().replace("_", "") + "Config"
            body = "".join(f"    {n}_port: int = {ports[n]}\n"
                           f"    {n}_enabled: bool = False\n" for n in picked)
            return f"@dataclass\nclass {cls}:\n{body}\n"
        if kind == 1:
            return "".join(
                f"parser.add_argument(\"--{n.replace('_', '-')}-port\", type=int, "
                f"default={ports[n]},\n                    help=\"port of the {n} "
                f"service\")\n" for n in picked)
        return ("HANDLERS = {\n" + "".join(f"    \"{n}\": handle_{n},\n" for n in picked)
                + "}\n\n" + "".join(f"def handle_{n}(request):\n    return "
                                    f"dispatch(request, port={ports[n]})\n\n" for n in picked))
    return _windows(chunk, rng)


def random_prompts(rng: random.Random) -> list[str]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER))
    vocab = tok.get_vocab_size()
    return [tok.decode([rng.randrange(vocab) for _ in range(RANDOM_PROMPT_TOKENS)])
            for _ in range(PROMPTS_PER_FAMILY)]


def held_out(family: str) -> list[str]:
    """The first prompts of models/prompts/<family>.jsonl (models/corpus.py)."""
    lines = (HERE / "prompts" / f"{family}.jsonl").read_text().splitlines()
    return [json.loads(line)["prompt"] for line in lines if line.strip()][:PROMPTS_PER_FAMILY]


FAMILIES = {
    "code": lambda rng: held_out("code"),
    "prose": lambda rng: held_out("prose"),
    "boilerplate": boilerplate_prompts,
    "csv": csv_prompts,
    "json": json_prompts,
    "random": random_prompts,
}


def main() -> int:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for i, (family, make) in enumerate(FAMILIES.items()):
        prompts = make(random.Random(SEED + i))
        path = OUT_DIR / f"{family}.jsonl"
        path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
        print(f"{path.relative_to(HERE.parent)}: {len(prompts)} prompts, "
              f"{sum(map(len, prompts)) // len(prompts)} chars on average")
    return 0


if __name__ == "__main__":
    sys.exit(main())
