"""What the LLM is asked, and what is taken from its replies.

Two requests:

- :func:`code_prompt` asks for the body of one task: the task's contract (the text of
  ``TaskContract.describe()``: signature, each pointer's dtype, shape and strides, the stream,
  aliasing rules), the reference sub-graph the task covers, the Verifier's feedback on earlier
  attempts, the runtime's API reference cut from its headers (:mod:`.apiref`) to fit a token
  budget, and strict output rules. :func:`extract_code` takes the one fenced block that defines
  the function out of a reply, or says why there is none (:class:`NoCode`).
- :func:`decision_prompt` asks for a planner decision; the reply is constrained by the grammar of
  :mod:`.grammar` and read by :func:`.grammar.parse_constraints`.

A :class:`Prompt` is a system text and a user text; the client renders them with the model's
chat template when it has one, or as plain text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

from .apiref import ApiExcerpt, api_reference, estimate_tokens
from .grammar import FIELDS, DecisionSpec


#: The start of a reply to :func:`code_prompt`: the opening of the fenced block the rules ask for.
CODE_OPENING = "```cuda\n"


@dataclass(frozen=True)
class Prompt:
    """One request: ``system`` (the role and rules) and ``user`` (the material). ``opening`` is
    the start of the reply, written for the model: a model without a chat template (a base model,
    which would otherwise ramble on in the prompt's own voice) continues it, and the reply read
    back begins with it. A chat model is asked in its own format, without it."""

    system: str
    user: str
    opening: str = ""

    def text(self) -> str:
        """Both parts as one plain text, for models without a chat template."""
        return f"{self.system}\n\n{self.user}\n"

    # How every backend sends a request and reads the reply (the llama.cpp client, and the RL
    # policy that must see exactly what the loop sends): in one place, so the two cannot drift.

    def user_turn(self) -> str:
        """The one user turn a chat model gets (not every chat template has a system role)."""
        return f"{self.system}\n\n{self.user}"

    def plain(self) -> str:
        """What a model without a chat template continues: the text, then the reply's opening."""
        return self.text() + self.opening

    def reply(self, continuation: str) -> str:
        """The reply read back from a model without a chat template: the opening it continued,
        then what it wrote."""
        return self.opening + continuation

    def to_json(self) -> dict:
        d = {"system": self.system, "user": self.user}
        if self.opening:             # absent when empty: the keys of requests without one are unchanged
            d["opening"] = self.opening
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Prompt":
        return cls(d["system"], d["user"], d.get("opening", ""))


@dataclass(frozen=True)
class Attempt:
    """An earlier proposal for the task and what the Verifier said of it."""

    code: str
    feedback: str


# ---------------------------------------------------------------------------- code


CODE_SYSTEM = """\
You write CUDA C++ for stitchcuda, a compiler that turns a PyTorch program into one CUDA program \
that runs on stitchcuda's own runtime (libstitchrt), with no PyTorch. You write the body of one \
task: one C++ function with the exact signature you are given. It receives device pointers and a \
CUDA stream and must compute exactly what the reference sub-graph computes, in the precision the \
contract states. A Verifier builds your code, checks it against the reference on fresh random \
inputs, and times it."""

_CODE_RULES = """\
Rules for your reply:
1. Reply with exactly one fenced code block that opens with ```cuda and closes with ```.
2. The block defines the function `{function}` exactly as the contract declares it: same name, \
return type and parameters. Define it once.
3. Helper __global__ kernels and __device__ functions may come before it in the same block; start \
their names with `{function}_` so that they clash with nothing else in the program.
4. Launch every kernel on the given stream. Do not synchronise, allocate host or device memory \
(no malloc, new, cudaMalloc, cudaMallocHost), copy to the host, or print.
5. No PyTorch, ATen or c10, and no #include lines: the runtime headers excerpted above are \
already included.
6. Honour the contract's aliasing rules: never write an input; write every element of every \
output.
7. Nothing after the closing ```."""


def _section(title: str, body: str) -> str:
    return f"## {title}\n{body.strip()}\n"


def code_prompt(function: str, contract: str, subgraph: str, *, attempts: Sequence[Attempt] = (),
                budget_tokens: int = 6000, api_budget_tokens: int = 2000, include_dir=None,
                count_tokens: Callable[[str], int] = estimate_tokens) -> Prompt:
    """The request for the body of task function ``function``.

    ``contract`` is the task contract's text, ``subgraph`` the reference nodes the task covers,
    ``attempts`` earlier proposals with the Verifier's feedback, oldest first. The whole prompt
    aims at ``budget_tokens`` (as ``count_tokens`` counts; the client's tokenizer when it has
    one): the contract, sub-graph and rules always go in; then the newest feedback, older
    feedback and the newest attempt's code while they fit; the API reference gets what is left,
    at most ``api_budget_tokens``, chosen by overlap with the sub-graph (weight 2), the contract
    (1) and the feedback (0.5).
    """
    head = [_section("Task contract", contract), _section("Reference sub-graph this task covers", subgraph)]
    rules = _CODE_RULES.format(function=function)
    used = count_tokens(CODE_SYSTEM) + count_tokens("\n".join(head)) + count_tokens(rules) + 16

    feedback_parts: list[str] = []
    for k in range(len(attempts) - 1, -1, -1):        # newest first, until the budget says stop
        a = attempts[k]
        part = f"Attempt {k + 1}: {a.feedback.strip()}"
        if used + count_tokens(part) > budget_tokens:
            break
        feedback_parts.insert(0, part)
        used += count_tokens(part)
    last_code = ""
    if attempts and attempts[-1].code.strip():
        block = f"Code of attempt {len(attempts)}:\n```cuda\n{attempts[-1].code.strip()}\n```"
        if used + count_tokens(block) <= budget_tokens:
            last_code, used = block, used + count_tokens(block)

    query = {subgraph: 2.0, contract: 1.0}
    if feedback_parts:       # may name an API ("launch_sofmax was not declared"); mostly it does not
        query["\n".join(feedback_parts)] = 0.5
    api_budget = max(0, min(api_budget_tokens, budget_tokens - used - 32))
    api = api_reference(query, api_budget, include_dir=include_dir, count_tokens=count_tokens) \
        if api_budget > 0 else ApiExcerpt("", (), 0)

    parts = list(head)
    if feedback_parts:
        parts.append(_section("Verifier feedback on earlier attempts (fix these)",
                              "\n".join(feedback_parts) + (f"\n\n{last_code}" if last_code else "")))
    if api.text:
        parts.append(_section("Runtime API reference (excerpts of the installed headers)",
                              f"```cpp\n{api.text}\n```"))
    parts.append(rules)
    return Prompt(CODE_SYSTEM, "\n".join(parts), CODE_OPENING)


@dataclass(frozen=True)
class CodeBlock:
    """The code of a reply: one fenced block that defines the task function."""

    code: str
    language: str


@dataclass(frozen=True)
class NoCode:
    """A reply with no usable code.

    reason: ``"no_block"`` (no fenced C/C++/CUDA block holding code: blank blocks count as
    none), ``"missing_function"`` (closed blocks of code that never name the function),
    ``"unterminated"`` (a block of code opens and never closes: the reply hit max tokens),
    ``"partial_function"`` (a block names the function, but no definition of it completes: a
    declaration, a call, or a definition cut at max tokens), ``"ambiguous"`` (the block defines
    the function more than once). In that order a reply comes nearer to usable code.
    """

    reason: Literal["no_block", "missing_function", "unterminated", "partial_function", "ambiguous"]
    detail: str

    def __str__(self) -> str:
        return f"no code ({self.reason}): {self.detail}"


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)")
_CODE_LANGS = {"", "cuda", "cu", "cuh", "cpp", "c++", "cxx", "cc", "c", "h", "hpp"}


