"""Shared by the sweeps (tests/test_sweep_*.py; it holds no tests): how a drawn case is checked,
how many are drawn, and with which seed.

A sweep draws a :class:`Case` with ``hypothesis`` — an op or a small graph with parameters drawn from
what PyTorch accepts — and :func:`check` takes it through the public path: capture
(``stitchcuda.frontend``), ``stitchcuda.plan.plan``, the plan interpreter
(``stitchcuda.check.interp.simulate``), and a comparison with PyTorch in float64. A case the
planner refuses must be refused by name: an ``UnsupportedOpError`` or ``PlanError`` whose message
names the op (and, unless the case says the refusal is expected, it fails the test: a refusal is a
finding too, and the sweep cannot tell a limit from a bug).

How many, and which:

* ``STITCHCUDA_SWEEP_EXAMPLES=N``: N examples per sweep test (each parametrized item is a test);
  unset, each test draws the small number it names (``sweep(n)``), sized so that all sweeps take
  about two minutes on two cores (CI). ``N`` in the hundreds is the larger run (BENCHMARKS.md,
  "Sweeps").
* ``STITCHCUDA_SWEEP_SEED=S`` (default 0): the base of every sweep's seed (each test adds a hash of
  its name). Runs are reproducible: no example database, the same draws for the same seed. A
  failure prints the drawn case, the seed, and how to run it again.
* ``STITCHCUDA_SWEEP_LOG=FILE``: one JSON line per case (test, op, outcome, task kinds), which
  ``benchmarks/sweep_counts.py`` tabulates.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from hypothesis import HealthCheck, note, reject, seed, settings
from hypothesis import strategies as st

from stitchcuda import frontend, ops
from stitchcuda import plan as P
from stitchcuda.check.interp import simulate
from stitchcuda.pipeline import model_weights
from tests.test_coverage_cases import Fn

EXAMPLES_ENV = "STITCHCUDA_SWEEP_EXAMPLES"
SEED_ENV = "STITCHCUDA_SWEEP_SEED"
LOG_ENV = "STITCHCUDA_SWEEP_LOG"

#: Error allowed against float64 per element, |got - want| / (1 + |want|): by the policy (what the
#: intermediates are stored in) and by the output's dtype (what the result is stored in).
POLICY_TOL = {"fp32": 1e-5, "tf32": 1e-5, "bf16": 3e-2, "fp16": 5e-3}
DTYPE_TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2, "float64": 1e-5}


def base_seed() -> int:
    return int(os.environ.get(SEED_ENV, "0") or 0)


def examples(ci: int) -> int:
    """Examples per test: ``STITCHCUDA_SWEEP_EXAMPLES`` when set, else ``ci``."""
    n = os.environ.get(EXAMPLES_ENV, "").strip()
    return max(1, int(n)) if n else ci


def sweep(ci: int) -> Callable:
    """A hypothesis test drawing ``examples(ci)`` cases from a seed of its own (module docstring)."""

    def deco(f: Callable) -> Callable:
        s = base_seed() * 1_000_003 + zlib.crc32(f"{f.__module__}.{f.__name__}".encode())
        f = settings(max_examples=examples(ci), deadline=None, database=None, print_blob=False,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                            HealthCheck.data_too_large])(f)
        return seed(s)(f)

    return deco


# ---------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class T:
    """An input tensor to draw: shape, dtype and where its values lie. ``dist``: ``normal``,
    ``uniform`` (in [lo, hi]), ``int`` (integers in [lo, hi)), ``bool``, ``pos`` (|normal| + lo)."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    dist: str = "normal"
    lo: float = 0.0
    hi: float = 1.0
    edges: bool = False  # some IEEE edge values among them (NaN, ±inf, ±0)

    def make(self, g: torch.Generator) -> torch.Tensor:
        shape = self.shape
        if self.dist == "bool" or self.dtype == "bool":
            return torch.rand(shape, generator=g) > 0.5
        if self.dist == "int":
            x = torch.randint(int(self.lo), int(self.hi), shape, generator=g, dtype=torch.int64)
            return x.to(getattr(torch, self.dtype))
        if self.dist == "uniform":
            x = torch.rand(shape, generator=g, dtype=torch.float64) * (self.hi - self.lo) + self.lo
        elif self.dist == "pos":
            x = torch.randn(shape, generator=g, dtype=torch.float64).abs() + self.lo
        else:
            x = torch.randn(shape, generator=g, dtype=torch.float64)
        if self.edges and x.numel():
            e = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0], dtype=torch.float64)
            k = min(len(e), x.numel())
            pos = torch.randperm(x.numel(), generator=g)[:k]
            x.view(-1)[pos] = e[:k]
        return x.to(getattr(torch, self.dtype))

    def __repr__(self) -> str:
        extra = "" if self.dist == "normal" else f" {self.dist}[{self.lo:g}, {self.hi:g}]"
        return f"{self.dtype}{list(self.shape)}{extra}{' +edges' if self.edges else ''}"


