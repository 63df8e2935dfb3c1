"""The host ABI check: do our adapter classes still fit the host's sources?

It reads sources, never imports them (vLLM-Ascend cannot be imported off an
NPU, and vLLM 0.23 is only a wheel here). It finds our adapter classes (every
class under `vllm_vspec/hosts/` and `vllm_ascend/vspec/` with a host class
in its MRO), linearises their MROs (C3) across the host's modules, and checks,
for each class:

- override: each method we define that a host class also defines (not the
  constructor, which is ours to define) accepts every call the host signature
  accepts, binding it to the same names (a `*args, **kwargs` pass-through
  accepts everything; the keys it reads from `**kwargs` must be host parameter
  names);
- call: each `super().m(...)` / `self.m(...)` we make binds to the host's
  signature of `m`;
- import / base: every host module and name our adapter modules import
  (outside `try:`), and every host base class they name, exists;
- attribute: each `self.x` we read and do not set ourselves exists in the host
  (a method, a class attribute, or a `self.x = ...` in some host method), and
  a host attribute we shadow with a property has a setter when the host
  assigns it;
- constructor: each host class our adapter modules instantiate
  (`ACLGraphWrapper(fn, cfg, runtime_mode=...)`) is called in a way its
  `__init__` accepts;
- host object: on a host object other than `self`, each attribute we read and
  each method we call exists (and the call binds). A name is known to hold a
  host object when our function builds it from a host class, annotates it with
  one, or tests `isinstance(name, HostClass)` (flow-insensitive: anywhere in
  the function).

And one behavioural rule, `contract`, for the classes this host's routing
selects (`vllm_ascend/vspec/host.toml`, the host's overlay.toml; every adapter
class where there is none): a property of ours with a setter that is not a
plain store (its getter does not return what its setter stored, e.g. a
setter that records a maximum while the getter answers the step's gamma) is
a contract about *when* the host assigns it. A host method other than the
constructor that assigns `self.<property>` and reads it back later in the
same method expects its value back, and gets ours instead: vLLM-Ascend
0.30's `_propose` assigns `self.num_speculative_tokens` every step and reads
it at once, which the 0.23 proposer's setter turns into a shrinking maximum.
Only host methods that run count (the first host definition in the MRO, and
not one our classes override without calling it). A routed class the tree
lacks is a finding too.

And `keep_host`, for the methods the host's routing sends to our proposers:
the host's `get_spec_decode_method` (vllm_ascend/spec_decode/__init__.py)
builds its own proposer for some engines of a routed method (vLLM-Ascend's
step3p5 MTP proposer; on 0.30 also gemma4 and multi-KV-cache-group MTP).
Every test it makes on the way to a proposer of a routed method (a call in
an `if` whose branch the method can take) must be listed for that method in
host.toml's `[routing.keep_host]`, so that routing leaves those engines to
the host, and every listed test must be one the host makes for that method
and exist (a SpeculativeConfig method of the host's vLLM, or a function of
the named module).

`vllm-vspec doctor` (doctor.py) chooses the hosts and prints the report.
"""

from __future__ import annotations

import ast
import functools
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

OURS = ("vllm_vspec", "vllm_ascend.vspec")  # module prefixes of our code
ADAPTER_PACKAGES = ("vllm_vspec.hosts", "vllm_ascend.vspec")


def _ours(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in OURS)


# ================================================================ sources
@dataclass
class Module:
    name: str
    path: str  # for messages: file path, or wheel!member
    tree: ast.Module
    imports: dict[str, str]  # local name -> qualified name
    classes: dict[str, ast.ClassDef]


class Sources:
    """Python sources of top-level packages, each from a directory or a wheel.
    `roots` maps a package prefix ("vllm", "vllm_ascend.vspec") to its
    directory or wheel; the longest matching prefix wins."""

    def __init__(self, roots: dict[str, Path]):
        self.roots = dict(roots)
        self._cache: dict[str, Module | None] = {}
        self._zips: dict[Path, tuple[zipfile.ZipFile, set[str]]] = {}
        # Host modules that do not parse (a patch left conflict markers):
        # nothing here checks against them; the byte-compile check reports them.
        self.unparsable: dict[str, str] = {}

    def _locate(self, module: str) -> tuple[Path, str] | None:
        """(root, path of the module relative to the root, without suffix).
        Inside a wheel the path starts at the package's own directory."""
        best = max((p for p in self.roots if module == p or module.startswith(p + ".")),
                   key=len, default=None)
        if best is None:
            return None
        root = self.roots[best]
        rel = module if root.is_file() else module[len(best):].lstrip(".")
        return root, rel.replace(".", "/")

    def _zip(self, root: Path) -> zipfile.ZipFile:
        return self._zip_and_names(root)[0]

    def _zip_and_names(self, root: Path) -> tuple[zipfile.ZipFile, set[str]]:
        if root not in self._zips:  # reading a wheel's directory is the slow part: once
            zf = zipfile.ZipFile(root)
            self._zips[root] = (zf, set(zf.namelist()))
        return self._zips[root]

    def read(self, module: str) -> tuple[str, str, bool] | None:
        """(display path, text, is_package) of a module, or None."""
        loc = self._locate(module)
        if loc is None:
            return None
        root, rel = loc
        candidates = [(f"{rel}.py", False), (f"{rel}/__init__.py", True)] if rel else \
            [("__init__.py", True)]
        if root.is_file():
            names = self._zip_and_names(root)[1]
            for member, pkg in candidates:
                if member in names:
                    return f"{root.name}!{member}", self._zip(root).read(member).decode(), pkg
            return None
        for cand, pkg in candidates:
            path = root / cand
            if path.is_file():
                return str(path), path.read_text(), pkg
        return None

    def module(self, name: str) -> Module | None:
        if name not in self._cache:
            found = self.read(name)
            try:
                self._cache[name] = None if found is None else _parse(name, *found)
            except SyntaxError as exc:
                self.unparsable[name] = f"{exc.filename}:{exc.lineno}: {exc.msg}"
                self._cache[name] = None
        return self._cache[name]

    def modules_under(self, package: str) -> Iterator[str]:
        """Every module name inside a package (for finding our adapters)."""
        loc = self._locate(package)
        if loc is None:
            return
        root, rel = loc
        if root.is_file():
            prefix = rel + "/" if rel else ""
            files = sorted(n[len(prefix):] for n in self._zip(root).namelist()
                           if n.startswith(prefix) and n.endswith(".py"))
        else:
            base = root / rel if rel else root
            files = sorted(p.relative_to(base).as_posix() for p in base.rglob("*.py")) \
                if base.is_dir() else []
        for f in files:
            parts = f[:-3].split("/")
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join([package, *parts]) if parts else package


