"""The runtime's API reference, cut from its installed headers, picked by keyword overlap.

The headers a program compiles against (``stitchrt/stitchrt.h``, ``stitchrt/program.h``,
``stitch/*.cuh`` under :data:`stitchcuda.paths.INCLUDE_DIR`) document themselves: each file opens
with a comment stating its parameters and contract, and each declaration carries its comment.
:func:`api_entries` cuts them into entries (a file's opening comment; a declaration at namespace
level with the comment just above it, function bodies elided, ``detail`` namespaces left out).
:func:`api_reference` scores every entry against a query (the task's contract, sub-graph and
feedback) by the IDF-weighted overlap of their words, normalised by the entry's vocabulary (a
cosine over word sets), and takes the best entries that fit a token budget. No embeddings: the
headers' own words (``softmax``, ``gemm``, ``bias``, ``bf16``) are what a task names.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

from ..paths import INCLUDE_DIR

HEADERS = ("stitchrt/stitchrt.h", "stitchrt/program.h", "stitch/*.cuh")


def estimate_tokens(text: str) -> int:
    """Tokens of ``text`` without a tokenizer: one per 3 characters (code and English tokenize
    to 3 to 4 characters a token, so this errs on the long side)."""
    return -(-len(text) // 3)


@dataclass(frozen=True)
class ApiEntry:
    """One piece of the reference, ``line`` 1-based in ``file``. ``kind``: ``"overview"`` (a
    section of a file's opening comment), ``"type"`` (struct, class, union, enum), ``"macro"``
    (``#define``) or ``"decl"`` (a function, variable, or macro call), each with its comment.
    ``needs``: the types and macros a ``decl`` names (``launch_row_reduce`` takes a
    ``RowParams``), shown with it when they fit."""

    file: str
    line: int
    kind: str
    name: str
    text: str
    needs: tuple[str, ...] = ()


    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class ApiExcerpt:
    """The entries chosen for one query, rendered; ``tokens`` as counted by the caller's counter."""

    text: str
    entries: tuple[ApiEntry, ...]
    tokens: int


# ---------------------------------------------------------------------------- cutting headers

# Matched on comment-stripped code, where string contents are blanked: extern "C" reads extern "".
_NS_OPEN = re.compile(r'^\s*(?:namespace(?:\s+(\w+))?|extern\s+"")\s*\{')
_AGGREGATE = re.compile(r"^\s*(?:typedef\s+)?(?:struct|class|union|enum)\b")
_DEFINE = re.compile(r"^\s*#\s*define\s+(\w+)")
_MACRO_CALL = re.compile(r"^\s*[A-Z][A-Z0-9_]*\s*\(\s*(\w+)")
_MAX_ENTRY_LINES = 48


def _strip_comments(lines: list[str]) -> list[str]:
    """Each line with its comments (``//``, ``/* */``) and string contents blanked out."""
    out, in_block = [], False
    for line in lines:
        code, i = [], 0
        while i < len(line):
            if in_block:
                j = line.find("*/", i)
                if j < 0:
                    i = len(line)
                else:
                    in_block, i = False, j + 2
                continue
            c = line[i]
            if line.startswith("//", i):
                break
            if line.startswith("/*", i):
                in_block, i = True, i + 2
                continue
            if c in "\"'":
                j = i + 1
                while j < len(line) and line[j] != c:
                    j += 2 if line[j] == "\\" else 1
                code.append(c + c)
                i = j + 1
                continue
            code.append(c)
            i += 1
        out.append("".join(code))
    return out


def _drop_template_head(code: str) -> str:
    """``code`` without a leading ``template <...>`` (angle brackets may nest)."""
    m = re.match(r"\s*template\s*<", code)
    if not m:
        return code
    depth, i = 1, m.end()
    while i < len(code) and depth:
        depth += {"<": 1, ">": -1}.get(code[i], 0)
        i += 1
    return code[i:]


def _decl_name(code: str) -> str:
    code = _drop_template_head(code)
    m = re.search(r"\(\s*\*\s*(\w+)\s*\)\s*\(", code)      # a function-pointer typedef
    if m:
        return m.group(1)
    m = re.search(r"\b(?:struct|class|union|enum(?:\s+class)?)\s+(\w+)", code)
    if m:
        tail = re.search(r"}\s*(\w+)\s*;\s*$", code)
        return tail.group(1) if tail else m.group(1)
    m = re.search(r"(\w+)\s*(?:<[^()]*>)?\s*\(", code)
    if m:
        return m.group(1)
    m = re.search(r"(\w+)\s*(?:=[^;]*)?;", code)
    return m.group(1) if m else ""


_COMMENT_LEAD = re.compile(r"^\s*(?://+|/\*+|\*+(?!/))")


def _overview_sections(file: str, lines: list[str]) -> list[ApiEntry]:
    """A file's opening comment cut into sections. The headers indent what belongs to a heading
    (``// Contract`` then ``//   - ...``) and separate paragraphs by an empty comment line, so a
    line at the comment's margin after an empty or an indented line opens a section; a margin
    line after a margin line continues a paragraph. The title paragraph joins the section after
    it."""
    sections: list[tuple[int, list[str]]] = []
    prev = "blank"
    for k, line in enumerate(lines):
        rest = _COMMENT_LEAD.sub("", line, count=1)
        kind = "blank" if rest.strip() in ("", "*/") else "indent" if rest.startswith("  ") else "top"
        if not sections or (kind == "top" and prev != "top"):
            sections.append((k, [line]))
        else:
            sections[-1][1].append(line)
        prev = kind
    if len(sections) > 1:
        sections[:2] = [(0, sections[0][1] + sections[1][1])]
    out = []
    for start, body in sections:
        while body and _COMMENT_LEAD.sub("", body[-1]).strip() in ("", "*/"):
            body.pop()
        if not body:
            continue
        words = re.findall(r"[\w.]+", _COMMENT_LEAD.sub("", body[0]))
        out.append(ApiEntry(file, start + 1, "overview", words[0] if words else Path(file).name,
                            "\n".join(body)))
    return out


def _cut(file: str, text: str) -> list[ApiEntry]:
    lines = text.splitlines()
    code = _strip_comments(lines)
    entries: list[ApiEntry] = []

    # The file's opening comment: its parameters and contract, one entry per section.
    i = 0
    while i < len(lines) and not code[i].strip() and lines[i].strip():
        i += 1
    entries.extend(_overview_sections(file, lines[:i]))

    stack: list[str] = []          # open namespaces: "ns", or "skip" for a detail namespace
    comment: list[str] = []
    comment_start = 0
    while i < len(lines):
        line, c = lines[i], code[i]
        skipping = "skip" in stack
        if not line.strip():
            comment = []
            i += 1
            continue
        if not c.strip():                       # a comment line
            if not comment:
                comment_start = i
            comment.append(line)
            i += 1
            continue
        m = _NS_OPEN.match(c)
        if m:
            stack.append("skip" if (m.group(1) or "") in ("detail", "internal") or skipping else "ns")
            comment = []
            i += 1
            continue
        if c.strip().startswith("}") and stack and stack[-1] in ("ns", "skip") and c.count("{") == 0:
            stack.pop()
            comment = []
            i += 1
            continue
        if c.lstrip().startswith("#"):
            start = i
            while lines[i].rstrip().endswith("\\") and i + 1 < len(lines):   # continued macro
                i += 1
            d = _DEFINE.match(c)
            # Include guards and export macros are no API.
            if (d and not skipping and not d.group(1).endswith("_H")
                    and not re.search(r"__attribute__|__declspec", c)):
                body = lines[start:i + 1]
                if len(body) > _MAX_ENTRY_LINES:
                    body = body[:_MAX_ENTRY_LINES] + ["  ..."]
                entries.append(ApiEntry(file, (comment_start if comment else start) + 1, "macro", d.group(1),
                                        "\n".join(comment + body)))
            comment = []
            i += 1
            continue
        # A declaration at namespace level: it ends where its braces close on a ; or } (a macro
        # call, on its closing parenthesis). Function bodies are elided; a struct, class, enum or
        # union keeps its members (their bodies elided).
        start, depth, starts = i, 0, []
        macro_call = _MACRO_CALL.match(c)       # e.g. STITCH_ROW_ENTRY(launch_softmax, ...): no ;
        while i < len(lines):
            starts.append(depth)
            depth += code[i].count("{") - code[i].count("}")
            i += 1
            done = depth <= 0 and code[i - 1].rstrip().endswith((";", "}"))
            if macro_call:
                head = " ".join(code[start:i])
                done = done or (depth <= 0 and head.count("(") == head.count(")"))
            if done:
                break
        joined = " ".join(code[start:i])
        keep_depth = 1 if _AGGREGATE.match(_drop_template_head(joined.split("{")[0])) else 0
        kept: list[str] = []
        for k in range(start, i):
            if starts[k - start] <= keep_depth or k == i - 1:
                kept.append(lines[k])
            elif kept[-1].strip() != "...":
                kept.append("  " * (starts[k - start] + 1) + "...")
        if len(kept) > _MAX_ENTRY_LINES:
            kept = kept[:_MAX_ENTRY_LINES - 1] + ["  ...", kept[-1]]
        if not skipping:
            body = "\n".join(comment + kept)
            name = macro_call.group(1) if macro_call else _decl_name(joined)
            kind = "type" if keep_depth else "decl"
            entries.append(ApiEntry(file, (comment_start if comment else start) + 1, kind, name, body))
        comment = []
    return entries


def _header_files(include_dir: Path) -> list[Path]:
    files: list[Path] = []
    for pattern in HEADERS:
        files.extend(sorted(include_dir.glob(pattern)))
    return files


@functools.lru_cache(maxsize=4)
def api_entries(include_dir: Path = INCLUDE_DIR) -> tuple[ApiEntry, ...]:
    """Every entry of the installed headers, in file order."""
    out: list[ApiEntry] = []
    for f in _header_files(Path(include_dir)):
        rel = f.relative_to(include_dir).as_posix()
        out.extend(_cut(rel, f.read_text(encoding="utf-8", errors="replace")))
    types = {e.name for e in out if e.kind in ("type", "macro")}
    return tuple(dataclasses.replace(e, needs=tuple(sorted(
        n for n in set(re.findall(r"\b\w+\b", e.text)) & types if n != e.name))) if e.kind == "decl" else e
        for e in out)


# ---------------------------------------------------------------------------- scoring

_STOP = frozenset("""
a an and are as at be by for from in into is it its of on or that the this to with when which
not no one each every per than then there these those only may must also else if any all same
const int float void bool return struct class template typename typedef enum union inline static
auto char size_t int64_t int32_t uint8_t unsigned long double true false nullptr null define
forceinline device host global namespace stitch st api extern
cuda stream cudastream cudastream_t cudaerror_t out in ptr aten default returns launch status
st_status st_ok task input output read written whole alias strides
""".split())

# ATen spellings that the headers say otherwise.
_ALIASES = {
    "mm": "gemm", "addmm": "gemm bias", "bmm": "gemm batch", "baddbmm": "gemm batch",
    "matmul": "gemm", "linear": "gemm bias", "gemm": "gemm epilogue",
    "layer": "layernorm", "rms": "rmsnorm", "sdpa": "attention", "scaled": "attention",
    "add": "elementwise", "sub": "elementwise", "mul": "elementwise", "div": "elementwise",
    "where": "elementwise", "maximum": "elementwise", "minimum": "elementwise",
    "sum": "reduce", "mean": "reduce", "amax": "reduce max", "amin": "reduce min",
    "var": "reduce", "logsumexp": "reduce", "permute": "strided copy", "transpose": "permute",
    "clone": "copy", "contiguous": "copy",
}
# Unary activations: an epilogue functor, applied elementwise through EwUnary / EpHook.
_ALIASES.update({op: f"{extra} elementwise ewunary ephook" for op, extra in {
    "gelu": "geluerf gelutanh", "relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "silu": "silu",
    "mish": "mish", "hardtanh": "hardtanh", "hardswish": "hardswish", "softplus": "softplus", "elu": "elu",
    "leaky": "leakyrelu", "abs": "abs", "exp": "exp", "clamp": "clamp", "square": "square"}.items()})


def _words(text: str) -> list[str]:
    """Lower-case words: identifiers, their snake_case and CamelCase parts."""
    out = []
    for ident in re.findall(r"[A-Za-z][A-Za-z0-9_]*", text):
        low = ident.lower()
        parts = [p for seg in ident.split("_") for p in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", seg)]
        for w in {low, *(p.lower() for p in parts)}:
            if len(w) >= 2 and w not in _STOP:
                out.append(w)
    return out


def _query_words(query: str | Mapping[str, float]) -> dict[str, float]:
    """Word -> weight: the largest weight of a text that holds the word (or an alias of it)."""
    texts = {query: 1.0} if isinstance(query, str) else query
    out: dict[str, float] = {}
    for text, weight in texts.items():
        words = set(_words(text))
        for w in list(words):
            if w in _ALIASES:
                words.update(_ALIASES[w].split())
        for w in words:
            out[w] = max(out.get(w, 0.0), float(weight))
    return out


@functools.lru_cache(maxsize=4)
def _index(entries: tuple[ApiEntry, ...]) -> tuple[tuple[frozenset[str], ...], tuple[frozenset[str], ...],
                                                  dict[str, float]]:
    sets = tuple(frozenset(_words(e.text + " " + e.name)) for e in entries)
    names = tuple(frozenset(_words(e.name)) for e in entries)
    df: dict[str, int] = {}
    for s in sets:
        for w in s:
            df[w] = df.get(w, 0) + 1
    n = len(sets)
    return sets, names, {w: math.log((n + 1) / (c + 0.5)) for w, c in df.items()}


def rank(query: str | Mapping[str, float],
         entries: Iterable[ApiEntry] | None = None) -> list[tuple[float, ApiEntry]]:
    """Entries with a positive score, best first (ties: file order).

    ``query`` is a text, or texts with weights (the task's sub-graph may count more than its
    contract). score = sum over shared words of idf(word) x weight(word), twice for a word of
    the entry's name (``softmax`` in ``launch_softmax``), / sqrt(the entry's number of words).
    """
    ents = tuple(entries) if entries is not None else api_entries()
    if not ents:
        return []
    sets, names, idf = _index(ents)
    q = _query_words(query)
    scored = []
    for order, (e, s, nm) in enumerate(zip(ents, sets, names)):
        shared = [w for w in s if w in q]
        if not shared:
            continue
        score = sum(idf[w] * q[w] * (2.0 if w in nm else 1.0) for w in shared) / math.sqrt(len(s))
        scored.append((score, -order, e))
    scored.sort(key=lambda t: (t[0], t[1]), reverse=True)
    return [(s, e) for s, _, e in scored]


def api_reference(query: str | Mapping[str, float], budget_tokens: int, *, include_dir: Path | None = None,
                  count_tokens: Callable[[str], int] = estimate_tokens, min_relative: float = 0.2) -> ApiExcerpt:
    """The entries most relevant to ``query`` whose rendering fits ``budget_tokens``.

    Greedy in score order; an entry too large for what is left is passed over for smaller
    ones, and entries scoring under ``min_relative`` of the best are left out (one shared
    common word is noise, not relevance). The chosen entries are rendered in file order under a
    ``// ---- <file>`` line per file.
    """
    entries = api_entries(Path(include_dir) if include_dir is not None else INCLUDE_DIR)
    by_name = {e.name: e for e in entries if e.kind in ("type", "macro")}
    chosen: list[ApiEntry] = []
    ranked = rank(query, entries)
    floor = ranked[0][0] * min_relative if ranked else 0.0
    for score, e in ranked:
        if score < floor:
            break
        if e in chosen:
            continue
        group = [e] + [by_name[n] for n in e.needs if by_name[n] not in chosen]
        for trial in (group, [e]):
            if count_tokens(_render(chosen + trial)) <= budget_tokens:
                chosen.extend(trial)
                break
    order = {id(e): k for k, e in enumerate(entries)}
    chosen.sort(key=lambda e: order[id(e)])
    text = _render(chosen)
    return ApiExcerpt(text, tuple(chosen), count_tokens(text) if text else 0)


def _render(entries: list[ApiEntry]) -> str:
    if not entries:
        return ""
    files: dict[str, list[ApiEntry]] = {}
    for e in entries:
        files.setdefault(e.file, []).append(e)
    blocks = []
    for f, es in files.items():
        es = sorted(es, key=lambda e: e.line)
        blocks.append(f"// ---- {f}\n" + "\n\n".join(e.text for e in es))
    return "\n\n".join(blocks)


__all__ = ["HEADERS", "ApiEntry", "ApiExcerpt", "api_entries", "api_reference", "rank", "estimate_tokens"]