def _blocks(text: str) -> tuple[list[tuple[str, str]], tuple[str, str] | None]:
    """Closed fenced blocks as (language, code), and the block left open, if one is."""
    closed, open_lang, fence, body = [], None, "", []
    for line in text.splitlines():
        if open_lang is None:
            m = _FENCE.match(line)
            if m:
                fence, open_lang, body = m.group(1), m.group(2).lower(), []
            continue
        stripped = line.strip()
        if stripped.startswith(fence[0] * len(fence)) and not stripped.strip(fence[0]):
            closed.append((open_lang, "\n".join(body)))
            open_lang = None
        else:
            body.append(line)
    return closed, (None if open_lang is None else (open_lang, "\n".join(body)))


def _named(function: str) -> re.Pattern[str]:
    """``function``'s name followed by an opening parenthesis: a definition, declaration or call."""
    return re.compile(r"\b" + re.escape(function) + r"\s*\(")


def _definitions(code: str, function: str) -> int:
    """How many times ``code`` defines ``function`` (a name, balanced parameters, then ``{``)."""
    n = 0
    for m in _named(function).finditer(code):
        depth, i = 1, m.end()
        while i < len(code) and depth:
            depth += {"(": 1, ")": -1}.get(code[i], 0)
            i += 1
        rest = re.match(r"\s*(?:const\s*)?(?:noexcept\s*)?(?:->\s*[\w:<>\s*&]+?)?\s*\{", code[i:])
        if depth == 0 and rest:
            n += 1
    return n