def _parse(name: str, path: str, text: str, is_pkg: bool) -> Module:
    tree = ast.parse(text, filename=path)
    package = name if is_pkg else name.rpartition(".")[0]
    imports: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                imports[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    imports[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    imports[top] = top
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    return Module(name, path, tree, imports, classes)


# ================================================================ classes
@dataclass(frozen=True)
class ClassRef:
    qualname: str
    module: Module
    node: ast.ClassDef

    @property
    def ours(self) -> bool:
        return _ours(self.module.name)

    def where(self, node: ast.AST | None = None) -> str:
        return f"{self.module.path}:{(node or self.node).lineno}"


def resolve(sources: Sources, qualname: str, depth: int = 0) -> ClassRef | None:
    """The class a qualified name denotes, following re-exports."""
    module_name, _, name = qualname.rpartition(".")
    mod = sources.module(module_name) if module_name else None
    if mod is None or depth > 8:
        return None
    if name in mod.classes:
        return ClassRef(f"{module_name}.{name}", mod, mod.classes[name])
    if name in mod.imports and mod.imports[name] != qualname:
        return resolve(sources, mod.imports[name], depth + 1)
    for alias in _aliases(mod, name):
        found = resolve(sources, f"{module_name}.{alias}", depth + 1)
        if found is not None:
            return found
    return None


def _aliases(mod: Module, name: str) -> list[str]:
    """The names a module-level alias stands for: `X = A` or a class chosen
    at import, `X = A if cond else B` (vLLM's CudaPlatform); the first one
    readable is the class (the alternatives share a base that carries the
    interface)."""
    out: list[str] = []
    for node in mod.tree.body:
        if isinstance(node, ast.Assign) and [_dotted(t) for t in node.targets] == [name]:
            values = [node.value.body, node.value.orelse] if isinstance(node.value, ast.IfExp) \
                else [node.value]
            out += [d for d in map(_dotted, values) if d is not None and d != name]
    return out


def _base_names(ref: ClassRef) -> list[str]:
    out = []
    for base in ref.node.bases:
        dotted = _dotted(base)
        if dotted is None:
            continue
        head, _, rest = dotted.partition(".")
        if head in ref.module.classes:
            out.append(f"{ref.module.name}.{dotted}")
        elif head in ref.module.imports:
            out.append(ref.module.imports[head] + (f".{rest}" if rest else ""))
        else:
            out.append(dotted)
    return out


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


# Bases that add no attributes a subclass could rely on: unreadable, harmless.
PLAIN_BASES = {"object", "ABC", "abc.ABC", "Protocol", "typing.Protocol", "Generic",
               "typing.Generic"}


def opaque_bases(sources: Sources, chain: list[ClassRef]) -> list[str]:
    """Bases in the chain whose sources we cannot read (torch.nn.Module, ...):
    a member missing from the readable classes may live there."""
    out = []
    for ref in chain:
        for name in _base_names(ref):
            short = name.rpartition(".")[2]
            if name not in PLAIN_BASES and short not in PLAIN_BASES \
                    and resolve(sources, name) is None:
                out.append(name)
    return out


def mro(sources: Sources, ref: ClassRef) -> list[ClassRef]:
    """C3 linearisation over the classes whose sources we have; bases we
    cannot read (torch, object, ...) end the chain."""
    seqs = []
    for name in _base_names(ref):
        base = resolve(sources, name)
        if base is not None:
            seqs.append(mro(sources, base))
    bases = [resolve(sources, n) for n in _base_names(ref)]
    seqs.append([b for b in bases if b is not None])
    out = [ref]
    seqs = [list(s) for s in seqs if s]
    while seqs:
        for seq in seqs:
            head = seq[0]
            if not any(head.qualname in (c.qualname for c in s[1:]) for s in seqs):
                break
        else:
            raise ValueError(f"inconsistent MRO for {ref.qualname}")
        out.append(head)
        seqs = [[c for c in s if c.qualname != head.qualname] for s in seqs]
        seqs = [s for s in seqs if s]
    return out


# ============================================================= signatures
@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "pos" (positional-or-keyword), "posonly", "kwonly", "var", "varkw"
    default: bool


def signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[Param]:
    """Parameters after self/cls (staticmethods keep all)."""
    a = fn.args
    pos = [(p, "posonly") for p in a.posonlyargs] + [(p, "pos") for p in a.args]
    n_def = len(a.defaults)
    params = [Param(p.arg, kind, i >= len(pos) - n_def) for i, (p, kind) in enumerate(pos)]
    if a.vararg:
        params.append(Param(a.vararg.arg, "var", True))
    params += [Param(p.arg, "kwonly", d is not None) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        params.append(Param(a.kwarg.arg, "varkw", True))
    static = any(_dotted(d) == "staticmethod" for d in fn.decorator_list)
    return params if static else params[1:]


def render(params: list[Param]) -> str:
    marks = {"var": "*", "varkw": "**"}
    return "(" + ", ".join(marks.get(p.kind, "") + p.name + ("=..." if p.default and p.kind
                           not in marks else "") for p in params) + ")"


OBJECT_MEMBERS = set(dir(object))
# Constructors are ours to define: whoever builds our class passes our
# arguments. What must fit the host is our super().__init__(...) call.
CONSTRUCTORS = {"__init__", "__new__"}


def override_problems(ours: list[Param], host: list[Param]) -> list[str]:
    """Why a caller of the host signature could mis-call ours (empty: none)."""
    o_var = any(p.kind == "var" for p in ours)
    o_varkw = any(p.kind == "varkw" for p in ours)
    o_pos = [p for p in ours if p.kind in ("pos", "posonly")]
    o_named = {p.name: p for p in ours if p.kind not in ("var", "varkw")}
    h_pos = [p for p in host if p.kind in ("pos", "posonly")]
    problems = []
    for i, hp in enumerate(h_pos):
        op = o_pos[i] if i < len(o_pos) else None
        if op is None:
            if not o_var:
                problems.append(f"host positional parameter {hp.name!r} (#{i + 1}) has no place")
            elif hp.name in o_named:
                problems.append(f"{hp.name!r} is positional #{i + 1} in the host but "
                                "keyword-only here: a positional caller misses it")
            elif hp.kind == "pos" and not o_varkw:
                problems.append(f"{hp.name!r} passed by keyword has no place")
        elif op.name != hp.name and hp.kind == "pos":
            problems.append(f"positional #{i + 1} is {op.name!r} here, {hp.name!r} in the host")
        elif op is not None and hp.default and not op.default:
            problems.append(f"{hp.name!r} has a default in the host, none here")
    for hp in host:
        if hp.kind == "kwonly" and hp.name not in o_named and not o_varkw:
            problems.append(f"host keyword {hp.name!r} has no place")
        if hp.kind == "kwonly" and hp.name in o_named and hp.default and not o_named[hp.name].default:
            problems.append(f"{hp.name!r} has a default in the host, none here")
        if hp.kind == "var" and not o_var:
            problems.append("the host takes *args, this override does not")
        if hp.kind == "varkw" and not o_varkw:
            problems.append("the host takes **kwargs, this override does not")
    host_names = {p.name for p in host}
    h_varkw = any(p.kind == "varkw" for p in host)
    for op in o_named.values():
        if op.name not in host_names and not op.default and not h_varkw:
            problems.append(f"{op.name!r} is required here but no host caller passes it")
    for i, op in enumerate(o_pos[len(h_pos):], len(h_pos)):
        if not op.default:
            problems.append(f"extra positional {op.name!r} (#{i + 1}) has no default")
    return problems


def call_problems(call: ast.Call, host: list[Param]) -> list[str]:
    """Why `call` does not bind to the host signature (empty: it does)."""
    n_pos = sum(not isinstance(a, ast.Starred) for a in call.args)
    star = any(isinstance(a, ast.Starred) for a in call.args)
    dstar = any(k.arg is None for k in call.keywords)
    kws = [k.arg for k in call.keywords if k.arg is not None]
    pos = [p for p in host if p.kind in ("pos", "posonly")]
    has_var = any(p.kind == "var" for p in host)
    has_varkw = any(p.kind == "varkw" for p in host)
    by_kw = {p.name for p in host if p.kind in ("pos", "kwonly")}
    problems = []
    if n_pos > len(pos) and not has_var:
        problems.append(f"{n_pos} positional arguments, the host takes {len(pos)}")
    for k in kws:
        if k not in by_kw and not has_varkw:
            problems.append(f"keyword {k!r} is not a host parameter")
    if not (star or dstar):
        given = {p.name for p in pos[:n_pos]} | set(kws)
        missing = [p.name for p in host if p.kind in ("pos", "posonly", "kwonly")
                   and not p.default and p.name not in given]
        if missing:
            problems.append(f"required host parameters not passed: {', '.join(missing)}")
    return problems


# =============================================================== members
def _is_property(fn: ast.AST) -> bool:
    return isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
        _dotted(d) == "property" for d in fn.decorator_list)


def _has_setter(ref: ClassRef, name: str) -> bool:
    return any(isinstance(n, ast.FunctionDef) and n.name == name and
               any(_dotted(d) == f"{name}.setter" for d in n.decorator_list)
               for n in ref.node.body)


def class_members(ref: ClassRef) -> dict[str, ast.AST]:
    """Names a class body defines (first definition wins: properties before
    their setters)."""
    out: dict[str, ast.AST] = {}
    for node in ref.node.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.setdefault(node.name, node)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out.setdefault(t.id, node)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.setdefault(node.target.id, node)
    return out


def self_assignments(ref: ClassRef) -> dict[str, ast.AST]:
    """`self.x = ...` (also annotated / augmented / tuple targets) in methods."""
    return _self_assignments(ref.node)


# Keyed by the class node (identity); bounded so that trees of hosts checked
# earlier in a process (tests check several) do not pile up.
@functools.lru_cache(maxsize=512)
def _self_assignments(cls: ast.ClassDef) -> dict[str, ast.AST]:
    out: dict[str, ast.AST] = {}
    for fn in cls.body:
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            targets: list[ast.AST] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [node.target]
            flat = []
            for t in targets:
                flat += list(t.elts) if isinstance(t, (ast.Tuple, ast.List)) else [t]
            for t in flat:
                if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                        and t.value.id == "self"):
                    out.setdefault(t.attr, node)
    return out


def _pass_through(node: ast.AST) -> bool:
    """`def m(self, *args, **kwargs)`: the real signature is further up."""
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
        [p.kind for p in signature(node)] == ["var", "varkw"]


def host_lookup(host_mro: list[ClassRef], name: str,
                concrete: bool = False) -> tuple[ClassRef, ast.AST] | None:
    """Where the host defines `name`: a class member first (with `concrete`,
    skipping pure *args/**kwargs pass-throughs), else a `self.name = ...`."""
    passed = None
    for ref in host_mro:
        members = class_members(ref)
        if name in members:
            if concrete and _pass_through(members[name]):
                passed = passed or (ref, members[name])
                continue
            return ref, members[name]
    if passed:
        return passed
    for ref in host_mro:
        assigned = self_assignments(ref)
        if name in assigned:
            return ref, assigned[name]
    return None


# ================================================================= check
@dataclass
class Finding:
    host: str
    cls: str
    member: str
    # override | call | attribute | import | base | constructor | host object
    # | contract | keep_host
    kind: str
    ours: str  # file:line
    theirs: str  # file:line, or "" when the host lacks it
    problem: str

    def line(self) -> str:
        where = f" (host: {self.theirs})" if self.theirs else ""
        return f"{self.ours}: {self.cls}.{self.member} [{self.kind}] {self.problem}{where}"


@dataclass
class HostReport:
    name: str
    roots: dict[str, str]
    classes: dict[str, list[str]] = field(default_factory=dict)  # class -> host bases (MRO)
    checked: int = 0
    findings: list[Finding] = field(default_factory=list)
    skipped: str = ""

    @property
    def ok(self) -> bool:
        return not self.findings


def adapter_classes(sources: Sources) -> list[ClassRef]:
    """Our classes with at least one host class in their MRO."""
    found = []
    for package in ADAPTER_PACKAGES:
        for name in sources.modules_under(package):
            mod = sources.module(name)
            for cls in (mod.classes if mod else {}):
                ref = ClassRef(f"{name}.{cls}", mod, mod.classes[cls])
                if any(not c.ours for c in mro(sources, ref)):
                    found.append(ref)
    return found


def check_class(host_name: str, sources: Sources, ref: ClassRef) -> tuple[int, list[Finding]]:
    chain = mro(sources, ref)
    ours = [c for c in chain if c.ours]
    host = [c for c in chain if not c.ours]
    our_members: dict[str, tuple[ClassRef, ast.AST]] = {}
    our_assigned: set[str] = set()
    for c in ours:
        for name, node in class_members(c).items():
            our_members.setdefault(name, (c, node))
        our_assigned |= set(self_assignments(c))
    findings: list[Finding] = []
    checked = 0

    def add(member: str, kind: str, where: str, theirs: str, problem: str) -> None:
        findings.append(Finding(host_name, ref.qualname, member, kind, where, theirs, problem))

    opaque = bool(opaque_bases(sources, chain))
    for name, (owner, node) in sorted(our_members.items()):
        hit = host_lookup(host, name, concrete=True)
        if hit is None or name in CONSTRUCTORS:
            continue
        href, hnode = hit
        checked += 1
        fn_types = (ast.FunctionDef, ast.AsyncFunctionDef)
        if _is_property(node):
            assigned = name in self_assignments(href)
            if assigned and not _has_setter(owner, name):
                add(name, "attribute", owner.where(node), href.where(hnode),
                    "the host assigns this attribute; our property has no setter")
        elif isinstance(node, fn_types) and isinstance(hnode, fn_types) and not _is_property(hnode):
            ours_sig, host_sig = signature(node), signature(hnode)
            for p in override_problems(ours_sig, host_sig):
                add(name, "override", owner.where(node), href.where(hnode),
                    f"{p}; ours {render(ours_sig)}, host {render(host_sig)}")
            varkw = next((p.name for p in ours_sig if p.kind == "varkw"), None)
            host_names = {p.name for p in host_sig}
            if varkw and not any(p.kind == "varkw" for p in host_sig):
                for key, at in _kwargs_keys(node, varkw):
                    if key not in host_names:
                        add(name, "override", f"{owner.module.path}:{at.lineno}",
                            href.where(hnode), f"reads **{varkw}[{key!r}], not a host parameter")
        elif isinstance(node, fn_types) and not isinstance(hnode, fn_types):
            add(name, "override", owner.where(node), href.where(hnode),
                "a method here, a plain attribute in the host")
    for owner in ours:
        for fn in owner.node.body:
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            # super() from `owner` resolves past it: to our later classes first.
            later_ours = {m for c in chain[chain.index(owner) + 1:] if c.ours
                          for m in class_members(c)}
            for call, member, via_super in _self_calls(fn):
                if member in (later_ours if via_super else our_members):
                    continue
                hit = host_lookup(host, member, concrete=True)
                if hit is None and (opaque or member in OBJECT_MEMBERS):
                    continue  # defined where we cannot read (or by object)
                checked += 1
                if hit is None:
                    add(member, "call", f"{owner.module.path}:{call.lineno}", "",
                        "no host class defines it")
                    continue
                href, hnode = hit
                if isinstance(hnode, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _is_property(hnode):
                    for p in call_problems(call, signature(hnode)):
                        add(member, "call", f"{owner.module.path}:{call.lineno}",
                            href.where(hnode), p)
            for attr, node in _self_reads(fn):
                if attr in our_members or attr in our_assigned or attr.startswith("__"):
                    continue
                if opaque and host_lookup(host, attr) is None:
                    continue
                checked += 1
                if host_lookup(host, attr) is None:
                    add(attr, "attribute", f"{owner.module.path}:{node.lineno}", "",
                        "read here, but no host class defines or assigns it")
    return checked, _dedupe(findings)


def _dedupe(findings: list[Finding]) -> list[Finding]:
    seen, out = set(), []
    for f in findings:
        key = (f.member, f.kind, f.ours, f.problem)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def _self_calls(fn: ast.AST) -> Iterator[tuple[ast.Call, str, bool]]:
    """(call, method, via super()) for `super().m(...)` and `self.m(...)`."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value
            if (isinstance(target, ast.Call) and isinstance(target.func, ast.Name)
                    and target.func.id == "super"):
                yield node, node.func.attr, True
            elif isinstance(target, ast.Name) and target.id == "self":
                yield node, node.func.attr, False


def _self_reads(fn: ast.AST) -> Iterator[tuple[str, ast.Attribute]]:
    """`self.x` loads that are not method calls (those are checked as calls)."""
    called = {id(n.func) for n in ast.walk(fn) if isinstance(n, ast.Call)}
    for node in ast.walk(fn):
        if id(node) in called:
            continue
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
                and isinstance(node.value, ast.Name) and node.value.id == "self"):
            yield node.attr, node


def _kwargs_keys(fn: ast.AST, varkw: str) -> Iterator[tuple[str, ast.AST]]:
    """Keys read as `kwargs["k"]` or `kwargs.get("k")`."""
    for node in ast.walk(fn):
        if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                and node.value.id == varkw and isinstance(node.slice, ast.Constant)
                and isinstance(node.slice.value, str)):
            yield node.slice.value, node
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "get" and isinstance(node.func.value, ast.Name)
              and node.func.value.id == varkw and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield node.args[0].value, node


def _module_names(mod: Module) -> set[str] | None:
    """Names a module defines at top level (also inside top-level if/try);
    None when a module-level __getattr__ makes any name possible."""
    names: set[str] = set(mod.imports)
    pending = list(mod.tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name == "__getattr__":
                return None
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.If, ast.Try)):
            pending += node.body + node.orelse + getattr(node, "finalbody", [])
            pending += [s for h in getattr(node, "handlers", []) for s in h.body]
    return names


def _guarded_imports(tree: ast.AST) -> set[int]:
    """ids of imports inside a `try` body: optional by design, not checked."""
    return {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try)
            for stmt in t.body for n in ast.walk(stmt)}


def check_imports(host_name: str, sources: Sources, roots: dict[str, Path]) -> tuple[int, list[Finding]]:
    """Every host module and name our adapter modules import, and every host
    base class they name, exists in this host."""
    hosts = {r.split(".")[0] for r in roots if not _ours(r)}

    def is_host(module: str) -> bool:
        return module.split(".")[0] in hosts and not _ours(module)

    checked, findings = 0, []
    for package in ADAPTER_PACKAGES:
        for mod_name in sources.modules_under(package):
            mod = sources.module(mod_name)
            if mod is None:
                continue
            guarded = _guarded_imports(mod.tree)
            for node in ast.walk(mod.tree):
                if id(node) in guarded:
                    continue
                wanted: list[tuple[str, str | None]] = []
                if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    wanted = [(node.module, a.name) for a in node.names]
                elif isinstance(node, ast.Import):
                    wanted = [(a.name, None) for a in node.names]
                for module, name in wanted:
                    if not is_host(module):
                        continue
                    checked += 1
                    where = f"{mod.path}:{node.lineno}"
                    target = sources.module(module)
                    if target is None and module in sources.unparsable:
                        continue
                    if target is None:
                        findings.append(Finding(host_name, mod_name, module, "import", where, "",
                                                "module not found in this host"))
                        continue
                    defined = _module_names(target)
                    if name and defined is not None and name not in defined \
                            and sources.module(f"{module}.{name}") is None:
                        findings.append(Finding(host_name, mod_name, f"{module}.{name}", "import",
                                                where, target.path, "not defined in this host"))
            for cls in mod.classes.values():
                ref = ClassRef(f"{mod_name}.{cls.name}", mod, cls)
                for base in _base_names(ref):
                    if is_host(base) and resolve(sources, base) is None \
                            and base.rpartition(".")[0] not in sources.unparsable:
                        findings.append(Finding(host_name, ref.qualname, base, "base",
                                                ref.where(), "", "base class not found in this host"))
    return checked, findings


def _host_class(sources: Sources, mod: Module, node: ast.AST | None,
                hosts: set[str]) -> ClassRef | None:
    """The host class an expression of our module names (`Name`, `pkg.Name`
    or a string annotation), or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return None
    dotted = _dotted(node) if node is not None else None
    if dotted is None:
        return None
    head, _, rest = dotted.partition(".")
    if head not in mod.imports:
        return None
    qualname = mod.imports[head] + (f".{rest}" if rest else "")
    if qualname.split(".")[0] not in hosts or _ours(qualname):
        return None
    return resolve(sources, qualname)


def _typed_names(sources: Sources, mod: Module, fn: ast.AST,
                 hosts: set[str]) -> dict[str, ClassRef]:
    """Local names of `fn` known to hold an instance of a host class."""
    out: dict[str, ClassRef] = {}
    args = fn.args
    for a in args.posonlyargs + args.args + args.kwonlyargs:
        ref = _host_class(sources, mod, a.annotation, hosts)
        if ref is not None:
            out[a.arg] = ref
    for node in ast.walk(fn):
        target, cls = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.value, ast.Call):
            target, cls = node.targets[0], node.value.func
        elif isinstance(node, ast.AnnAssign):
            target, cls = node.target, node.annotation
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id == "isinstance" and len(node.args) == 2):
            target, cls = node.args[0], node.args[1]
        if isinstance(target, ast.Name):
            ref = _host_class(sources, mod, cls, hosts)
            if ref is not None:
                out[target.id] = ref
    return out


