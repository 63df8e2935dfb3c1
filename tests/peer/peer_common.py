"""What the two peer suites share: vLLM's scheduler tests against
VSpecScheduler (tests/peer/peer_suite.py) and vLLM-Ascend's unit tests on
the stock and the overlaid tree (tests/ascend_peer/ascend_peer.py).

Both run someone else's tests in a pytest subprocess with a plugin that
records one outcome per test id (outcome_entry, message), then compare those
outcomes with a reference run (stock) and sort each difference into "listed
in suite.toml with its reason" or "unexpected" (Listing, file_difference).
What is compared with what, and how it is shown, stays with each suite.

Standard library only: the Ascend plugin imports this module in the
isolated venv of the host pin, the suites in this repository's venv.
"""

from __future__ import annotations

import fnmatch
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

# Every outcome a run records, in the order the tables show them; "missing":
# a test one run has and the other lacks.
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "missing")
MISSING = {"outcome": "missing", "message": ""}


# ------------------------------------------------------- in the plugins
def outcome_entry(report: Any) -> dict | None:
    """The {"outcome", "message"} a pytest TestReport records for its test,
    or None when it records nothing: the call phase decides, a setup that
    did not pass (error, skip) stands for the call, and a teardown that
    failed overrides both with "error". xfail marks map to xfailed/xpassed."""
    if report.when == "call" or (report.when == "setup" and not report.passed):
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        elif report.when == "setup" and report.failed:
            outcome = "error"
        else:
            outcome = report.outcome
        return {"outcome": outcome, "message": message(report)}
    if report.when == "teardown" and report.failed:
        return {"outcome": "error", "message": message(report)}
    return None


def message(report: Any) -> str:
    """One line (at most 300 characters) saying why a report did not pass:
    a skip's reason, a failure's exception line (the first line of pytest's
    crash message), a collection error's last line; "" when it passed."""
    if report.passed:
        return ""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (file, line, reason)
        return str(longrepr[2])[:300]
    crash = getattr(longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(longrepr)
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    # Collection errors end with the exception line; test failures start with it.
    line = lines[-1] if report.when not in ("setup", "call", "teardown") and lines else (
        lines[0] if lines else "")
    return line[:300]



# The exit status once the report is written; None until then (the process
# then ends as Python ends it).
_EXIT_STATUS: list = [None]


def skip_final_collections(config, exitstatus: int) -> None:
    """Once the report is written the outcomes are recorded, and garbage
    collection over a plugin's process heap (torch, vLLM, vLLM-Ascend) takes
    seconds: pytest's unraisable-exception plugin runs gc.collect() five
    times as the session closes (each test's own unraisable exceptions were
    collected after it), and Python collects again as it finalizes. Both
    are skipped: the first by its iteration count, the second by ending
    the process with the session's status after every other atexit
    handler (end_after_atexit)."""
    try:
        from _pytest.unraisableexception import gc_collect_iterations_key
    except ImportError:  # a pytest without the final collections
        pass
    else:
        config.stash[gc_collect_iterations_key] = 0
    _EXIT_STATUS[0] = exitstatus


def end_after_atexit() -> None:
    """A plugin registers it before the tests import anything, so that it
    runs after every other atexit handler (they run last registered first)."""
    if _EXIT_STATUS[0] is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_EXIT_STATUS[0])

# ------------------------------------------------------ in the suites
class Listed(Protocol):
    reason: str | None


@dataclass
class Listing:
    """A suite.toml's [[difference]] entries ({"tests": [fnmatch patterns],
    "reason", and a suite's own keys saying where an entry applies}) and
    which of them a comparison used."""
    entries: list[dict]
    used: set[int] = field(default_factory=set)

    def reason(self, test_id: str, covers: Callable[[dict], bool] = lambda e: True) -> str | None:
        """The reason of the first entry that `covers` (the suite's own
        condition: this variant, this host) and whose patterns match the
        whole test id; that entry counts as used."""
        for i, entry in enumerate(self.entries):
            if covers(entry) and any(fnmatch.fnmatchcase(test_id, p) for p in entry["tests"]):
                self.used.add(i)
                return entry["reason"]
        return None

    def stale(self, applies: Callable[[dict], bool] = lambda e: True) -> list[dict]:
        """The entries (among those that `applies` to this run) no difference used."""
        return [e for i, e in enumerate(self.entries) if i not in self.used and applies(e)]


def file_difference(diff: Listed, reason: str | None, expected: list, unexpected: list) -> None:
    """A difference with the reason suite.toml gives it goes to `expected`,
    one without to `unexpected` (which fails the suite)."""
    if reason is None:
        unexpected.append(diff)
    else:
        diff.reason = reason
        expected.append(diff)


def by_reason(diffs: list) -> dict[str, list]:
    """Listed differences grouped by their reason, in first-seen order."""
    out: dict[str, list] = {}
    for d in diffs:
        out.setdefault(d.reason, []).append(d)
    return out


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned columns, two spaces apart, no trailing blanks."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *rows]]


def read_report(rc: int, report: Path, log: Path, what: str = "pytest") -> dict:
    """The plugin's JSON report of a finished pytest subprocess. pytest's exit
    0 (all passed) and 1 (some failed) are outcomes; anything else (a usage
    or collection error, a crash) or a missing report raises RuntimeError
    with the log's last 30 lines."""
    if rc not in (0, 1) or not report.is_file():
        tail = "\n".join(log.read_text().splitlines()[-30:])
        raise RuntimeError(f"{what} exited with {rc} (log {log}):\n{tail}")
    return json.loads(report.read_text())
