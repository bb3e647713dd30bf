"""Reading sgl-kernel's CMakeLists on the control node: its commands, options, FetchContent declarations, and the
GPU architectures each library will be compiled for under given options (the gencode lists are written in the file)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_FALSE = {"", "0", "OFF", "NO", "FALSE", "N", "IGNORE", "NOTFOUND"}
_GENCODE = re.compile(r"-gencode=arch=compute_(\w+),code=(sm_\w+)")
_COMMAND = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_BINARY = {"VERSION_GREATER_EQUAL", "VERSION_LESS_EQUAL", "VERSION_GREATER", "VERSION_LESS", "VERSION_EQUAL",
           "STREQUAL", "MATCHES", "EQUAL", "LESS", "GREATER", "LESS_EQUAL", "GREATER_EQUAL"}


class Quoted(str):
    """An argument that was written in quotes (its parentheses are text, not grouping)."""


class CMakeError(ValueError):
    """A CMakeLists that cannot be read as commands."""


@dataclass(frozen=True)
class Command:
    """One CMake command invocation: its (lower-cased) name, its arguments (quotes removed) and its line."""

    name: str
    args: tuple[str, ...]
    line: int


def strip_comments(text: str) -> str:
    out = []
    for line in text.splitlines():
        quoted, cut, escaped = False, len(line), False
        for i, ch in enumerate(line):
            if escaped:
                escaped = False
            elif ch == "\\" and quoted:
                escaped = True
            elif ch == '"':
                quoted = not quoted
            elif ch == "#" and not quoted:
                cut = i
                break
        out.append(line[:cut])
    return "\n".join(out)


def _arguments(text: str, start: int) -> tuple[list[str], int]:
    """The arguments of a command whose "(" ends just before start; quoted arguments keep their spaces."""
    depth, i, args, cur, quoted = 1, start, [], None, False
    while i < len(text):
        ch = text[i]
        if quoted:
            if ch == "\\" and i + 1 < len(text):
                cur = (cur or "") + text[i + 1]  # an escaped character stays in the argument
                i += 2
                continue
            if ch == '"':
                quoted = False
                args.append(Quoted(cur or ""))
                cur = None
            else:
                cur = (cur or "") + ch
        elif ch == '"':
            quoted, cur = True, ""
        elif ch.isspace():
            if cur is not None:
                args.append(cur)
            cur = None
        else:
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
                if depth == 0:
                    if cur is not None:
                        args.append(cur)
                    return args, i + 1
            cur = (cur or "") + ch
        i += 1
    raise CMakeError("unbalanced parentheses")


def commands(text: str) -> list[Command]:
    """Every top-level command of a CMakeLists, in order."""
    text = strip_comments(text)
    found, pos = [], 0
    while (m := _COMMAND.search(text, pos)) is not None:
        args, pos = _arguments(text, m.end())
        found.append(Command(m.group(1).lower(), tuple(args), text.count("\n", 0, m.start()) + 1))
    return found


def truthy(value: str | None) -> bool:
    if value is None:
        return False
    v = value.strip().upper()
    return not (v in _FALSE or v.endswith("-NOTFOUND"))


@dataclass
class Evaluation:
    """What a CMakeLists will do under some variables: each library target and the architectures it compiles for."""

    variables: dict[str, str]
    options: dict[str, str] = field(default_factory=dict)  # option() defaults as written
    forced: dict[str, str] = field(default_factory=dict)  # set(OPTION value) that overrides what the user passed
    lists: dict[str, list[str]] = field(default_factory=dict)  # flag lists with the gencodes they gather
    targets: dict[str, list[str]] = field(default_factory=dict)  # library target -> sm_XX it will compile
    unknown: list[str] = field(default_factory=list)  # conditions that could not be decided
    variables_read: set[str] = field(default_factory=set)  # every name a condition or ${} expansion mentions

    def archs(self) -> list[str]:
        return sorted({a for arch in self.targets.values() for a in arch}, key=_arch_key)


def _arch_key(arch: str) -> tuple[int, str]:
    m = re.match(r"sm_(\d+)(\w*)", arch)
    return (int(m.group(1)), m.group(2)) if m else (0, arch)


class _Cond:
    def __init__(self, tokens: list[str], variables: dict[str, str], unknown: list[str]):
        self.t, self.i, self.v, self.unknown = tokens, 0, variables, unknown

    def value(self, token: str) -> str | None:
        token = re.sub(r"\$\{(\w+)\}", lambda m: self.v.get(m.group(1), ""), token)
        return self.v.get(token, token)

    def parse(self) -> bool:
        result = self.or_()
        return result

    def or_(self) -> bool:
        left = self.and_()
        while self.i < len(self.t) and self.t[self.i].upper() == "OR":
            self.i += 1
            right = self.and_()
            left = left or right
        return left

    def and_(self) -> bool:
        left = self.not_()
        while self.i < len(self.t) and self.t[self.i].upper() == "AND":
            self.i += 1
            right = self.not_()
            left = left and right
        return left

    def not_(self) -> bool:
        if self.i < len(self.t) and self.t[self.i].upper() == "NOT":
            self.i += 1
            return not self.not_()
        return self.atom()

    def atom(self) -> bool:
        tok = self.t[self.i]
        self.i += 1
        if tok == "(":
            result = self.or_()
            self.i += 1  # ")"
            return result
        if tok.upper() == "DEFINED" and self.i < len(self.t):
            name = self.t[self.i]
            self.i += 1
            return name in self.v
        if tok.upper() in ("POLICY", "EXISTS", "COMMAND", "TARGET") and self.i < len(self.t):
            self.i += 1
            self.unknown.append(f"{tok} {self.t[self.i - 1]}")
            return True
        if self.i < len(self.t) and self.t[self.i].upper() in _BINARY:
            op = self.t[self.i].upper()
            right = self.t[self.i + 1]
            self.i += 2
            return self.compare(tok, op, right)
        if tok.startswith("${") or tok in self.v:
            return truthy(self.value(tok))
        if tok.upper() in _FALSE or tok.upper() in {"ON", "YES", "TRUE", "Y"} or tok.isdigit():
            return truthy(tok)
        return False  # an unset variable named bare is false in CMake

    def compare(self, left: str, op: str, right: str) -> bool:
        a, b = self.value(left) or "", self.value(right) or ""
        if op == "MATCHES":
            return re.search(b, a) is not None
        if op == "STREQUAL":
            return a == b
        if op.startswith("VERSION_"):
            if not a or not b:
                self.unknown.append(f"{left} {op} {right}")
                return False
            va, vb = _version(a), _version(b)
            return {"VERSION_GREATER_EQUAL": va >= vb, "VERSION_LESS_EQUAL": va <= vb, "VERSION_GREATER": va > vb,
                    "VERSION_LESS": va < vb, "VERSION_EQUAL": va == vb}[op]
        try:
            x, y = float(a), float(b)
        except ValueError:
            self.unknown.append(f"{left} {op} {right}")
            return False
        return {"EQUAL": x == y, "LESS": x < y, "GREATER": x > y, "LESS_EQUAL": x <= y, "GREATER_EQUAL": x >= y}[op]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:4])


def _tokens(args: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for a in args:
        out += [a] if isinstance(a, Quoted) else re.findall(r"\(|\)|[^()]+", a)
    return [t for t in out if t.strip() or isinstance(t, Quoted)]


def evaluate(text: str, defines: dict[str, str], *, cuda_version: str, processor: str = "x86_64") -> Evaluation:
    """Walk the CMakeLists' if/elseif/else blocks under the given -D values, CUDA version and processor, gathering
    option() defaults, set()s of options, gencodes appended to flag lists, and which list each library target uses."""
    cmds = commands(text)
    mentioned = {m for c in cmds for a in c.args for m in re.findall(r"\$\{(\w+)\}", a)}
    mentioned |= {a for c in cmds if c.name in ("if", "elseif") for a in c.args}
    variables = {"CUDA_VERSION": cuda_version, "CMAKE_SYSTEM_PROCESSOR": processor, **defines}
    ev = Evaluation(variables, variables_read=mentioned)
    stack: list[list[bool]] = []  # per open if: [this branch active, some branch taken]
    libraries: list[str] = []

    def active() -> bool:
        return all(frame[0] for frame in stack)

    def cond(args) -> bool:
        try:
            return _Cond(_tokens(args), variables, ev.unknown).parse()
        except (IndexError, re.error):
            ev.unknown.append(" ".join(args))
            return False

    for c in cmds:
        if c.name == "if":
            on = active() and cond(c.args)
            stack.append([on, on])
            continue
        if c.name == "elseif" and stack:
            frame = stack.pop()
            on = not frame[1] and active() and cond(c.args)
            stack.append([on, frame[1] or on])
            continue
        if c.name == "else" and stack:
            frame = stack.pop()
            stack.append([not frame[1] and active(), True])
            continue
        if c.name == "endif" and stack:
            stack.pop()
            continue
        if not active() or not c.args:
            continue
        if c.name == "option" and len(c.args) >= 2:
            default = c.args[2] if len(c.args) > 2 else "OFF"
            ev.options[c.args[0]] = default
            variables.setdefault(c.args[0], default)
        elif c.name == "set" and c.args:
            name, values = c.args[0], [a for a in c.args[1:] if a not in ("CACHE", "PARENT_SCOPE")]
            if "CACHE" in c.args:
                variables.setdefault(name, values[0] if values else "")
                continue
            if name in ev.options and values:
                ev.forced[name] = values[0]
            gencodes = [m for a in values for m in _GENCODE.findall(a)]
            if gencodes or name in ev.lists:
                ev.lists[name] = [sm for _, sm in gencodes]
            elif len(values) <= 1:
                variables[name] = values[0] if values else ""
        elif c.name == "list" and len(c.args) >= 2 and c.args[0].upper() == "APPEND":
            name = c.args[1]
            gencodes = [sm for a in c.args[2:] for _, sm in _GENCODE.findall(a)]
            if gencodes or name in ev.lists:
                ev.lists.setdefault(name, []).extend(gencodes)
        elif c.name == "python_add_library":
            libraries.append(c.args[0])
            ev.targets.setdefault(c.args[0], [])
        elif c.name == "target_compile_options" and c.args[0] in ev.targets:
            for list_name in re.findall(r"\$\{(\w+)\}", " ".join(c.args[1:])):
                if list_name in ev.lists:
                    ev.targets[c.args[0]] = sorted(set(ev.targets[c.args[0]]) | set(ev.lists[list_name]),
                                                   key=_arch_key)
    return ev
