"""Offline training corpus for the bundled model pair, built from files that
every machine of this kind carries (no network, no model hub).

Two families, kept apart so that prompts and measurements can be reported per
family:
  code   Python 3.11 standard-library sources;
  prose  /usr/share/common-licenses plus /usr/share/doc/*/{copyright,README*,NEWS*}
         (gzipped ones decompressed), with repeated paragraphs removed.

Invariants: every list is sorted, the held-out split is a function of the
document's path only (a hash, not an RNG), so the same machine contents always
give the same corpus, split and prompts.
"""

from __future__ import annotations

import gzip
import hashlib
import random
import re
from dataclasses import dataclass
from pathlib import Path

# The Debian system stdlib first, the pyenv one as a fallback: both exist on
# this kind of machine; the first present one is used (recorded by train.py).
CODE_ROOTS = ("/usr/lib/python3.11", "/root/.pyenv/versions/3.11.7/lib/python3.11")
# Test suites, bundled third-party trees and generated tables are not "code a
# user would prompt with" and would dominate the corpus.
CODE_SKIP_DIRS = {"test", "tests", "site-packages", "dist-packages", "idlelib",
                  "lib2to3", "__pycache__", "pydoc_data", "encodings", "ensurepip"}
LICENSES_DIR = Path("/usr/share/common-licenses")
DOC_DIR = Path("/usr/share/doc")
DOC_GLOBS = ("copyright", "README*", "NEWS*")

# Documents larger than this are truncated so that no single changelog
# dominates the prose family.
MAX_DOC_CHARS = 60_000
# Documents shorter than this after de-duplication carry no usable text.
MIN_DOC_CHARS = 200
# One document in HOLDOUT_MODULUS is held out (about 5%).
HOLDOUT_MODULUS = 20

PROMPT_CHARS = 320          # a prompt is a window of at least this many characters
PROMPTS_PER_FAMILY = 48
PROMPT_SEED = 1234


@dataclass(frozen=True)
class Document:
    family: str   # "code" or "prose"
    path: str     # absolute path of the source file (identity of the document)
    text: str

    @property
    def held_out(self) -> bool:
        digest = hashlib.sha256(self.path.encode()).digest()
        return int.from_bytes(digest[:4], "big") % HOLDOUT_MODULUS == 0


def code_root() -> Path:
    for root in CODE_ROOTS:
        if (Path(root) / "os.py").is_file():
            return Path(root)
    raise FileNotFoundError(f"no Python 3.11 stdlib found in any of {CODE_ROOTS}")


def _read_text(path: Path) -> str:
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    return raw.decode("utf-8", errors="replace")[:MAX_DOC_CHARS]


def code_documents() -> list[Document]:
    root = code_root()
    paths = sorted(p for p in root.rglob("*.py")
                   if not CODE_SKIP_DIRS.intersection(p.relative_to(root).parts[:-1]))
    docs = [Document("code", str(p), _read_text(p)) for p in paths]
    return [d for d in docs if len(d.text) >= MIN_DOC_CHARS]


def _prose_paths() -> list[Path]:
    paths = [p for p in LICENSES_DIR.iterdir() if p.is_file() and not p.is_symlink()]
    for pattern in DOC_GLOBS:
        paths += [p for p in DOC_DIR.glob(f"*/{pattern}") if p.is_file() and not p.is_symlink()]
    # .html duplicates of plain-text NEWS are markup, not prose.
    return sorted(p for p in set(paths) if ".html" not in p.name)


def _paragraph_key(paragraph: str) -> str:
    return " ".join(paragraph.split()).lower()


def prose_documents() -> list[Document]:
    """Prose with every paragraph kept only at its first occurrence (in sorted
    path order): licenses are copied into hundreds of copyright files, and
    without this the model would mostly memorise the GPL. Removing repeats
    across all documents also keeps held-out text out of the training set."""
    seen: set[str] = set()
    docs = []
    for path in _prose_paths():
        kept = []
        for paragraph in re.split(r"\n\s*\n", _read_text(path)):
            key = _paragraph_key(paragraph)
            if key and key not in seen:
                seen.add(key)
                kept.append(paragraph.strip("\n"))
        text = "\n\n".join(kept)
        if len(text) >= MIN_DOC_CHARS:
            docs.append(Document("prose", str(path), text))
    return docs


def all_documents() -> list[Document]:
    return code_documents() + prose_documents()


def _prompt_windows(doc: Document, rng: random.Random, count: int) -> list[str]:
    """Up to `count` windows of whole lines, each at least PROMPT_CHARS long,
    starting at random line boundaries inside the document."""
    lines = doc.text.splitlines(keepends=True)
    windows = []
    for start in sorted(rng.sample(range(len(lines)), min(count, len(lines)))):
        text = ""
        for line in lines[start:]:
            text += line
            if len(text) >= PROMPT_CHARS:
                break
        if len(text) >= PROMPT_CHARS and text.strip():
            windows.append(text)
    return windows


def held_out_prompts(docs: list[Document], family: str) -> list[str]:
    """PROMPTS_PER_FAMILY prompts from the held-out documents of `family`, two
    windows per document at most, so no single document dominates."""
    rng = random.Random(PROMPT_SEED)
    prompts: list[str] = []
    for doc in docs:
        if doc.family == family and doc.held_out:
            prompts += _prompt_windows(doc, rng, 2)
    return prompts[:PROMPTS_PER_FAMILY]
