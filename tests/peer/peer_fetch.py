"""Fetch the pinned vLLM sdist's scheduler tests into a local cache.

Nothing from the sdist is executed here: the archive's SHA-256 is checked
against tests/peer/pin.toml before the archive is opened, and only the pinned
members are unpacked (tarfile's "data" filter: no absolute paths, no links
out of the tree, no devices). The cache (default `.venv/peer-cache`, or
$VSPEC_PEER_CACHE) holds:

    sdists/<file>                 the verified archive, reused while its hash matches
    vllm-<version>/src/tests/...  the unpacked members, the sdist's top folder stripped
    vllm-<version>/hf/hub/...     an offline Hugging Face cache with config-only
                                  stand-ins for the hub models the tests name
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from vllm_vspec.tools.ascend_build.common import BuildError, download as verified_download

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PIN = HERE / "pin.toml"
DEFAULT_CACHE = REPO / ".venv" / "peer-cache"


class FetchError(RuntimeError):
    """The sdist could not be fetched, did not match its pin, or lacks a member."""


@dataclass(frozen=True)
class PeerTree:
    """Where a fetched peer suite lives: `src` holds `tests/`, `hf_home` is
    the HF_HOME to run it with (offline)."""
    version: str
    src: Path
    hf_home: Path


def load_pin(path: Path = PIN) -> dict:
    return tomllib.loads(path.read_text())


def cache_root() -> Path:
    return Path(os.environ.get("VSPEC_PEER_CACHE", DEFAULT_CACHE))


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download(url: str, dest: Path, sha256: str) -> Path:
    """`dest` holding exactly the pinned bytes: reused when its hash matches,
    else fetched by the overlay builder's verified download (kept only once
    its hash matches)."""
    if dest.is_file() and sha256_of(dest) == sha256:
        return dest
    try:
        return verified_download(url, dest, sha256)
    except BuildError as exc:
        raise FetchError(f"{exc} (pin: {PIN.relative_to(REPO)})") from exc


def _selected(name: str, top: str, members: list[str]) -> bool:
    rel = name[len(top) + 1:] if name.startswith(top + "/") else None
    if rel is None:
        return False
    return any(rel == m or (m.endswith("/") and rel.startswith(m)) for m in members)


def unpack(archive: Path, sha256: str, members: list[str], dest: Path) -> None:
    """Unpack `members` (paths under the archive's top folder; a trailing '/'
    takes a whole folder) into `dest`, replacing it. The hash is checked
    again here so that a cached archive is never opened unverified."""
    got = sha256_of(archive)
    if got != sha256:
        raise FetchError(f"{archive}: SHA-256 {got} does not match the pin {sha256}")
    top = archive.name.removesuffix(".tar.gz")
    staging = dest.with_name(dest.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    with tarfile.open(archive, "r:gz") as tar:
        chosen = [m for m in tar.getmembers() if _selected(m.name, top, members)]
        found = {m.name[len(top) + 1:] for m in chosen}
        missing = [m for m in members
                   if not any(f == m or (m.endswith("/") and f.startswith(m)) for f in found)]
        if missing:
            raise FetchError(f"{archive.name} has no {', '.join(missing)} (pinned members)")
        tar.extractall(staging, members=chosen, filter="data")
    shutil.rmtree(dest, ignore_errors=True)
    (staging / top).replace(dest)
    shutil.rmtree(staging)


def write_hub_configs(configs: dict[str, dict], hf_home: Path) -> None:
    """An offline HF cache (HF_HOME layout) holding one config.json per model:
    transformers' defaults for `model_type` updated with the pinned keys."""
    from transformers import AutoConfig

    for repo_id, keys in configs.items():
        keys = dict(keys)
        config = AutoConfig.for_model(keys.pop("model_type"), **keys)
        text = config.to_json_string()
        # A fixed fake commit per content: the cache layout wants one.
        revision = hashlib.sha1(text.encode()).hexdigest()
        repo = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
        snapshot = repo / "snapshots" / revision
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "config.json").write_text(text)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(revision)


def fetch(pin: dict | None = None, cache: Path | None = None) -> PeerTree:
    """The unpacked peer suite, fetching and unpacking only what the pin
    changed since the last call (a stamp records what was unpacked)."""
    pin = pin or load_pin()
    # Resolved: pytest names tests by their real paths, so a --rootdir under
    # a symlink (a linked .venv or cache) would give test ids without their
    # file, which no exclusion or listed difference matches.
    cache = (cache or cache_root()).resolve()
    sdist = pin["sdist"]
    root = cache / f"vllm-{sdist['version']}"
    tree = PeerTree(sdist["version"], root / "src", root / "hf")
    wanted = json.dumps({"sha256": sdist["sha256"], "members": sdist["members"],
                         "hub_configs": pin.get("hub_configs", {})}, sort_keys=True)
    stamp = root / "fetched.json"
    if stamp.is_file() and stamp.read_text() == wanted:
        return tree
    archive = download(sdist["url"], cache / "sdists" / sdist["file"], sdist["sha256"])
    root.mkdir(parents=True, exist_ok=True)
    unpack(archive, sdist["sha256"], sdist["members"], tree.src)
    shutil.rmtree(tree.hf_home, ignore_errors=True)
    write_hub_configs(pin.get("hub_configs", {}), tree.hf_home)
    stamp.write_text(wanted)
    return tree