# ---------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    """One drawn program: ``fn(module, *inputs)`` on tensors drawn as ``inputs`` say, with
    submodules made by ``modules`` (name -> constructor, called under a fixed seed).

    ``op``: the ATen operator the case is about; it must be in the captured graph, and a refusal
    must name it. ``preserve``: operators capture keeps whole instead of decomposing (to reach a
    registry entry PyTorch's decompositions would otherwise take apart). ``kinds``: task kinds
    (spec class names without ``Spec``) of which the plan must hold at least one. ``refusal``: a
    text a refusal may contain for the case to count as expected (None: a refusal fails).
    """

    op: str
    params: dict
    fn: Callable[..., Any] = field(compare=False)
    inputs: tuple[T, ...]
    modules: tuple[tuple[str, Callable[[], torch.nn.Module]], ...] = ()
    policy: str = "fp32"
    kinds: tuple[str, ...] = ()
    preserve: tuple[str, ...] = ()
    refusal: str | None = None
    tol: float = 0.0
    names: tuple[str, ...] = ()  #: other spellings a refusal may name the op by
    data_seed: int = 0
    values: bool = True  #: False: the result's values are undefined (``empty``); shapes and dtypes are compared
    #: The reference, where PyTorch's CPU kernel is not it (``ref(*inputs)`` in float64; the
    #: Verifier's reference runs on the GPU: see tests/sweep_cases.py, nearest upsampling).
    ref: Callable[..., Any] | None = field(default=None, compare=False)
    #: (op, op'): capture's nodes of ``op`` become ``op'`` (attributes dropped where ``op'``'s
    #: schema lacks them): how a registry entry this PyTorch never emits is reached.
    retarget: tuple[tuple[str, str], ...] = ()
    #: Rewrites the constraints ask for (``plan(..., constraints=Constraints.of(rewrites=...))``).
    rewrites: tuple[str, ...] = ()
    #: Called with the captured graph before planning (the rewrite sweeps look for their places).
    inspect: Callable[[Any], None] | None = field(default=None, compare=False)

    def __repr__(self) -> str:
        ps = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"Case({self.op}: {ps}; inputs={list(self.inputs)}; policy={self.policy}; seed={self.data_seed})"

    def _repr_pretty_(self, p, cycle) -> None:  # hypothesis prints a falsifying case with this
        p.text(repr(self))

    def model(self) -> torch.nn.Module:
        with torch.random.fork_rng():
            torch.manual_seed(self.data_seed)
            mods = {k: make() for k, make in self.modules}
        return Fn(self.fn, **mods)

    def tensors(self) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(self.data_seed)
        return [t.make(g) for t in self.inputs]


@contextlib.contextmanager
def preserved(names: Sequence[str]):
    """Capture with ``names`` kept whole (not decomposed): how a registry entry that PyTorch's
    decompositions take apart is reached through capture all the same."""
    from stitchcuda import aten as _aten

    if not names:
        yield
        return
    old = _aten.PRESERVED_OPS
    _aten.PRESERVED_OPS = tuple(old) + tuple(n for n in names if n not in old)
    try:
        yield
    finally:
        _aten.PRESERVED_OPS = old


def _note(text: str) -> None:
    try:
        note(text)
    except Exception:  # noqa: BLE001 - outside a hypothesis test (an example test calls check itself)
        pass


def _log(case: Case, outcome: str, plan: P.Plan | None = None, why: str = "") -> None:
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
    rec = {"test": test, "op": case.op, "outcome": outcome, "policy": case.policy,
           "broken": case.params.get("broken", "") if "broken" in case.params else None,
           "kinds": sorted({type(t.params).__name__.removesuffix("Spec") for t in plan.tasks}) if plan else [],
           "why": why[:300]}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")


def _short(op: str) -> str:
    return op.split(".")[1] if op.startswith("aten.") else op


def _refused(case: Case, err: Exception) -> str:
    text = str(err)
    names = (case.op, _short(case.op)) + case.names
    assert any(n in text for n in names), f"refused without naming {case.op}: {text}"
    reasons = [u[3] for u in getattr(err, "unsupported", [])] + [u.reason for u in getattr(err, "ops", [])]
    _log(case, "refused", why="; ".join(dict.fromkeys(r for r in reasons if r)) or text.splitlines()[-1].strip())
    assert case.refusal is not None and case.refusal in text, \
        f"refused, and the case does not expect it ({case.refusal!r} not in the message): {text}"
    return "refused"


def retarget(graph, pairs: Sequence[tuple[str, str]]):
    """``graph`` with the nodes of each ``op`` made nodes of ``op'`` (see :attr:`Case.retarget`)."""
    import dataclasses

    if not pairs:
        return graph
    to = dict(pairs)
    read = {t for n in graph.nodes for t in n.inputs} | set(graph.outputs)
    nodes = []
    for n in graph.nodes:
        if n.op in to:
            _, name, ov = to[n.op].split(".")
            schema = getattr(getattr(torch.ops.aten, name), ov)._schema
            keep = {a.name for a in schema.arguments}
            outs = n.outputs[:len(schema.returns)]
            assert not {o.name for o in n.outputs[len(outs):]} & read, f"{n.name}: retargeting drops a used output"
            n = dataclasses.replace(n, op=to[n.op], attrs=tuple((k, v) for k, v in n.attrs if k in keep),
                                    outputs=outs)
        nodes.append(n)
    return dataclasses.replace(graph, nodes=tuple(nodes))


def _float64(x: Any) -> Any:
    return x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def reference(case: Case, model: torch.nn.Module, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad():
        if case.ref is not None:
            want = case.ref(*[_float64(x.clone()) for x in inputs])
        else:
            want = copy.deepcopy(model).double()(*[_float64(x.clone()) for x in inputs])
    return list(want) if isinstance(want, (tuple, list)) else [want]


def compare(case: Case, outs: Sequence[torch.Tensor], want: Sequence[torch.Tensor], plan: P.Plan) -> None:
    assert len(outs) == len(want), f"{len(outs)} outputs, the reference has {len(want)}"
    for i, (o, r) in enumerate(zip(outs, want)):
        assert tuple(o.shape) == tuple(r.shape), f"output {i}: shape {tuple(o.shape)}, want {tuple(r.shape)}"
        if not case.values:
            assert o.dtype == r.dtype or r.dtype == torch.float64, f"output {i}: {o.dtype}, want {r.dtype}"
            continue
        if not r.is_floating_point():
            assert not o.is_floating_point(), f"output {i}: {o.dtype}, want {r.dtype}"
            assert torch.equal(o.to(r.dtype), r), f"output {i} differs:\n{o}\nwant\n{r}\n{plan}"
            continue
        tol = case.tol or max(POLICY_TOL[case.policy], DTYPE_TOL.get(str(o.dtype).removeprefix("torch."), 1e-5))
        o = o.double()
        on, rn = torch.isnan(o), torch.isnan(r)
        assert torch.equal(on, rn), f"output {i}: NaN at {int((on != rn).sum())} elements where the reference has " \
                                    f"{'none' if not rn.any() else 'others'}\n{plan}"
        inf = torch.isinf(r) | torch.isinf(o)
        assert torch.equal(o[inf & ~rn], r[inf & ~rn]), f"output {i}: infinities differ\n{plan}"
        fin = ~rn & ~inf
        err = ((o[fin] - r[fin]).abs() / (1 + r[fin].abs()))
        worst = err.max().item() if err.numel() else 0.0
        assert worst <= tol, (f"output {i}: error {worst:.3g} > {tol:g} at {int((err > tol).sum())} of "
                              f"{err.numel()} elements\n{plan}")


def check(case: Case) -> str:
    """Capture, plan and interpret ``case``; compare with PyTorch in float64. Returns ``planned``
    or ``refused`` (a refusal that names the op and that the case expects)."""
    _note(f"sweep seed {base_seed()} ({SEED_ENV}); drawn: {case!r}")
    model, inputs = case.model(), case.tensors()
    try:
        want = reference(case, model, inputs)
    except (RuntimeError, ValueError, IndexError, TypeError) as e:  # PyTorch refuses these arguments
        _log(case, "rejected", why=str(e).splitlines()[0] if str(e) else type(e).__name__)
        reject()
    try:
        with preserved(case.preserve):
            cap = frontend.capture(model, inputs, "sweep", supported_ops=ops.supported())
    except frontend.CaptureError as e:  # (UnsupportedOpError among them)
        return _refused(case, e)
    graph = retarget(cap.graph, case.retarget)
    graph_ops = {n.op for n in graph.nodes}
    assert not case.op or case.op in graph_ops, f"the captured graph holds no {case.op}: {sorted(graph_ops)}"
    if case.inspect is not None:
        case.inspect(graph)
    try:
        plan = P.plan(graph, case.policy, constraints=P.Constraints.of(rewrites=case.rewrites) if case.rewrites
                      else None)
    except P.PlanError as e:
        return _refused(case, e)
    assert P.Plan.from_json(plan.to_json()).to_json() == plan.to_json()
    covered = {c for t in plan.tasks for c in t.covers}
    # (the nodes of a rewrite the constraints ask for keep names of their own)
    nodes = {n.name for n in (P.rewrite.apply_rewrites(graph, case.rewrites) if case.rewrites else graph).nodes}
    assert covered == nodes, f"nodes no task covers: {sorted(nodes - covered)}; covered, not nodes: " \
                             f"{sorted(covered - nodes)}"
    for t in plan.create_tasks:  # what runs once at create reads only what exists then
        assert all(plan.buffer(b).kind in ("weight", "const") for b in t.inputs), (t.name, t.inputs)
    kinds = {type(t.params).__name__.removesuffix("Spec") for t in plan.tasks}
    if case.kinds:
        assert kinds & set(case.kinds), f"no task of kind {' or '.join(case.kinds)} in the plan:\n{plan}"
    weights = model_weights(model, graph) or cap.weights
    outs = simulate(plan, weights, inputs)
    compare(case, outs, want, plan)
    _log(case, "planned", plan)
    return "planned"


# ---------------------------------------------------------------------- strategies shared by the sweeps


def seeds() -> st.SearchStrategy[int]:
    return st.integers(0, 2**31 - 1)


def policies(weights: Sequence[str] = ("fp32", "fp32", "bf16")) -> st.SearchStrategy[str]:
    return st.sampled_from(list(weights))


#: How an op's input may be laid out: made by a view of a graph input, so the op reads it through
#: strides (``contiguous``: no view).
LAYOUTS = ("contiguous", "permuted", "strided", "expanded", "offset")


@st.composite
def laid_out(draw, shape: tuple[int, ...], dtype: str = "float32", dist: str = "normal", lo: float = 0.0,
             hi: float = 1.0, layouts: Sequence[str] = LAYOUTS, edges: bool = False):
    """An input tensor of ``shape`` reached through a view: (T of the graph input, the view to
    apply in forward as a plain tuple, see :func:`view`)."""
    kind = draw(st.sampled_from(list(layouts)))
    r = len(shape)
    if kind == "permuted" and r >= 2:
        perm = tuple(draw(st.permutations(range(r))))
        base = tuple(shape[p] for p in perm)
        inv = tuple(perm.index(d) for d in range(r))
        return T(base, dtype, dist, lo, hi, edges), ("permute", inv)
    if kind == "strided" and r >= 1:
        d = draw(st.integers(0, r - 1))
        step = draw(st.integers(2, 3))
        base = tuple(s * step if k == d else s for k, s in enumerate(shape))
        return T(base, dtype, dist, lo, hi, edges), ("step", d, step)
    if kind == "expanded" and r >= 1 and any(s > 1 for s in shape):
        d = draw(st.sampled_from([k for k, s in enumerate(shape) if s > 1]))
        base = tuple(1 if k == d else s for k, s in enumerate(shape))
        return T(base, dtype, dist, lo, hi, edges), ("expand", tuple(shape))
    if kind == "offset" and r >= 1:
        d = draw(st.integers(0, r - 1))
        base = tuple(s + 2 if k == d else s for k, s in enumerate(shape))
        return T(base, dtype, dist, lo, hi, edges), ("narrow", d, 1, shape[d])
    return T(tuple(shape), dtype, dist, lo, hi, edges), ("id",)


def view(x: torch.Tensor, how: tuple) -> torch.Tensor:
    """Apply a layout drawn by :func:`laid_out`."""
    kind = how[0]
    if kind == "permute":
        return x.permute(*how[1])
    if kind == "step":
        _, d, step = how
        idx = [slice(None)] * x.dim()
        idx[d] = slice(None, None, step)
        return x[tuple(idx)]
    if kind == "expand":
        return x.expand(*how[1])
    if kind == "narrow":
        _, d, start, n = how
        return x.narrow(d, start, n)
    return x


def shapes(rank_min: int = 1, rank_max: int = 4, lo: int = 1, hi: int = 6) -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(st.integers(lo, hi), min_size=rank_min, max_size=rank_max).map(tuple)


__all__ = ["Case", "T", "check", "sweep", "examples", "base_seed", "seeds", "policies", "laid_out", "view", "shapes",
           "preserved", "POLICY_TOL", "DTYPE_TOL", "LAYOUTS"]