def extract_code(text: str, function: str) -> CodeBlock | NoCode:
    """The first closed C/C++/CUDA fenced block of ``text`` that defines ``function``; else why
    not (:class:`NoCode`)."""
    closed, left_open = _blocks(text)
    code_blocks = [(lang, code) for lang, code in closed if lang in _CODE_LANGS and code.strip()]
    defining = [(lang, code, _definitions(code, function)) for lang, code in code_blocks]
    defining = [d for d in defining if d[2] > 0]
    if defining:
        lang, code, n = defining[0]
        if n > 1:
            return NoCode("ambiguous", f"the block defines {function} {n} times")
        return CodeBlock(code.strip("\n") + "\n", lang or "cuda")
    cut = None  # the code of a block cut off at max tokens
    if left_open is not None and left_open[0] in _CODE_LANGS and left_open[1].strip():
        cut = left_open[1]
    named = _named(function)
    if any(named.search(code) for _, code in code_blocks) or (cut is not None and named.search(cut)):
        return NoCode("partial_function", f"{function} is named, but no definition of it completes"
                      + (" (a code block is cut off: max tokens?)" if cut is not None else ""))
    if cut is not None:
        return NoCode("unterminated", "a code block opens and never closes (cut at max tokens?)")
    if code_blocks:
        return NoCode("missing_function", f"{len(code_blocks)} code block(s), none names {function}")
    return NoCode("no_block", "no fenced C/C++/CUDA code in the reply (blank blocks count as none)")


# ---------------------------------------------------------------------------- decisions


DECISION_SYSTEM = """\
You are the planner of stitchcuda, a compiler that turns a PyTorch program into one CUDA program. \
You read the reference graph, the current plan and the Verifier's report, and decide constraints \
for the next plan. Reply with one JSON object and nothing else."""

_DECISION_FIELDS = """\
The object has four keys:
- "precision": reference node -> precision policy for the task that computes it. fp32 is exact \
fp32 math; tf32 uses TF32 tensor cores on fp32 data; bf16 / fp16 store 16-bit data with fp32 \
accumulation. Raise a node to fp32 when the Verifier reports it wrong at a lower precision.
- "unfuse": reference nodes that must start a new task (a fusion boundary before them).
- "strategy": reference node -> one of the strategies listed for it below.
- "rewrites": exact algebraic rewrites to apply, from the list below.
Leave a key empty ({{}} or []) to keep the planner's own choice."""


def decision_prompt(graph: str, spec: DecisionSpec, *, plan: str = "", feedback: Sequence[str] = (),
                    budget_tokens: int = 6000,
                    count_tokens: Callable[[str], int] = estimate_tokens) -> Prompt:
    """The request for a planner decision over ``spec``'s names.

    ``graph`` is the reference graph's text, ``plan`` the current plan's, ``feedback`` the
    Verifier's summaries, oldest first (the newest are kept when the budget is short).
    """
    strat = "\n".join(f"- {n}: {', '.join(opts)}" for n, opts in spec.strategies) or "(none)"
    rewrites = "\n".join(f"- {r}" for r in spec.rewrites) or "(none)"
    example = "{" + ", ".join(f'"{f}": ' + ("{}" if f in ("precision", "strategy") else "[]") for f in FIELDS) + "}"
    parts = [_section("Reference graph", graph)]
    if plan:
        parts.append(_section("Current plan", plan))
    tail = [
        _section("Precision policies", ", ".join(spec.policies)),
        _section("Strategy options per node", strat),
        _section("Rewrites", rewrites),
        _DECISION_FIELDS.format() + f"\nAn empty decision is {example}.",
    ]
    used = sum(count_tokens(p) for p in parts + tail) + count_tokens(DECISION_SYSTEM)
    kept: list[str] = []
    for f in reversed(list(feedback)):
        if used + count_tokens(f) > budget_tokens:
            break
        kept.insert(0, f)
        used += count_tokens(f)
    if kept:
        parts.append(_section("Verifier feedback", "\n".join(f"- {f.strip()}" for f in kept)))
    return Prompt(DECISION_SYSTEM, "\n".join(parts + tail))


__all__ = ["Prompt", "Attempt", "CodeBlock", "NoCode", "code_prompt", "extract_code", "decision_prompt",
           "CODE_SYSTEM", "DECISION_SYSTEM"]
