"""What a C++ declaration or statement holds, for the static rules: just enough to tell state from
code, a function from a variable, and which names carry a value derived from others.

Heuristic by design, like :mod:`.cxx` (which masks and scopes the source): a program that hides its
declarations behind macros can fool it, which is why the dynamic checks and the built library's
imports are judged as well.
"""

from __future__ import annotations

import re
from typing import Iterable

from . import cxx

_SKIP_DECL = re.compile(r"^(?:typedef|using|static_assert|friend|namespace|template\s*<[^;]*>\s*(?:struct|class|"
                        r"union)\s+\w+\s*$|(?:struct|class|union|enum(?:\s+class)?)\s+[\w:]+\s*(?::[^{]*)?$|"
                        r"public|private|protected)\b")


def analyse_decl(text: str, *, class_member: bool, local: bool = False) -> tuple[str, str] | None:
    """None when the statement holds no mutable state; else (rule id, what it is)."""
    t = " ".join(text.split())
    t = re.sub(r"^(?:\[\[[^\]]*\]\]\s*|__attribute__\s*\(\(.*?\)\)\s*|alignas\s*\([^)]*\)\s*|ST_API\s+)+", "", t)
    if not t:
        return None
    tmpl = re.match(r"^template\s*<", t)
    if tmpl:
        close = angle_close(t, tmpl.end() - 1)
        t = t[close + 1:].strip()
    if _SKIP_DECL.match(t) or re.match(r'^extern\b(?!\s*"\s*"\s*\{)', t):
        return None
    if class_member and not re.search(r"\bstatic\b", t):
        return None  # instance members are the program's own state
    # struct/class/union/enum definitions: state only if a variable is declared after the body
    body = re.match(r"^(?:(?:static|const|constexpr|volatile|inline)\s+)*(?:struct|class|union|enum)\b[^{;]*\{", t)
    if body:
        close = cxx.matching(t, body.end() - 1, "{", "}")
        after = t[close + 1:].strip()
        if not after:
            return None
        t = t[:body.end() - 1] + " " + after
    eq = cxx._depth0(t, "=")
    lhs, init = (t[:eq], t[eq + 1:].strip()) if eq >= 0 else (t, "")
    if not init:
        brace = re.search(r"\{.*\}\s*$", lhs)
        if brace and not re.search(r"\)\s*$", lhs[:brace.start()]):
            init = brace.group(0)
            lhs = lhs[:brace.start()]
    if eq < 0 and looks_like_function(lhs):
        return None
    words = set(re.findall(r"[A-Za-z_]\w*", lhs))
    if words & {"constexpr", "consteval", "__shared__"}:
        return None
    if "__managed__" in words:
        return "host-state-global", "__managed__ variable"
    top_const = top_level_const(lhs)
    if "__constant__" in words or "__device__" in words:
        if top_const and "__constant__" not in words:
            return None
        if local:
            return None
        return "device-global-state", "__constant__ variable" if "__constant__" in words else "__device__ variable"
    if "thread_local" in words:
        return ("host-state-static-local" if local else "host-state-global"), "thread_local variable"
    if top_const:
        return None
    if string_literal_init(init) or init.startswith("["):
        return None  # pointer to a string literal, or a captureless lambda
    rule = "host-state-static-local" if local else "host-state-global"
    return rule, "mutable variable"


def top_level_const(lhs: str) -> bool:
    decl = re.sub(r"\[[^\]]*\]", "", lhs)
    decl = re.sub(r"<[^<>]*(?:<[^<>]*>[^<>]*)*>", "", decl)  # template arguments say nothing of the object
    if "*" in decl or "&" in decl:
        last = max(decl.rfind("*"), decl.rfind("&"))
        tail = decl[last + 1:]
        if decl[last] == "&":
            return bool(re.search(r"\bconst\b", decl[:last]))  # a reference to const
        return bool(re.search(r"\bconst\b", tail))
    return bool(re.search(r"\bconst\b", decl))


def string_literal_init(init: str) -> bool:
    lit = r'(?:u8|[uUL])?R?"[^"]*"'
    if re.fullmatch(rf"\s*(?:{lit}\s*)+", init):
        return True
    return bool(re.fullmatch(rf"\s*\{{\s*(?:(?:{lit}\s*)+,?\s*)*\}}\s*", init))


