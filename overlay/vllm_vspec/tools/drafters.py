"""Drafter store: find, validate and register drafters (`vllm-vspec models`,
commands/models.py, is its command).

For each default drafter the candidates are tried in order, first valid wins:

1. the drafter's environment variable (VSPEC_DRAFT_MODEL / VSPEC_EAGLE_MODEL);
   when set it is the only candidate, so a wrong path fails loudly;
2. the registry JSON (VSPEC_MODEL_REGISTRY, default
   $XDG_CONFIG_HOME/vllm-vspec/models.json);
3. the shared models directory (VSPEC_MODEL_DIR, default /data/shared-models),
   as <dir>/<repo name>;
4. the local Hugging Face cache (HF_HUB_CACHE, or $HF_HOME/hub, default
   ~/.cache/huggingface/hub), snapshot layout;
5. with `--download` only: huggingface_hub.snapshot_download into the shared
   models directory when writable, else $XDG_DATA_HOME/vllm-vspec/models.

Found drafters are written to the registry, which the preset launcher reads to
turn a drafter's Hugging Face id into its local path. Imports no vLLM.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

REGISTRY_SCHEMA = 1
DEFAULT_MODEL_DIR = "/data/shared-models"
WEIGHT_PATTERNS = ("*.safetensors", "*.bin")


@dataclass(frozen=True)
class Drafter:
    """A default drafter: where it comes from and what makes a copy valid."""

    kind: str
    repo: str
    architectures: tuple[str, ...]  # any one of these in config.json
    env: str
    check_tokenizer: bool  # a draft model decodes with its own tokenizer

    @property
    def name(self) -> str:
        return self.repo.rsplit("/", 1)[-1]


DRAFTERS = {
    "draft": Drafter("draft", "Qwen/Qwen2.5-0.5B-Instruct", ("Qwen2ForCausalLM",),
                     "VSPEC_DRAFT_MODEL", check_tokenizer=True),
    # EAGLE heads share the target's tokenizer; the alias is seen in the wild.
    "eagle": Drafter("eagle", "Zjcxy-SmartAI/Eagle-Qwen2.5-14B-Instruct",
                     ("Qwen2ForCausalLMEagle", "EagleQwen2ForCausalLM"),
                     "VSPEC_EAGLE_MODEL", check_tokenizer=False),
}


class DrafterError(ValueError):
    """The registry file or a download request cannot be used."""


@dataclass
class Result:
    """The outcome for one drafter, as printed and as `--json` output."""

    kind: str
    repo: str
    status: str = "missing"  # found | missing
    path: str | None = None
    source: str | None = None
    architecture: str | None = None
    weights_bytes: int = 0
    problems: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- locations
def registry_path(environ: Mapping[str, str] = os.environ) -> Path:
    if environ.get("VSPEC_MODEL_REGISTRY"):
        return Path(environ["VSPEC_MODEL_REGISTRY"])
    base = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME", "~")) / ".config")
    return Path(base).expanduser() / "vllm-vspec" / "models.json"


def model_dir(environ: Mapping[str, str] = os.environ) -> Path:
    return Path(environ.get("VSPEC_MODEL_DIR") or DEFAULT_MODEL_DIR)


def hf_hub_cache(environ: Mapping[str, str] = os.environ) -> Path:
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"])
    home = environ.get("HF_HOME") or str(Path(environ.get("HOME", "~")) / ".cache" / "huggingface")
    return Path(home).expanduser() / "hub"


def download_root(environ: Mapping[str, str] = os.environ) -> Path:
    shared = model_dir(environ)
    if shared.is_dir() and os.access(shared, os.W_OK):
        return shared
    base = environ.get("XDG_DATA_HOME") or str(Path(environ.get("HOME", "~")) / ".local" / "share")
    return Path(base).expanduser() / "vllm-vspec" / "models"


# ----------------------------------------------------------------- registry
def read_registry(path: Path) -> dict[str, dict]:
    """kind -> entry; an absent file is an empty registry."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DrafterError(f"registry {path} is not valid JSON ({exc}); fix or delete it") from None
    if not isinstance(data, dict) or data.get("schema_version") != REGISTRY_SCHEMA:
        raise DrafterError(f"registry {path}: schema_version={data.get('schema_version')!r} "
                           f"is not allowed: {REGISTRY_SCHEMA}" if isinstance(data, dict)
                           else f"registry {path} is not a JSON object")
    return dict(data.get("drafters", {}))