def _functions(mod: Module) -> Iterator[tuple[str, ast.AST]]:
    """(qualified name, function) of every function and method in a module."""
    for node in mod.tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{mod.name}.{node.name}", node
        elif isinstance(node, ast.ClassDef):
            for fn in node.body:
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{mod.name}.{node.name}.{fn.name}", fn


def _init_of(sources: Sources, ref: ClassRef) -> tuple[ClassRef, ast.AST] | None:
    """Where a host class's constructor is defined (its own or inherited)."""
    return host_lookup(mro(sources, ref), "__init__", concrete=True)


def check_host_objects(host_name: str, sources: Sources,
                       roots: dict[str, Path]) -> tuple[int, list[Finding]]:
    """Constructor calls of host classes, and members used on host objects
    other than `self`, in every function of our adapter modules."""
    hosts = {r.split(".")[0] for r in roots if not _ours(r)}
    checked, findings = 0, []
    fn_types = (ast.FunctionDef, ast.AsyncFunctionDef)
    for package in ADAPTER_PACKAGES:
        for mod_name in sources.modules_under(package):
            mod = sources.module(mod_name)
            if mod is None:
                continue
            for where_fn, fn in _functions(mod):
                typed = _typed_names(sources, mod, fn, hosts)
                called = {id(n.func): n for n in ast.walk(fn) if isinstance(n, ast.Call)}
                for node in ast.walk(fn):
                    at = f"{mod.path}:{getattr(node, 'lineno', fn.lineno)}"
                    if isinstance(node, ast.Call):
                        cls = _host_class(sources, mod, node.func, hosts)
                        if cls is None:
                            continue
                        hit = _init_of(sources, cls)
                        if hit is None or not isinstance(hit[1], fn_types):
                            continue  # object.__init__ or one we cannot read
                        checked += 1
                        for p in call_problems(node, signature(hit[1])):
                            findings.append(Finding(host_name, where_fn, cls.qualname,
                                                    "constructor", at, hit[0].where(hit[1]), p))
                    elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
                          and isinstance(node.value, ast.Name) and node.value.id in typed):
                        cls = typed[node.value.id]
                        chain = mro(sources, cls)
                        hit = host_lookup(chain, node.attr, concrete=True)
                        if hit is None and (opaque_bases(sources, chain)
                                            or node.attr in OBJECT_MEMBERS):
                            continue  # may be defined where we cannot read
                        checked += 1
                        member = f"{node.value.id}.{node.attr}"
                        if hit is None:
                            findings.append(Finding(
                                host_name, where_fn, member, "host object", at, cls.where(),
                                f"{cls.qualname} has no attribute {node.attr!r}"))
                        elif id(node) in called and isinstance(hit[1], fn_types) \
                                and not _is_property(hit[1]):
                            for p in call_problems(called[id(node)], signature(hit[1])):
                                findings.append(Finding(host_name, where_fn, member,
                                                        "host object", at,
                                                        hit[0].where(hit[1]), p))
    return checked, _dedupe(findings)