def looks_like_function(lhs: str) -> bool:
    """``T name(params)`` with declarations as parameters (not ``Foo g(1, 2)``)."""
    s = lhs.strip()
    s = re.sub(r"^(?:static|thread_local)\s+", "", s)
    m = re.search(r"([~\w:]+)\s*\((.*)\)\s*(?:const|noexcept|override|final|throw\s*\(\s*\)|\s)*(?:->\s*[\w:<>\*& ]+)?$",
                  s, re.S)
    if not m or re.search(r"\(\s*\*", s):
        return False
    if not re.search(r"[\w>\*&]\s+[\*&]*\s*[~\w:]+\s*\($", s[:m.end(1)] + "(") and "operator" not in s:
        return False
    inner = m.group(2).strip()
    if inner in ("", "void"):
        return True
    for p in cxx.split_args(inner):
        p = p.split("=")[0].strip()
        if not p or p == "...":
            continue
        if re.fullmatch(r"[-+]?[\d.]+[fFlLuU]*|nullptr|NULL|true|false|\"[^\"]*\"|'.*'", p):
            return False
        toks = re.findall(r"[A-Za-z_][\w:]*|[\*&]", p)
        if len(toks) < 2 and not re.fullmatch(r"[A-Za-z_][\w:]*(?:<.*>)?", p):
            return False
        if len(toks) < 2 and p not in ("int", "float", "double", "char", "bool", "size_t"):
            # a single identifier: a type (unnamed parameter) or a variable (constructor argument);
            # types start upper-case or end in _t by convention
            if not re.fullmatch(r"(?:[A-Z]\w*|\w+_t|\w+::\w+)(?:<.*>)?", p):
                return False
    return True


def declared_name(text: str) -> str:
    t = " ".join(text.split())
    fp = re.search(r"\(\s*\*\s*([A-Za-z_]\w*)\s*\)", t)
    if fp:
        return fp.group(1)
    eq = cxx._depth0(t, "=")
    lhs = t[:eq] if eq >= 0 else t
    lhs = re.sub(r"\{.*\}\s*$", "", lhs)
    lhs = re.sub(r"\[[^\]]*\]", "", lhs)
    lhs = re.sub(r"\(.*\)\s*$", "", lhs) if not re.search(r"\(\s*\*", lhs) else lhs
    names = re.findall(r"[A-Za-z_]\w*", lhs)
    return names[-1] if names else "?"


def prev_char(code: str, i: int) -> str:
    """The last non-blank character before offset ``i`` ("" at the start)."""
    j = i - 1
    while j >= 0 and code[j].isspace():
        j -= 1
    return code[j] if j >= 0 else ""


def statement_end(code: str, at: int) -> int:
    depth = 0
    for k in range(at, len(code)):
        c = code[k]
        if c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
            if depth < 0:
                return k
        elif c == ";" and depth == 0:
            return k
    return len(code)


def angle_close(s: str, open_at: int) -> int:
    depth = 0
    for k in range(open_at, len(s)):
        c = s[k]
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
            if depth == 0:
                return k
        elif c in ";{":
            return k
    return len(s)


def statements(code: str, a: int, b: int) -> Iterable[tuple[int, str]]:
    """Top-level-ish statements of a body: split on ; { } (good enough for uses of a name)."""
    start = a
    for k in range(a, b):
        if code[k] in ";{}":
            if code[start:k].strip():
                yield start, code[start:k]
            start = k + 1
    if code[start:b].strip():
        yield start, code[start:b]


def plain_alias(stmt: str, names: set[str]) -> bool:
    m = re.match(r"^(?:[\w:<>\s\*&]+?[\s\*&])?(\w+)\s*=\s*(.*)$", stmt.strip(), re.S)
    return bool(m) and bool(cxx.identifiers(m.group(2)) & names)


def aliases(body: str, base: set[str], *, plain_only: bool = False) -> set[str]:
    """Names that hold (a value derived from) one of ``base``: ``T x = f(base)`` and ``x = base``.

    With ``plain_only`` only plain variables count (not ``g.out = out[0].data``, whose root ``g``
    then holds much else besides)."""
    names = set(base)
    for _ in range(3):
        grew = False
        for _, stmt in statements(body, 0, len(body)):
            s = " ".join(stmt.split())
            eq = cxx._depth0(s, "=")
            if eq <= 0:
                continue
            lhs, rhs = s[:eq].strip(), s[eq + 1:]
            if not (cxx.identifiers(rhs) & names):
                continue
            if plain_only:
                m = re.search(r"([A-Za-z_]\w*)\s*$", lhs)
                if not m or re.search(r"(?:\.|->)\s*[A-Za-z_]\w*\s*$", lhs):
                    continue
            else:
                m = re.search(r"([A-Za-z_]\w*)\s*(?:(?:\.|->)\s*\w+|\[[^\]]*\])*\s*$", lhs)
            if m and m.group(1) not in names:
                names.add(m.group(1))
                grew = True
        if not grew:
            break
    return names


__all__ = ["analyse_decl", "top_level_const", "string_literal_init", "looks_like_function", "declared_name",
           "prev_char", "statement_end", "angle_close", "statements", "plain_alias", "aliases"]
