"""Main commands stay quiet (tools/engine_log.py): `vllm-vspec demo` and
`vllm-vspec bench serve` show their progress bar and tables on the console; what
engines write goes to a log file the command names, and to the console as
well only with --verbose.

Each case runs in a fresh interpreter whose stdout and stderr are pipes, as
a terminal's would be: the redirection is of file descriptors, which the
test process's own capture would hide. No engine starts: vLLM's logging is
configured the way an engine configures it, and the writers an engine has
(vLLM's logger, a Python warning, a C-level write, a child process) write.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vllm_vspec.bench.server import Server

REPO = Path(__file__).resolve().parents[2]

# What an engine writes while it runs, from every kind of writer it has.
ENGINE_NOISE = textwrap.dedent("""
    import os, subprocess, sys, warnings
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging, init_logger

    def engine_noise():
        configure_logging(LoggingConfig())        # what an engine's start-up does
        init_logger("vllm.engine").info("ENGINE-INFO-LINE")
        warnings.warn("ENGINE-PY-WARNING")
        os.write(2, b"ENGINE-C-WRITE\\n")
        subprocess.run([sys.executable, "-c", "print('ENGINE-CHILD-LINE')"], check=True)
""")
NOISE = ("ENGINE-INFO-LINE", "ENGINE-PY-WARNING", "ENGINE-C-WRITE", "ENGINE-CHILD-LINE")


def run_python(code: str, *args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
def test_engine_output_goes_to_the_log_and_to_the_console_only_when_verbose(tmp_path, verbose):
    log = tmp_path / "engine.log"
    out = run_python(ENGINE_NOISE + textwrap.dedent("""
        from pathlib import Path
        from vllm_vspec.tools.engine_log import engine_output
        with engine_output(Path(sys.argv[1]), verbose=sys.argv[2] == "1") as console:
            engine_noise()
            print("COMMAND-BAR", file=console)
        print("COMMAND-TABLE")
    """), str(log), "1" if verbose else "0")
    logged = log.read_text()
    assert all(n in logged for n in NOISE), logged
    assert "COMMAND-BAR" in out.stderr and "COMMAND-TABLE" in out.stdout
    assert "COMMAND-BAR" not in logged and "COMMAND-TABLE" not in logged
    console = out.stdout + out.stderr
    if verbose:
        assert all(n in console for n in NOISE), console
    else:
        assert not any(n in console for n in NOISE), console


def test_the_descriptors_are_restored_when_the_body_raises(tmp_path):
    out = run_python(textwrap.dedent("""
        import sys
        from pathlib import Path
        from vllm_vspec.tools.engine_log import engine_output
        try:
            with engine_output(Path(sys.argv[1])):
                raise KeyError("boom")
        except KeyError:
            print("AFTER-ON-STDOUT")
            print("AFTER-ON-STDERR", file=sys.stderr)
    """), str(tmp_path / "e.log"))
    assert "AFTER-ON-STDOUT" in out.stdout and "AFTER-ON-STDERR" in out.stderr
    assert (tmp_path / "e.log").read_text() == ""


# The demo's CLI with its engine calls replaced by stand-ins that write what
# an engine writes: the console gets the log's name, one progress bar and the
# table; the log gets the rest.
DEMO = ENGINE_NOISE + textwrap.dedent("""
    from vllm_vspec.cli import main
    from vllm_vspec.tools import engine_runs

    def build_llm(*args, **kwargs):
        engine_noise()
        return object()

    def run_batches(llm, prompts, batch_size, max_tokens):
        return engine_runs.BatchRun([[1] * max_tokens for _ in prompts], 0.5,
                                    engine_runs.SpecCounters())

    engine_runs.build_llm, engine_runs.run_batches = build_llm, run_batches
    engine_runs.shutdown_llm = lambda llm: None
    sys.exit(main(["demo", "--gammas", "2", "--batch-sizes", "1", "--eagle", "",
                   "--num-prompts", "1", "--rounds", "1", *sys.argv[1:]]))
""")


def test_demo_names_its_log_and_shows_only_its_bar_and_table(tmp_path):
    out = run_python(DEMO, "--output", str(tmp_path / "demo.json"))
    log = tmp_path / "demo.log"                   # --output's path, suffix .log
    assert f"the engines' output goes to {log}" in out.stderr
    assert all(n in log.read_text() for n in NOISE)
    console = out.stdout + out.stderr
    assert not any(n in console for n in NOISE), console
    assert out.stdout.splitlines()[0].split()[:3] == ["variant", "batch", "tok/s"]
    assert "demo: 100%" in out.stderr            # the one bar, to its end
    assert (tmp_path / "demo.json").is_file()


def test_demo_verbose_shows_the_engine_output_and_log_file_names_the_log(tmp_path):
    log = tmp_path / "elsewhere.log"
    out = run_python(DEMO, "--verbose", "--log-file", str(log))
    assert all(n in log.read_text() for n in NOISE)
    assert all(n in out.stdout + out.stderr for n in NOISE)


# ------------------------------------------------------------------- bench
STAND_IN_SERVER = textwrap.dedent("""
    import http.server, sys
    print("SERVER-LOG-LINE", flush=True)

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
""")


@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
def test_a_bench_server_logs_to_its_file_and_is_echoed_only_when_verbose(tmp_path, verbose):
    from vllm_vspec.bench.server import free_port

    port, echoed = free_port(), []
    log = tmp_path / "logs" / "target.log"
    with Server([sys.executable, "-c", STAND_IN_SERVER, str(port)], port, log,
                startup_timeout_s=60, echo=echoed.append if verbose else None):
        pass
    assert "SERVER-LOG-LINE" in log.read_text()
    assert echoed == ([b"SERVER-LOG-LINE\n"] if verbose else [])


def test_bench_takes_verbose_and_names_the_server_logs_in_its_dry_run(tmp_path, capsys):
    from vllm_vspec import cli

    assert cli.main(["bench", "serve", "--dry-run", "--variants", "target", "--verbose",
                     "--output-dir", str(tmp_path / "b")]) == 0
    assert f"server logs -> {tmp_path / 'b' / 'logs'}" in capsys.readouterr().out