# ============================================================== contracts
HOST_SELECTION = "host.toml"  # in vllm_ascend/vspec/: the host's overlay.toml


def host_routing(roots: dict[str, Path]) -> dict | None:
    """The `[routing]` table of the host's host.toml (from a directory or a
    wheel), or None without one."""
    root = roots.get("vllm_ascend.vspec")
    if root is None:
        return None
    if root.is_file():
        with zipfile.ZipFile(root) as zf:
            member = f"vllm_ascend/vspec/{HOST_SELECTION}"
            text = zf.read(member).decode() if member in zf.namelist() else None
    else:
        path = root / HOST_SELECTION
        text = path.read_text() if path.is_file() else None
    return None if text is None else tomllib.loads(text).get("routing", {})


def routed_classes(roots: dict[str, Path]) -> list[str] | None:
    """Qualified names of the classes the host's routing selects (its
    host.toml), or None without one."""
    routing = host_routing(roots)
    if routing is None:
        return None
    paths = list(routing.get("proposers", {}).values())
    paths += [routing[key] for key in ("sampler", "model_runner") if key in routing]
    return [p.replace(":", ".") for p in paths]


def _body(fn: ast.AST) -> list[ast.stmt]:
    """A function's statements without its docstring."""
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return body


def _self_attr(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
            and node.value.id == "self":
        return node.attr
    return None


def _setter(ref: ClassRef, name: str) -> ast.FunctionDef | None:
    return next((n for n in ref.node.body if isinstance(n, ast.FunctionDef) and n.name == name
                 and any(_dotted(d) == f"{name}.setter" for d in n.decorator_list)), None)


def _plain_store(getter: ast.AST, setter: ast.FunctionDef) -> bool:
    """Setter `self.a = value`, getter `return self.a`: what is stored reads back."""
    body, params = _body(setter), signature(setter)
    if len(body) != 1 or not isinstance(body[0], ast.Assign) or not params \
            or len(body[0].targets) != 1:
        return False
    stored = _self_attr(body[0].targets[0])
    value = body[0].value
    if stored is None or not (isinstance(value, ast.Name) and value.id == params[0].name):
        return False
    returns = _body(getter)
    return len(returns) == 1 and isinstance(returns[0], ast.Return) \
        and _self_attr(returns[0].value) == stored


def _stores(setter: ast.FunctionDef) -> list[str]:
    return sorted({a for n in ast.walk(setter) for t in getattr(n, "targets", [])
                   if (a := _self_attr(t)) is not None})


def check_contracts(host_name: str, sources: Sources, ref: ClassRef) -> tuple[int, list[Finding]]:
    """The `contract` rule (module docstring) for one class."""
    chain = mro(sources, ref)
    ours = [c for c in chain if c.ours]
    host = [c for c in chain if not c.ours]
    fn_types = (ast.FunctionDef, ast.AsyncFunctionDef)
    props: dict[str, tuple[ClassRef, ast.AST]] = {}
    for c in ours:
        for node in c.node.body:
            if _is_property(node):
                props.setdefault(node.name, (c, node))
    # Host methods that run: the first host definition of each name, unless
    # ours overrides it without ever calling on.
    ours_fns: dict[str, list[ast.AST]] = {}
    for c in ours:
        for node in c.node.body:
            if isinstance(node, fn_types) and not _is_property(node):
                ours_fns.setdefault(node.name, []).append(node)
    running: dict[str, tuple[ClassRef, ast.AST]] = {}
    for c in host:
        for node in c.node.body:
            if isinstance(node, fn_types) and not _is_property(node):
                running.setdefault(node.name, (c, node))
    for name, fns in ours_fns.items():
        if name in running and not any(m == name and via for fn in fns
                                       for _, m, via in _self_calls(fn)):
            del running[name]
    checked, findings = 0, []
    for prop, (owner, getter) in sorted(props.items()):
        setter = _setter(owner, prop)
        if setter is None or _plain_store(getter, setter):
            continue
        for method, (href, fn) in sorted(running.items()):
            if method in CONSTRUCTORS:
                continue
            writes = [n for n in ast.walk(fn) if isinstance(n, (ast.Assign, ast.AnnAssign,
                                                                   ast.AugAssign))
                      and any(_self_attr(t) == prop for t in
                              (n.targets if isinstance(n, ast.Assign) else [n.target]))]
            if not writes:
                continue
            checked += 1
            first = min(w.lineno for w in writes)
            reads = sorted(n.lineno for n in ast.walk(fn) if isinstance(n, ast.Attribute)
                           and isinstance(n.ctx, ast.Load) and _self_attr(n) == prop
                           and n.lineno > first)
            if reads:
                findings.append(Finding(
                    host_name, ref.qualname, prop, "contract", owner.where(setter),
                    f"{href.module.path}:{first}",
                    f"{href.qualname.rpartition('.')[2]}.{method} assigns self.{prop} on every "
                    f"call and reads it back (line {reads[0]}), but our property is not a plain "
                    f"store: its setter writes self.{', self.'.join(_stores(setter))} and its "
                    "getter answers something else, so the host's per-call value is lost and "
                    "what the overlay keeps fixed changes"))
    return checked, findings


def check_routed(host_name: str, sources: Sources, roots: dict[str, Path]
                 ) -> tuple[int, list[Finding]]:
    """The contract rule over the classes the host's routing selects."""
    routed = routed_classes(roots)
    refs = [r for r in adapter_classes(sources)] if routed is None else []
    checked, findings = 0, []
    for qualname in routed or []:
        ref = resolve(sources, qualname)
        if ref is None:
            findings.append(Finding(host_name, qualname, qualname.rpartition(".")[2], "contract",
                                    f"{roots['vllm_ascend.vspec']}/{HOST_SELECTION}", "",
                                    "routed by host.toml, but the tree does not define it"))
        else:
            refs.append(ref)
    for ref in refs:
        n, found = check_contracts(host_name, sources, ref)
        checked += n
        findings += found
    return checked, _dedupe(findings)


# The host function that picks a proposer per method, and its vLLM's config
# class whose methods a `speculative_config.<name>` test calls.
SPEC_DECODE_FACTORY = ("vllm_ascend.spec_decode", "get_spec_decode_method")
SPECULATIVE_CONFIG = "vllm.config.speculative.SpeculativeConfig"


def _compared_methods(test: ast.AST, param: str) -> set[str] | None:
    """The method names an `if` test compares `param` with (`== "x"`,
    `in ("x", "y")`), or None when it compares none."""
    found: set[str] | None = None
    for node in ast.walk(test):
        if not (isinstance(node, ast.Compare) and isinstance(node.left, ast.Name)
                and node.left.id == param and len(node.ops) == 1):
            continue
        right = node.comparators[0]
        values = right.elts if isinstance(right, (ast.Tuple, ast.List, ast.Set)) else [right]
        names = {v.value for v in values if isinstance(v, ast.Constant)
                 and isinstance(v.value, str)}
        if isinstance(node.ops[0], (ast.Eq, ast.In)):
            found = names if found is None else found & names
    return found


def _test_name(call: ast.Call, mod: Module) -> str:
    """A test as host.toml names it: `speculative_config.<method>` for a
    method called on the speculative config, `<module>:<function>` for an
    imported function, else the call as written."""
    dotted = _dotted(call.func) or ast.unparse(call.func)
    parts = dotted.split(".")
    if "speculative_config" in parts[:-1]:
        return f"speculative_config.{parts[-1]}"
    if len(parts) == 1 and dotted in mod.imports:
        module, _, name = mod.imports[dotted].rpartition(".")
        return f"{module}:{name}"
    return dotted


def factory_tests(fn: ast.FunctionDef, mod: Module) -> list[tuple[set[str] | None, str, int]]:
    """(methods that can reach it, or None for any; test; line) of every call
    in an `if` test of the factory function."""
    param = fn.args.args[0].arg if fn.args.args else "method"
    out: list[tuple[set[str] | None, str, int]] = []

    def walk(stmts: list[ast.stmt], methods: set[str] | None) -> None:
        for st in stmts:
            if not isinstance(st, ast.If):
                continue
            compared = _compared_methods(st.test, param)
            branch = methods if compared is None else (
                compared if methods is None else methods & compared)
            out.extend((branch, _test_name(c, mod), st.lineno)
                       for c in ast.walk(st.test) if isinstance(c, ast.Call))
            walk(st.body, branch)
            walk(st.orelse, methods)

    walk(fn.body, None)
    return out


def check_keep_host(host_name: str, sources: Sources, roots: dict[str, Path]
                    ) -> tuple[int, list[Finding]]:
    """The `keep_host` rule (module docstring)."""
    routing = host_routing(roots)
    module_name, fn_name = SPEC_DECODE_FACTORY
    mod = sources.module(module_name) if routing is not None else None
    fn = next((n for n in mod.tree.body if isinstance(n, ast.FunctionDef)
               and n.name == fn_name), None) if mod is not None else None
    if fn is None:
        return 0, []
    where = f"{roots['vllm_ascend.vspec']}/{HOST_SELECTION}"
    keep = routing.get("keep_host", {})
    tests = factory_tests(fn, mod)
    config = resolve(sources, SPECULATIVE_CONFIG)
    checked, findings = 0, []
    for method in routing.get("proposers", {}):
        made = {t: line for methods, t, line in tests if methods is None or method in methods}
        listed = list(keep.get(method, []))
        for test, line in made.items():
            checked += 1
            if test not in listed:
                findings.append(Finding(
                    host_name, "[routing.keep_host]", method, "keep_host", where,
                    f"{mod.path}:{line}",
                    f"{fn_name} tests {test} before it builds a proposer for method {method}, "
                    f"and host.toml does not list it: routing would replace whatever proposer "
                    "the host builds when it holds (add it to the method's list)"))
        for test in listed:
            checked += 1
            if test not in made:
                findings.append(Finding(
                    host_name, "[routing.keep_host]", method, "keep_host", where, mod.path,
                    f"lists {test}, which {fn_name} does not test for method {method}"))
            module, sep, name = test.partition(":")
            target = sources.module(module) if sep else None
            if sep and (target is None or name not in (_module_names(target) or {name})):
                findings.append(Finding(host_name, "[routing.keep_host]", method, "keep_host",
                                        where, "", f"{test}: no such function in this host"))
            elif not sep and config is not None and test.startswith("speculative_config.") \
                    and test.rpartition(".")[2] not in class_members(config):
                findings.append(Finding(host_name, "[routing.keep_host]", method, "keep_host",
                                        where, config.where(),
                                        f"{test}: {config.qualname} has no such method"))
    return checked, findings


def check_host(name: str, roots: dict[str, Path]) -> HostReport:
    sources = Sources(roots)
    report = HostReport(name, {k: str(v) for k, v in sorted(roots.items())})
    report.checked, report.findings = check_imports(name, sources, roots)
    checked, findings = check_host_objects(name, sources, roots)
    report.checked += checked
    report.findings += findings
    for ref in adapter_classes(sources):
        if not any(not c.ours and c.module.name.split(".")[0] in roots for c in mro(sources, ref)):
            continue
        report.classes[ref.qualname] = [c.qualname for c in mro(sources, ref) if not c.ours]
        checked, findings = check_class(name, sources, ref)
        report.checked += checked
        report.findings += findings
    for check in (check_routed, check_keep_host):
        checked, findings = check(name, sources, roots)
        report.checked += checked
        report.findings += findings
    if not report.classes and not report.findings:
        report.skipped = "no adapter class subclasses this host"
    return report


# ========================================================== vLLM releases
# The wheels of the supported vLLM releases (hosts/vllm/releases.py) live
# in the repository's download cache beside the Ascend pins' vLLM wheels
# (.cache/vllm-wheel/), fetched from the index and kept only when their
# SHA-256 is the pinned one. Only their .py files are read.
RELEASE_CACHE = "vllm-wheel"


def vllm_only_roots(roots: dict[str, Path]) -> dict[str, Path]:
    """Our package roots for a plain vLLM host (no Ascend overlay modules)."""
    return {k: v for k, v in roots.items() if k == "vllm_vspec"}


def fetch_release(release, cache: Path) -> Path:
    """The release's wheel in `cache`/vllm-wheel, downloaded and verified
    when absent (tools/ascend_build/common.fetch_verified)."""
    from vllm_vspec.hosts.vllm.releases import SOURCE_PROJECT
    from vllm_vspec.tools.ascend_build import common

    return common.fetch_verified(cache / RELEASE_CACHE, SOURCE_PROJECT, release.wheel,
                                 release.sha256)


def check_releases(ours: dict[str, Path], cache: Path) -> list[HostReport]:
    """The check on every supported vLLM release's sources, one report each."""
    from vllm_vspec.hosts.vllm.releases import RELEASES

    return [check_host(f"vllm {r.version} ({r.wheel})",
                       {"vllm": fetch_release(r, cache), **vllm_only_roots(ours)})
            for r in RELEASES]


def main(argv: list[str] | None = None) -> int:
    """`python -m vllm_vspec.tools.abi_check`: fetch the supported releases'
    wheels into the cache (`make vllm-sources`) and check our adapters
    against each; exit 1 on any finding."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m vllm_vspec.tools.abi_check",
                                description=main.__doc__.split("\n\n")[0])
    p.add_argument("--cache", type=Path, default=Path(".cache"),
                   help="download cache (default: .cache, the repository's)")
    args = p.parse_args(argv)
    ours = {"vllm_vspec": Path(__file__).resolve().parents[1]}
    reports = check_releases(ours, args.cache)
    for r in reports:
        print(f"ABI {r.name}: {'OK' if r.ok else 'MISMATCH'} "
              f"({len(r.classes)} classes, {r.checked} checks)")
        for f in r.findings:
            print(f"  {f.line()}")
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    raise SystemExit(main())
