"""Just enough C++ lexing for the static rules: masks and scopes, no parser.

Rules must not fire on a comment that mentions torch or a string that says ``cudaStreamCreate``,
so every rule matches on a *masked* copy of the source in which comments (and, for most rules,
string and character literal contents) are replaced by spaces. Masking keeps every character's
offset and every newline, so a match's offset maps straight back to ``file:line``.

:func:`scan` then walks the braces of the code-only text and labels each ``{ … }`` block
(namespace, ``extern "C"``, class, enum, initializer, function body, inner block). From that the
rules get file-scope declarations, function bodies and the parameters of ``st_program_run``
without needing a real C++ front end. It is heuristic by design: a program that hides
declarations behind macros can fool it, which is why the dynamic checks exist as well.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

_IDENT_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


@dataclass(frozen=True)
class Masked:
    """Three views of one source, all the same length as the original."""

    original: str
    no_comments: str  # comments blanked; strings kept (for #include "…" and manifest literals)
    code: str  # comments and literal contents blanked, quotes kept; preprocessor lines kept
    code_no_pp: str  # ``code`` with preprocessor directives blanked too (for scope analysis)
    strings: tuple[tuple[int, int], ...]  # (start, end) of every string literal in ``original``

    def line_of(self, offset: int) -> int:
        return _line_index(self.original).line_of(offset)

    def line_text(self, line: int) -> str:
        lines = self.original.splitlines()
        return lines[line - 1] if 0 < line <= len(lines) else ""


class _LineIndex:
    def __init__(self, text: str):
        self.starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]

    def line_of(self, offset: int) -> int:
        return bisect.bisect_right(self.starts, offset)


_line_cache: dict[int, tuple[str, _LineIndex]] = {}


def _line_index(text: str) -> _LineIndex:
    key = id(text)
    hit = _line_cache.get(key)
    if hit is not None and hit[0] is text:
        return hit[1]
    idx = _LineIndex(text)
    if len(_line_cache) > 64:
        _line_cache.clear()
    _line_cache[key] = (text, idx)
    return idx


def _blank(s: str) -> str:
    return "".join(c if c == "\n" else " " for c in s)


def mask(source: str) -> Masked:
    """Blank comments and literal contents, keeping offsets and newlines."""
    n = len(source)
    nc = list(source)  # comments blanked
    code = list(source)  # comments and literal contents blanked
    strings: list[tuple[int, int]] = []
    i = 0
    while i < n:
        c = source[i]
        if c == "/" and i + 1 < n and source[i + 1] == "/":
            j = i
            while j < n and source[j] != "\n":
                if source[j] == "\\" and j + 1 < n and source[j + 1] == "\n":
                    j += 2  # a backslash-newline continues a // comment
                    continue
                j += 1
            for k in range(i, j):
                if source[k] != "\n":
                    nc[k] = code[k] = " "
            i = j
            continue
        if c == "/" and i + 1 < n and source[i + 1] == "*":
            j = source.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if source[k] != "\n":
                    nc[k] = code[k] = " "
            i = j
            continue
        if c == '"':
            raw = _raw_prefix(source, i)
            if raw is not None:
                j = _end_of_raw(source, i)
            else:
                j = _end_of_quoted(source, i, '"')
            strings.append((i, j))
            for k in range(i + 1, j - 1):
                if source[k] != "\n":
                    code[k] = " "
            i = j
            continue
        if c == "'":
            prev = source[i - 1] if i else ""
            nxt = source[i + 1] if i + 1 < n else ""
            if prev.isalnum() and nxt.isalnum() and _in_number(source, i):
                i += 1  # digit separator 1'000'000
                continue
            j = _end_of_quoted(source, i, "'")
            for k in range(i + 1, j - 1):
                code[k] = " "
            i = j
            continue
        i += 1
    code_s = "".join(code)
    return Masked(original=source, no_comments="".join(nc), code=code_s,
                  code_no_pp=_blank_preprocessor(code_s), strings=tuple(strings))


def _raw_prefix(s: str, quote: int) -> str | None:
    """The raw-string prefix (R, u8R, LR, uR, UR) ending just before ``quote``, if any."""
    j = quote - 1
    if j < 0 or s[j] != "R":
        return None
    k = j
    while k > 0 and s[k - 1] in "u8LU":
        k -= 1
    prefix = s[k:quote]
    if prefix not in ("R", "u8R", "uR", "UR", "LR"):
        return None
    if k > 0 and s[k - 1] in _IDENT_CHARS:
        return None
    return prefix


def _end_of_raw(s: str, quote: int) -> int:
    paren = s.find("(", quote + 1)
    if paren < 0 or paren - quote > 17:
        return _end_of_quoted(s, quote, '"')
    delim = s[quote + 1:paren]
    end = s.find(")" + delim + '"', paren + 1)
    return len(s) if end < 0 else end + len(delim) + 2


def _end_of_quoted(s: str, start: int, q: str) -> int:
    j = start + 1
    n = len(s)
    while j < n:
        c = s[j]
        if c == "\\":
            j += 2
            continue
        if c == q:
            return j + 1
        if c == "\n":  # unterminated: stop at the line end
            return j
        j += 1
    return n


def _in_number(s: str, i: int) -> bool:
    j = i - 1
    while j >= 0 and (s[j].isalnum() or s[j] in "'._"):
        j -= 1
    return s[j + 1].isdigit()


def _blank_preprocessor(code: str) -> str:
    out = list(code)
    lines = code.split("\n")
    pos = 0
    cont = False
    for line in lines:
        if cont or line.lstrip().startswith("#"):
            for k in range(pos, pos + len(line)):
                out[k] = " "
            cont = line.rstrip().endswith("\\")
        pos += len(line) + 1
    return "".join(out)


# ------------------------------------------------------------------ scopes


@dataclass
class Block:
    kind: str  # namespace | extern | class | enum | init | function | block
    open: int  # offset of "{"
    close: int  # offset of the matching "}" (len(text) when unbalanced)
    head: str  # code between the previous statement boundary and "{"
    head_start: int
    parent: int  # index into Scan.blocks, -1 for file scope

    @property
    def name(self) -> str:
        """For functions: the name before the parameter list."""
        m = re.search(r"([A-Za-z_~][\w:~]*)\s*\((?:[^()]|\([^()]*\))*\)[^()]*$", self.head)
        return m.group(1).split("::")[-1] if m else ""


@dataclass
class Decl:
    """A file-scope (namespace, extern "C" or class-member) statement ending in ";"."""

    start: int
    end: int
    text: str
    scope: str  # file | class


@dataclass
class Scan:
    masked: Masked
    blocks: list[Block] = field(default_factory=list)
    decls: list[Decl] = field(default_factory=list)

    def functions(self) -> list[Block]:
        return [b for b in self.blocks if b.kind == "function"]

    def function(self, name: str) -> Block | None:
        for b in self.functions():
            if b.name == name:
                return b
        return None

    def enclosing_function(self, offset: int) -> Block | None:
        best = None
        for b in self.blocks:
            if b.kind == "function" and b.open < offset < b.close:
                if best is None or b.open > best.open:
                    best = b
        return best


_FILE_KINDS = ("namespace", "extern")


def scan(masked: Masked) -> Scan:
    code = masked.code_no_pp
    result = Scan(masked)
    stack: list[int] = []  # indices of open blocks
    stmt_start = 0
    n = len(code)
    i = 0
    while i < n:
        c = code[i]
        # literal contents are blanked in ``code``, so quotes need no special care here
        parent_kind = result.blocks[stack[-1]].kind if stack else "file"
        if c == "{":
            head = code[stmt_start:i]
            kind = _classify(head, parent_kind)
            result.blocks.append(Block(kind, i, n, head, stmt_start, stack[-1] if stack else -1))
            stack.append(len(result.blocks) - 1)
            stmt_start = i + 1
        elif c == "}":
            if stack:
                b = result.blocks[stack.pop()]
                b.close = i
                if b.kind in ("class", "enum", "init"):
                    stmt_start = b.head_start  # the declaration goes on to its ";"
                else:
                    stmt_start = i + 1
            else:
                stmt_start = i + 1
        elif c == ";":
            if parent_kind in ("file", "namespace", "extern", "class"):
                text = code[stmt_start:i]
                if text.strip():
                    result.decls.append(Decl(stmt_start, i, text, "class" if parent_kind == "class" else "file"))
            stmt_start = i + 1
        i += 1
    return result


def _depth0(s: str, ch: str) -> int:
    """Offset of the first ``ch`` outside parentheses, brackets and template angles, or -1."""
    depth = 0
    angle = 0
    for k, c in enumerate(s):
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == "<" and depth == 0:
            angle += 1
        elif c == ">" and depth == 0 and angle > 0:
            angle -= 1
        elif c == ch and depth == 0 and angle == 0:
            if ch == "=" and (s[k + 1:k + 2] == "=" or s[k - 1:k] in "=!<>"):
                continue
            return k
    return -1


def _classify(head: str, parent: str) -> str:
    h = " ".join(head.split())
    if parent in ("function", "block", "init", "enum"):
        return "block" if parent in ("function", "block") else parent
    h_nt = re.sub(r"^template\s*<.*?>\s*", "", h)  # good enough for a one-level template header
    if parent == "class":
        if re.search(r"\boperator\b", h_nt) or ("(" in h_nt and _depth0(h_nt, "=") < 0):
            return "function"
        if re.match(r"^(?:typedef\s+)?(?:struct|class|union)\b", h_nt):
            return "class"
        if re.match(r"^enum\b", h_nt):
            return "enum"
        return "init"
    if re.match(r"^(?:inline\s+)?namespace\b", h_nt) and "=" not in h_nt:
        return "namespace"
    if re.match(r'^extern\s*"\s*"$', h_nt):
        return "extern"
    if re.search(r"\boperator\b", h_nt):
        return "function"
    if "(" in h_nt:
        eq = _depth0(h_nt, "=")
        par = h_nt.find("(")
        if eq >= 0 and eq < par:
            return "init"
        return "function"
    if re.match(r"^(?:typedef\s+)?(?:[\w\s]*\s)?(?:struct|class|union)\b", h_nt) and "=" not in h_nt:
        return "class"
    if re.match(r"^(?:typedef\s+)?enum\b", h_nt):
        return "enum"
    return "init"


# ------------------------------------------------------------------ small helpers


def matching(code: str, open_at: int, open_ch: str = "(", close_ch: str = ")") -> int:
    """Offset of the bracket closing the one at ``open_at`` (len(code) if none)."""
    depth = 0
    for k in range(open_at, len(code)):
        c = code[k]
        if c == open_ch:
            depth += 1
        elif c == close_ch:
            depth -= 1
            if depth == 0:
                return k
    return len(code)


def split_args(s: str) -> list[str]:
    """Split an argument list on top-level commas."""
    out, depth, cur = [], 0, []
    for c in s:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
    tail = "".join(cur).strip()
    if tail or out:
        out.append(tail)
    return out


@dataclass(frozen=True)
class Call:
    name: str
    start: int  # offset of the name
    args: tuple[str, ...]
    end: int  # offset of ")"


def find_calls(code: str, names: tuple[str, ...] | list[str], start: int = 0, end: int | None = None) -> list[Call]:
    """Calls ``name(args)`` of any of ``names`` in ``code[start:end]`` (code-only text)."""
    end = len(code) if end is None else end
    pat = re.compile(r"(?<![\w.>:])(?:::)?(" + "|".join(re.escape(n) for n in names) + r")\s*\(")
    out = []
    for m in pat.finditer(code, start, end):
        open_at = m.end() - 1
        close = matching(code, open_at)
        out.append(Call(m.group(1), m.start(1), tuple(split_args(code[open_at + 1:close])), close))
    return out


@dataclass(frozen=True)
class Launch:
    kernel: str
    start: int
    config: tuple[str, ...]  # grid, block[, smem[, stream]]


def find_launches(code: str, start: int = 0, end: int | None = None) -> list[Launch]:
    end = len(code) if end is None else end
    out = []
    for m in re.finditer(r"([\w:]+)\s*(?:<[^<>;]*>)?\s*<<<", code[start:end]):
        a = start + m.end()
        b = code.find(">>>", a)
        if b < 0:
            continue
        out.append(Launch(m.group(1), start + m.start(), tuple(split_args(code[a:b]))))
    return out


def params_of(head: str) -> list[str]:
    """Parameter names of a function head ``... name(T a, U* b, ...)``."""
    close = head.rfind(")")
    if close < 0:
        return []
    depth = 0
    open_at = -1
    for k in range(close, -1, -1):
        if head[k] == ")":
            depth += 1
        elif head[k] == "(":
            depth -= 1
            if depth == 0:
                open_at = k
                break
    if open_at < 0:
        return []
    names = []
    for p in split_args(head[open_at + 1:close]):
        p = p.split("=")[0].strip()
        m = re.search(r"([A-Za-z_]\w*)\s*(?:\[[^\]]*\])*\s*$", p)
        names.append(m.group(1) if m and m.group(1) not in ("void",) else "")
    return names


def identifiers(expr: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_]\w*", expr))