def write_registry(path: Path, results: list[Result]) -> None:
    """Merge the found drafters into the registry (others are kept)."""
    entries = read_registry(path)
    for r in results:
        if r.status == "found":
            entries[r.kind] = {"repo": r.repo, "path": r.path, "source": r.source,
                               "architecture": r.architecture, "weights_bytes": r.weights_bytes}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"schema_version": REGISTRY_SCHEMA, "drafters": entries},
                              indent=2, sort_keys=True) + "\n")
    tmp.replace(path)  # atomic: a reader never sees half a registry


def registered_path(model_id: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """The registered local path of a drafter named by repo id or repo name."""
    for entry in read_registry(registry_path(environ)).values():
        if model_id in (entry.get("repo"), entry.get("repo", "").rsplit("/", 1)[-1]):
            return entry.get("path")
    return None


# --------------------------------------------------------------- discovery
def candidates(d: Drafter, environ: Mapping[str, str]) -> Iterator[tuple[str, Path]]:
    if environ.get(d.env):
        yield f"env {d.env}", Path(environ[d.env])
        return
    entry = read_registry(registry_path(environ)).get(d.kind)
    if entry and entry.get("path"):
        yield "registry", Path(entry["path"])
    yield "model_dir", model_dir(environ) / d.name
    snapshot = hf_snapshot(hf_hub_cache(environ), d.repo)
    if snapshot is not None:
        yield "hf_cache", snapshot


def hf_snapshot(hub: Path, repo: str) -> Path | None:
    """The cached snapshot of `repo`: the one refs/main names, else the newest."""
    repo_dir = hub / ("models--" + repo.replace("/", "--"))
    ref = repo_dir / "refs" / "main"
    if ref.is_file() and (repo_dir / "snapshots" / ref.read_text().strip()).is_dir():
        return repo_dir / "snapshots" / ref.read_text().strip()
    snaps = sorted((p for p in (repo_dir / "snapshots").glob("*") if p.is_dir()),
                   key=lambda p: p.stat().st_mtime)
    return snaps[-1] if snaps else None


def validate(d: Drafter, path: Path, target: Path | None = None) -> tuple[str | None, int, list[str]]:
    """(architecture, weight bytes, problems); no problems means usable."""
    if not path.is_dir():
        return None, 0, [f"{path}: not a directory"]
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return None, 0, [f"{path}/config.json: unreadable ({exc})"]
    archs = (config.get("architectures") or []) if isinstance(config, dict) else []
    arch = next((a for a in archs if a in d.architectures), None)
    problems = [] if arch else [
        f"{path}/config.json: architectures={archs!r}, expected one of {list(d.architectures)}"]
    weights = [p for pat in WEIGHT_PATTERNS for p in path.glob(pat)]
    size = sum(p.stat().st_size for p in weights)
    empty = [p.name for p in weights if p.stat().st_size == 0]
    if not weights or empty:
        problems.append(f"{path}: no non-empty weights ({', '.join(WEIGHT_PATTERNS)})"
                        + (f"; empty: {', '.join(sorted(empty))}" if empty else ""))
    problems += _missing_shards(path)
    if d.check_tokenizer:
        problems += tokenizer_problems(path, target)
    return arch, size, problems


def _missing_shards(path: Path) -> list[str]:
    index = path / "model.safetensors.index.json"
    if not index.is_file():
        return []
    shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
    missing = sorted(s for s in shards if not (path / s).is_file())
    return [f"{path}: shards listed in {index.name} missing: {', '.join(missing)}"] if missing else []


def load_vocab(path: Path) -> dict[int, str] | None:
    """id -> token from tokenizer.json (or vocab.json + added_tokens.json)."""
    tok = path / "tokenizer.json"
    if tok.is_file():
        data = json.loads(tok.read_text())
        vocab = {i: t for t, i in (data.get("model", {}).get("vocab") or {}).items()}
        vocab.update({a["id"]: a["content"] for a in data.get("added_tokens", [])})
        return vocab
    if (path / "vocab.json").is_file():
        vocab = {i: t for t, i in json.loads((path / "vocab.json").read_text()).items()}
        added = path / "added_tokens.json"
        if added.is_file():
            vocab.update({i: t for t, i in json.loads(added.read_text()).items()})
        return vocab
    return None


def tokenizer_problems(draft: Path, target: Path | None) -> list[str]:
    """A draft model's token ids must mean the same tokens as the target's
    (vocab sizes may differ by padding; ids present in both must agree)."""
    dv = load_vocab(draft)
    if dv is None:
        return [f"{draft}: no tokenizer (tokenizer.json or vocab.json)"]
    if target is None:
        return []
    tv = load_vocab(target)
    if tv is None:
        return [f"{target}: target has no tokenizer (tokenizer.json or vocab.json)"]
    shared = dv.keys() & tv.keys()
    differ = sorted(i for i in shared if dv[i] != tv[i])
    if not shared or differ:
        shown = ", ".join(f"{i}: {dv[i]!r} vs {tv[i]!r}" for i in differ[:5])
        return [f"{draft}: tokenizer incompatible with target {target}: "
                + (f"{len(differ)} of {len(shared)} shared ids differ ({shown})"
                   if shared else "no shared token ids")]
    return []


def find(d: Drafter, environ: Mapping[str, str], target: Path | None = None) -> Result:
    result = Result(d.kind, d.repo)
    for source, path in candidates(d, environ):
        arch, size, problems = validate(d, path, target)
        if not problems:
            result.status, result.path, result.source = "found", str(path.resolve()), source
            result.architecture, result.weights_bytes, result.problems = arch, size, []
            return result
        if path.exists():  # an absent default location is not worth reporting
            result.problems += [f"{source}: {p}" for p in problems]
        elif source.startswith("env"):
            result.problems.append(f"{source}: {path} does not exist")
    return result


def download(d: Drafter, environ: Mapping[str, str], target: Path | None = None) -> Result:
    """Fetch `d` with huggingface_hub, then validate it like any candidate."""
    if environ.get("HF_HUB_OFFLINE", "0").lower() not in ("", "0", "false"):
        raise DrafterError("--download: HF_HUB_OFFLINE is set; unset it or place the "
                           f"drafter under {model_dir(environ)}")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise DrafterError("--download needs huggingface_hub (pip install huggingface_hub)") from None
    dest = download_root(environ) / d.name
    snapshot_download(repo_id=d.repo, local_dir=str(dest))
    arch, size, problems = validate(d, dest, target)
    result = Result(d.kind, d.repo, path=str(dest), source="download",
                    architecture=arch, weights_bytes=size, problems=problems)
    result.status = "missing" if problems else "found"
    return result


def special_ids_of(model: str) -> list[int]:
    """The tokenizer's special ids plus the eos/bos/pad ids of the model's
    config and generation config."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    ids: list[Any] = list(AutoTokenizer.from_pretrained(model).all_special_ids)
    configs: list[Any] = [AutoConfig.from_pretrained(model)]
    try:
        configs.append(GenerationConfig.from_pretrained(model))
    except OSError:
        pass   # no generation_config.json
    for cfg in configs:
        for name in ("eos_token_id", "bos_token_id", "pad_token_id"):
            v = getattr(cfg, name, None)
            ids.extend(v if isinstance(v, list) else [] if v is None else [v])
    return sorted(set(int(i) for i in ids))
