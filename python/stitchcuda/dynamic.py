"""Dynamic dimensions: one plan for a range of an input dimension (batch, sequence length).

A reference names its sizes as module-level integers (``batch_size = 4``, ``seq_len = 128``) that
``get_inputs()`` reads. ``--dynamic batch=1:64`` names one of them (``batch``, or ``batch_size`` /
``batch_len`` / ``num_batch``) and its range; the input dimensions that follow it are found by
drawing the inputs at two values (on PyTorch's meta device: nothing allocated).

How a plan over symbols is made here: the planner plans concrete shapes, so the reference is
captured and planned at sample values of each symbol, and the plans are *generalised*:

- plans whose structure (every task, strategy, buffer, instruction, flag — all but the numbers)
  is the same form one **bucket**; where the structure changes inside the range (a dimension of 1
  that the planner drops, a kernel variant that serves larger extents) the boundary is found by
  bisection, so each bucket is an exact interval of the symbol;
- inside a bucket every integer of the plan is fitted as a multilinear polynomial of the symbols
  with exact rational coefficients (``128 * batch * seq + 256``), else one with a symbol squared (an
  attention matrix's ``seq * seq``), and every float as a polynomial or the reciprocal of one (a
  mean's ``1 / (batch * 49)``); each fit is checked on samples it was
  not fitted from; a number that is a step of the shape (a count of 64-wide blocks) cuts the
  interval where it steps, and one that fits nothing is a plan decision that depends on the
  shape: the build says which task and field, instead of guessing;
- a bucket of one value at the bottom of a range (batch 1, where the planner drops the
  dimension) joins the bucket above it when the plan interpreter finds that bucket's plan right
  there;
- arena offsets and the arena's size are taken at the bucket's largest shape (buffers sized for
  the largest shape: each buffer's region at a smaller shape is a prefix of its region there, so
  liveness still keeps them apart); costs are informational and taken there too.

A fitted coefficient that is a fraction makes a divisibility guard (``seq`` a multiple of 64); the
range is a guard; both are checked against the shapes of a call before anything runs, and a
violation is one line naming the input, the dimension and the symbol (:class:`DynamicShapeError`).
:meth:`SymbolicPlan.instantiate` gives the concrete plan at any values in range, which the plan
interpreter (:mod:`stitchcuda.check.interp`) runs against the reference at that shape: how the
generalisation is tested (``tests/test_dynamic.py``).

The program over symbols (:func:`build_dynamic`, ``stitchcuda build --dynamic``) is made the same
way one level down: the Coder's program.cu rendered at the bucket's fit points, every number that
differs between the renders fitted and written as an expression of the run's dimensions, and the
fit checked against renders at values it was not made from. ``st_program_run`` reads the
dimensions from its inputs' shapes and checks them first; they travel in the run's ``Io`` to each
task that needs them (no state outlives a call), are part of the CUDA graph's key (a graph a
shape), and the program is created at the largest values (constants made at create are checked
right at the other shapes by the interpreter). One bucket a program for now.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import re
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from .errors import ArgumentError

#: CUDA graphs a dynamic program keeps (a static one keeps GRAPH_SLOTS): one a shape, so that a
#: server seeing its sizes in turn replays them; with a static program's four, a fifth size in
#: rotation would capture anew on every other call. A graph is a few kilobytes of host and device
#: memory: the buffers it runs on are the stream's arena, sized once for the largest shape.
DYNAMIC_GRAPH_SLOTS = 64


class DynamicSpecError(ArgumentError):
    """A ``--dynamic`` argument that does not parse or names nothing in the reference."""


class DynamicShapeError(ArgumentError):
    """Shapes outside what a dynamic plan serves (a range or divisibility guard)."""


class GeneraliseError(ArgumentError):
    """Plans at different values of a symbol that no plan over the symbol reproduces."""


class ParameterShapeError(GeneraliseError):
    """A symbol that changes the shape of a parameter: no bucketing helps."""


# ---------------------------------------------------------------------- the symbols


@dataclass(frozen=True)
class Dim:
    """A dynamic dimension: its name, the reference's module-level integer it sets, its range."""

    name: str
    lo: int
    hi: int
    variable: str = ""

    def __str__(self) -> str:
        return f"{self.name}={self.lo}:{self.hi}"


def parse_dynamic(specs: Iterable[str] | Mapping[str, tuple[int, int]]) -> tuple[Dim, ...]:
    """``["batch=1:64", "seq=16:2048"]`` (or ``{"batch": (1, 64)}``) as Dims, in order."""
    items = list(specs.items()) if isinstance(specs, Mapping) else None
    dims: list[Dim] = []
    if items is None:
        items = []
        for s in specs:
            m = re.fullmatch(r"\s*([A-Za-z_]\w*)\s*=\s*(\d+)\s*:\s*(\d+)\s*", s)
            if not m:
                raise DynamicSpecError(f"--dynamic {s!r}: write NAME=MIN:MAX, e.g. batch=1:64")
            items.append((m.group(1), (int(m.group(2)), int(m.group(3)))))
    for name, (lo, hi) in items:
        if not 1 <= int(lo) <= int(hi):
            raise DynamicSpecError(f"--dynamic {name}={lo}:{hi}: needs 1 <= MIN <= MAX")
        if any(d.name == name for d in dims):
            raise DynamicSpecError(f"--dynamic {name}: named twice")
        dims.append(Dim(name, int(lo), int(hi)))
    if not dims:
        raise DynamicSpecError("--dynamic: no dimension named")
    return tuple(dims)


def parse_tune_shapes(specs: Iterable[str] | Mapping[str, Iterable[int]],
                      dims: Iterable[Dim]) -> dict[str, tuple[int, ...]]:
    """``["batch=1,8,32"]`` (or ``{"batch": [1, 8, 32]}``): the sizes of each named dynamic dimension
    to tune at, each within its range."""
    ranges = {d.name: d for d in dims}
    if isinstance(specs, Mapping):
        items = list(specs.items())
    else:
        items = []
        for s in specs:
            m = re.fullmatch(r"\s*([A-Za-z_]\w*)\s*=\s*(\d+(?:\s*,\s*\d+)*)\s*", s)
            if not m:
                raise DynamicSpecError(f"--tune-shapes {s!r}: write NAME=SIZE,SIZE,..., e.g. batch=1,8,32")
            items.append((m.group(1), [int(x) for x in m.group(2).split(",")]))
    out: dict[str, tuple[int, ...]] = {}
    for name, sizes in items:
        d = ranges.get(name)
        if d is None:
            raise DynamicSpecError(f"--tune-shapes {name}: not a dynamic dimension (these are: {', '.join(ranges)})")
        bad = [x for x in sizes if not d.lo <= int(x) <= d.hi]
        if bad:
            raise DynamicSpecError(f"--tune-shapes {name}: {', '.join(map(str, bad))} outside {d.lo}..{d.hi}")
        out[name] = tuple(sorted({*out.get(name, ()), *(int(x) for x in sizes)}))
    return out


def _variable_of(module: Any, name: str) -> str:
    for cand in (name, f"{name}_size", f"{name}_len", f"num_{name}", f"{name}_length"):
        v = getattr(module, cand, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return cand
    raise DynamicSpecError(f"--dynamic {name}: the reference has no module-level integer {name!r} "
                           f"(nor {name}_size, {name}_len, num_{name}) for get_inputs() to read")


@dataclass(frozen=True)
class Place:
    """Where a symbol sits: input ``index`` (named ``input``), dimension ``axis``."""

    index: int
    input: str
    axis: int


@dataclass(frozen=True)
class Binding:
    dim: Dim
    places: tuple[Place, ...]


class Sizes:
    """The reference's module-level sizes set to given values while a block runs (then restored)."""

    def __init__(self, module: Any, values: Mapping[str, int]):
        self.module, self.values, self.saved = module, dict(values), {}

    def __enter__(self):
        for k, v in self.values.items():
            self.saved[k] = getattr(self.module, k)
            setattr(self.module, k, v)
        return self

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            setattr(self.module, k, v)
        return False


def input_shapes(ref: Any, values: Mapping[str, int]) -> list[tuple[int, ...]]:
    """The shapes of ``get_inputs()`` with the module's sizes at ``values`` (meta device)."""
    import torch

    with Sizes(ref.module, values), torch.device("meta"):
        xs = ref.get_inputs()
    return [tuple(x.shape) if hasattr(x, "shape") else () for x in xs]


def bind(ref: Any, dims: Sequence[Dim], input_names: Sequence[str] | None = None) -> tuple[Binding, ...]:
    """Each Dim's module variable and the input dimensions that equal it (found by drawing the
    inputs at two values of it); a Dim no input dimension follows is an error."""
    out = []
    for d in dims:
        var = _variable_of(ref.module, d.name)
        d = Dim(d.name, d.lo, d.hi, var)
        a, b = (d.lo, d.hi) if d.lo != d.hi else (d.lo, d.lo + 1)
        sa, sb = input_shapes(ref, {var: a}), input_shapes(ref, {var: b})
        places = []
        for i, (x, y) in enumerate(zip(sa, sb)):
            if len(x) != len(y):
                raise DynamicSpecError(f"--dynamic {d.name}: input {i}'s rank changes with {var}")
            for ax, (p, q) in enumerate(zip(x, y)):
                if p == a and q == b:
                    places.append(Place(i, input_names[i] if input_names else f"input {i}", ax))
                elif p != q:
                    raise DynamicSpecError(
                        f"--dynamic {d.name}: input {i} dimension {ax} changes with {var} but is not equal "
                        f"to it ({p} at {var}={a}, {q} at {var}={b}); name that dimension's own variable")
        if not places:
            raise DynamicSpecError(f"--dynamic {d.name}: no input dimension follows {var} "
                                   "(get_inputs() does not use it)")
        out.append(Binding(d, tuple(places)))
    return tuple(out)


# ---------------------------------------------------------------------- polynomials


def _monomials(names: Sequence[str], degree: int = 1) -> list[tuple[str, ...]]:
    """Every product of the symbols with each symbol's power at most ``degree`` (a power repeats
    the name: ``("seq", "seq")``), lowest total degree first."""
    powers = itertools.product(range(degree + 1), repeat=len(names))
    monos = [tuple(n for n, k in zip(names, ks) for _ in range(k)) for ks in powers]
    return sorted(monos, key=lambda m: (len(m), m))


@dataclass(frozen=True)
class Poly:
    """A multilinear polynomial of the symbols with rational coefficients; ``inverse``: its reciprocal."""

    terms: tuple[tuple[tuple[str, ...], Fraction], ...]
    inverse: bool = False
    is_float: bool = False

    def value(self, values: Mapping[str, int]) -> Fraction:
        v = sum((c * math.prod(values[s] for s in mono) for mono, c in self.terms), Fraction(0))
        return v

    def __call__(self, values: Mapping[str, int]) -> int | float:
        v = self.value(values)
        if self.inverse:
            return 1.0 / float(v)
        if self.is_float:
            return float(v)
        if v.denominator != 1:
            raise DynamicShapeError(f"{self} is not a whole number at {_fmt(values)}")
        return int(v)

    def divisors(self) -> dict[str, int]:
        """symbol -> what it must be a multiple of for this integer polynomial to be whole
        (a coefficient c = p / q of a one-symbol term needs that symbol a multiple of q)."""
        need: dict[str, int] = {}
        if self.is_float or self.inverse:
            return need
        for mono, c in self.terms:
            if c.denominator != 1:
                if len(mono) != 1:
                    raise GeneraliseError(f"{self}: a fractional coefficient of a product of symbols")
                s = mono[0]
                need[s] = math.lcm(need.get(s, 1), c.denominator)
        return need

    def __str__(self) -> str:
        parts = []
        for mono, c in self.terms:
            if c == 0:
                continue
            body = " * ".join(mono)
            coef = str(c)
            parts.append(coef if not mono else body if c == 1 else f"{coef} * {body}")
        text = " + ".join(parts) or "0"
        return f"1 / ({text})" if self.inverse else text


def _solve(rows: list[list[Fraction]], rhs: list[Fraction]) -> list[Fraction] | None:
    """The exact solution of an over-determined linear system, or None when it has none or
    several (Gaussian elimination over the rationals)."""
    n = len(rows[0])
    a = [r[:] + [y] for r, y in zip(rows, rhs)]
    piv_cols, r = [], 0
    for c in range(n):
        p = next((i for i in range(r, len(a)) if a[i][c] != 0), None)
        if p is None:
            return None  # under-determined: the samples do not tell this term apart
        a[r], a[p] = a[p], a[r]
        inv = 1 / a[r][c]
        a[r] = [x * inv for x in a[r]]
        for i in range(len(a)):
            if i != r and a[i][c] != 0:
                f = a[i][c]
                a[i] = [x - f * y for x, y in zip(a[i], a[r])]
        piv_cols.append(c)
        r += 1
    if any(row[n] != 0 for row in a[r:]):
        return None  # inconsistent: no polynomial of this form passes through every sample
    return [a[i][n] for i in range(n)]


def fit(names: Sequence[str], samples: Sequence[tuple[Mapping[str, int], int | float]]) -> Poly | None:
    """The multilinear polynomial (or reciprocal of one, for floats) through every sample; else one
    with each symbol squared at most (an attention matrix's ``seq * seq``), where the samples are
    enough to pin it down; or None."""
    for degree in (1, 2):
        poly = _fit_degree(names, samples, degree)
        if poly is not None:
            return poly
    return None


def _fit_degree(names: Sequence[str], samples: Sequence[tuple[Mapping[str, int], int | float]],
                degree: int) -> Poly | None:
    monos = _monomials(names, degree)
    if degree > 1 and len(samples) < len(monos) + 2:
        return None  # too few samples to fit it and check it
    xs = [[Fraction(math.prod(v[s] for s in m)) for m in monos] for v, _ in samples]
    is_float = any(isinstance(y, float) for _, y in samples)
    if not is_float:
        sol = _solve(xs, [Fraction(y) for _, y in samples])
        return None if sol is None else Poly(tuple(zip(monos, sol)))
    ys = [float(y) for _, y in samples]
    for inverse in (False, True):
        if inverse and any(y == 0 for y in ys):
            continue
        target = [Fraction(1 / y if inverse else y).limit_denominator(1 << 40) for y in ys]
        sol = _solve(xs, target)
        if sol is None:
            continue
        sol = [c.limit_denominator(1 << 20) for c in sol]
        p = Poly(tuple(zip(monos, sol)), inverse=inverse, is_float=True)
        if all(math.isclose(p(v), y, rel_tol=1e-6, abs_tol=0.0) for v, y in zip((v for v, _ in samples), ys)):
            return p
    return None


# ---------------------------------------------------------------------- plans


#: Keys taken at the bucket's largest shape instead of fitted: the arena (sized for the largest
#: shape), and the costs and notes (what the report shows, not what runs: a task that is memory-
#: bound at one shape and compute-bound at another runs the same code).
AT_LARGEST = ("arena_bytes", "node_costs", "ceilings", "flops", "bytes", "est_time_s", "time_s", "bound", "note",
              "notes")


def _is_arena_offset(path: tuple) -> bool:
    return len(path) == 3 and path[0] == "buffers" and path[2] == "offset"


def _made_at_create(plan: Mapping[str, Any], path: tuple) -> str:
    """Whether a number belongs to what is made once, when the program is created at the largest
    shape: ``"made"`` for a create-phase task or a constant buffer, ``"layout"`` for the strides and
    offset of a run task's view of such a constant (it holds what was made at the largest shape, so
    it is read as laid out there), ``"extent"`` for that view's shape (the run's own where it fits,
    else the largest's), ``""`` otherwise. :func:`generalise` has the plan interpreter confirm that
    the runs at other shapes are right with what was made."""
    if len(path) < 2:
        return ""
    if path[0] == "buffers":
        return "made" if plan["buffers"][path[1]].get("kind") == "const" else ""
    if path[0] != "tasks":
        return ""
    task = plan["tasks"][path[1]]
    if task.get("phase") == "create":
        return "made"
    consts = {b["name"] for b in plan["buffers"] if b.get("kind") == "const"}
    node: Any = task
    for i, k in enumerate(path[2:]):
        if isinstance(node, Mapping) and node.get("buffer") in consts:
            return "extent" if k == "shape" else "layout"
        try:
            node = node[k]
        except (KeyError, IndexError, TypeError):
            return ""
    return ""


def _skeleton(obj: Any, path: tuple = ()) -> Any:
    """The plan with its numbers masked: two plans of one bucket have the same skeleton."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, (int, float)):
        return "#"
    if isinstance(obj, Mapping):
        return {k: ("~" if k in AT_LARGEST else _skeleton(v, path + (k,))) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_skeleton(v, path + (i,)) for i, v in enumerate(obj)]
    raise TypeError(f"plan value of type {type(obj).__name__} at {'/'.join(map(str, path))}")


def skeleton_key(plan: Mapping[str, Any]) -> str:
    return json.dumps(_skeleton(plan), sort_keys=True)


def _leaves(obj: Any, path: tuple = ()) -> Iterable[tuple[tuple, Any]]:
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            if k in AT_LARGEST:
                continue
            yield from _leaves(v, path + (k,))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _leaves(v, path + (i,))
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield path, obj


def _dont_care(leaves: Mapping[tuple, Any], path: tuple) -> bool:
    """A stride along a dimension of extent 1 at this sample: any value would do (the planner's
    choice there is arbitrary, so it is left out of the fit)."""
    for j in range(len(path) - 2, -1, -1):
        if isinstance(path[j], str) and path[j].endswith("strides"):
            return leaves.get(path[:j] + ("shape", path[-1])) == 1
    return False


def _where(plan: Mapping[str, Any], path: tuple) -> str:
    """A fitted number's place, said as a person would look for it: task and field."""
    if path and path[0] == "tasks" and len(path) > 1:
        return f"task {plan['tasks'][path[1]]['name']}: {'.'.join(map(str, path[2:]))}"
    if path and path[0] == "buffers" and len(path) > 1:
        return f"buffer {plan['buffers'][path[1]]['name']}: {'.'.join(map(str, path[2:]))}"
    return ".".join(map(str, path))


def _fmt(values: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())


def _set(obj: Any, path: tuple, value: Any) -> None:
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value


@dataclass
class Bucket:
    """One structure of the plan over a box of the symbols' values."""

    ranges: dict[str, tuple[int, int]]
    largest: dict[str, Any]                 # the plan at the box's largest values
    fitted: dict[tuple, Poly] = field(default_factory=dict)
    divisors: dict[str, int] = field(default_factory=dict)
    fitted_over: dict[str, tuple[int, int]] | None = None  # the box the fit was made on, where it is smaller
    at_create: set[str] = field(default_factory=set)  # made at create, depending on the symbols (checked)

    @property
    def fit_ranges(self) -> dict[str, tuple[int, int]]:
        return self.fitted_over or self.ranges

    def holds(self, values: Mapping[str, int]) -> bool:
        return all(lo <= values[s] <= hi for s, (lo, hi) in self.ranges.items())

    def instantiate(self, values: Mapping[str, int]) -> dict[str, Any]:
        plan = json.loads(json.dumps(self.largest))
        for path, poly in self.fitted.items():
            _set(plan, path, poly(values))
        return plan


@dataclass
class SymbolicPlan:
    """A plan over dynamic dimensions: its bindings and buckets (see the module docstring)."""

    bindings: tuple[Binding, ...]
    buckets: list[Bucket]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(b.dim.name for b in self.bindings)

    def values_of(self, shapes: Sequence[Sequence[int]]) -> dict[str, int]:
        """The symbols' values read from a call's input shapes; a disagreement, a value out of range
        or one that breaks a divisibility guard is a DynamicShapeError of one line."""
        values: dict[str, int] = {}
        for b in self.bindings:
            seen: tuple[Place, int] | None = None
            for p in b.places:
                v = int(shapes[p.index][p.axis])
                if seen is not None and seen[1] != v:
                    q = seen[0]
                    raise DynamicShapeError(f"{b.dim.name}: {q.input} dimension {q.axis} is {seen[1]} but "
                                            f"{p.input} dimension {p.axis} is {v} (both are {b.dim.name})")
                seen = (p, v)
            assert seen is not None
            p, v = seen
            if not b.dim.lo <= v <= b.dim.hi:
                raise DynamicShapeError(f"{p.input} dimension {p.axis} ({b.dim.name}) is {v}: this program serves "
                                        f"{b.dim.name} {b.dim.lo}..{b.dim.hi}")
            values[b.dim.name] = v
        bucket = self.bucket(values)
        for s, q in bucket.divisors.items():
            if values[s] % q:
                p = next(b for b in self.bindings if b.dim.name == s).places[0]
                raise DynamicShapeError(f"{p.input} dimension {p.axis} ({s}) is {values[s]}: this program needs "
                                        f"{s} a multiple of {q} there")
        return values

    def bucket(self, values: Mapping[str, int]) -> Bucket:
        for b in self.buckets:
            if b.holds(values):
                return b
        raise DynamicShapeError(f"{_fmt(values)}: no bucket of this plan serves it")

    def instantiate(self, values: Mapping[str, int]) -> dict[str, Any]:
        """The concrete plan (a plan dict, :meth:`stitchcuda.plan.Plan.from_dict`) at ``values``."""
        for b in self.bindings:
            v = values[b.dim.name]
            if not b.dim.lo <= v <= b.dim.hi:
                raise DynamicShapeError(f"{b.dim.name}={v}: outside {b.dim.lo}..{b.dim.hi}")
        bucket = self.bucket(values)
        for s, q in bucket.divisors.items():
            if values[s] % q:
                raise DynamicShapeError(f"{s}={values[s]}: this plan needs {s} a multiple of {q}")
        return bucket.instantiate(values)

    def describe(self) -> str:
        lines = []
        for b in self.bindings:
            where = ", ".join(f"{p.input}[{p.axis}]" for p in b.places)
            lines.append(f"{b.dim.name} ({b.dim.variable}) {b.dim.lo}..{b.dim.hi}: {where}")
        for k, bk in enumerate(self.buckets):
            box = ", ".join(f"{s} {lo}..{hi}" for s, (lo, hi) in bk.ranges.items())
            guards = ", ".join(f"{s} % {q} == 0" for s, q in bk.divisors.items())
            lines.append(f"bucket {k}: {box}; {len(bk.fitted)} numbers over the symbols"
                         + (f"; guards {guards}" if guards else ""))
        return "\n".join(lines)


# ---------------------------------------------------------------------- generalising


PlanAt = Callable[[Mapping[str, int]], Mapping[str, Any]]


def sample_values(lo: int, hi: int) -> list[int]:
    """Values of one symbol to plan at: both ends, powers of two, and a few odd ones between."""
    vs = {lo, hi}
    p = 1
    while p <= hi:
        if p >= lo:
            vs.add(p)
        p *= 2
    for f in (0.37, 0.61, 0.83):
        vs.add(lo + int((hi - lo) * f))
    return sorted(vs)


def _boundaries(values: list[int], key: Callable[[int], str]) -> list[tuple[int, int, str]]:
    """The intervals of one symbol over which the plan's structure is one, found exactly: between
    two sampled values of different structures, bisection to where it changes."""
    keys = {v: key(v) for v in values}
    runs: list[tuple[int, int, str]] = []
    lo = values[0]
    for a, b in zip(values, values[1:]):
        if keys[a] == keys[b]:
            continue
        x, y = a, b  # keys differ: the last value of a's structure is in [a, b)
        while y - x > 1:
            m = (x + y) // 2
            keys[m] = key(m)
            if keys[m] == keys[a]:
                x = m
            else:
                y = m
        if keys[y] != keys[b]:
            raise GeneraliseError(f"the plan's structure changes more than once between {a} and {b}")
        runs.append((lo, x, keys[a]))
        lo = y
    runs.append((lo, values[-1], keys[values[-1]]))
    return runs


def _fit_bucket(names: Sequence[str], ranges: Mapping[str, tuple[int, int]], at: PlanAt, extra: int) -> Bucket:
    """The bucket over the box ``ranges``: every number fitted over a grid of the box (both ends and
    ``extra`` values between, a symbol), each fit exact at every grid point; GeneraliseError names
    the first number no polynomial reproduces."""
    largest_v = {n: hi for n, (lo, hi) in ranges.items()}
    largest = at(largest_v)
    skel = skeleton_key(largest)

    def plan_in_bucket(v: dict[str, int]) -> dict:
        p = at(v)
        if skeleton_key(p) != skel:
            raise GeneraliseError(f"the plan's structure at {_fmt(v)} differs from the one at {_fmt(largest_v)} "
                                  "inside one bucket (a boundary of two symbols together)")
        return p

    plans = [(v, plan_in_bucket(v)) for v in _points(names, ranges, extra)]
    bucket = Bucket(dict(ranges), json.loads(json.dumps(largest)))
    leaves = [dict(_leaves(p)) for _, p in plans]
    grid: list[tuple[dict[str, int], dict]] = []

    def dense() -> list[tuple[dict[str, int], dict]]:
        """The plan's leaves on every point of :func:`_dense_points`, made once, when a number needs it."""
        if not grid:
            grid.extend((v, dict(_leaves(plan_in_bucket(v)))) for v in _dense_points(names, ranges))
        return grid
    for path, y_top in _leaves(largest):
        if _is_arena_offset(path):
            continue
        used = [(v, lv[path]) for (v, _), lv in zip(plans, leaves) if not _dont_care(lv, path)]
        if all(y == y_top for _, y in used):
            continue
        made = _made_at_create(largest, path)
        if made in ("made", "layout"):
            bucket.at_create.add(_where(largest, path).split(":")[0])
            continue
        active = [n for n in names if len({v[n] for v, _ in used}) > 1]
        if path[0] == "weights":
            raise ParameterShapeError(f"weight {largest['weights'][path[1]]['name']}'s shape changes with "
                                  f"{', '.join(active)}: a dynamic dimension must leave the parameters alone")
        poly = fit(active, used)
        if poly is None:  # a square of a symbol needs more than the box's edges: a full grid of it too
            poly = fit(active, used + [(v, lv[path]) for v, lv in dense() if not _dont_care(lv, path)])
        if poly is None and made == "extent":
            bucket.at_create.add(_where(largest, path).split(":")[0])
            continue
        if poly is None:
            shown = ", ".join(f"{y} at {_fmt(v)}" for v, y in used[:4])
            raise GeneraliseError(f"{_where(largest, path)} is no polynomial of {', '.join(active)} "
                                  f"({shown}, ...): a decision of the plan that depends on the shape")
        bucket.fitted[path] = poly
        for sym, q in poly.divisors().items():
            bucket.divisors[sym] = math.lcm(bucket.divisors.get(sym, 1), q)
    return bucket


def _split_by_fit(lo: int, hi: int, fits: Callable[[int, int], bool]) -> list[tuple[int, int]]:
    """[lo, hi] cut into the longest intervals, left to right, over which ``fits``: a number that is
    a step of the shape (a count of 64-wide blocks) is a polynomial on each step."""
    out, a = [], lo
    while a <= hi:
        if fits(a, hi):
            out.append((a, hi))
            break
        x, y = a, hi  # fits(a, x) (one value always does), not fits(a, y)
        while y - x > 1:
            m = (x + y) // 2
            if fits(a, m):
                x = m
            else:
                y = m
        out.append((a, x))
        a = x + 1
    return out


def generalise(bindings: Sequence[Binding], plan_at: PlanAt, *, extra: int = 3,
               accept: Callable[[Mapping[str, int], dict[str, Any]], bool] | None = None,
               progress: Callable[[str], None] | None = None) -> SymbolicPlan:
    """The plan over the bindings' symbols from ``plan_at(values)`` (a plan dict at those values).

    Each symbol's interval is cut, with the other symbols at their largest values, where the plan's
    structure changes and then where a number stops being one polynomial; the buckets are the boxes
    of those intervals, each fitted and checked on its own grid (:func:`_fit_bucket`).

    ``accept(values, plan)``: whether a plan instantiated outside the box it was fitted on is right
    at ``values`` (the plan interpreter against the reference). A bucket of one value at the bottom
    of a symbol's range (batch 1, where the planner drops the dimension: another structure, the
    same answer) joins the bucket above it when ``accept`` says that bucket's plan is right there at
    every corner of the other symbols; one bucket serves both. ``progress`` is told each plan made
    (a range with many changes of structure takes many)."""
    names = [b.dim.name for b in bindings]
    top = {b.dim.name: b.dim.hi for b in bindings}
    cache: dict[tuple, Mapping[str, Any]] = {}

    def at(values: Mapping[str, int]) -> Mapping[str, Any]:
        k = tuple(values[n] for n in names)
        if k not in cache:
            if progress is not None:
                progress(f"plan {len(cache) + 1} at {', '.join(f'{n}={v}' for n, v in zip(names, k))}")
            cache[k] = plan_at(dict(values))
        return cache[k]

    per_symbol: dict[str, list[tuple[int, int]]] = {}
    for b in bindings:
        n = b.dim.name
        runs = _boundaries(sample_values(b.dim.lo, b.dim.hi), lambda v: skeleton_key(at({**top, n: v})))

        def fits(lo: int, hi: int, n: str = n) -> bool:
            try:
                _fit_bucket([n], {n: (lo, hi)}, lambda v: at({**top, **v}), extra)
                return True
            except ParameterShapeError:
                raise
            except GeneraliseError:
                return False

        per_symbol[n] = [iv for lo, hi, _ in runs for iv in _split_by_fit(lo, hi, fits)]

    buckets = [_fit_bucket(names, dict(zip(names, box)), at, extra)
               for box in itertools.product(*(per_symbol[n] for n in names))]
    if accept is not None:
        for n in names:
            buckets = _join_bottom(buckets, n, names, accept)
        for b in buckets:
            _check_made_at_create(b, names, accept)
    first = buckets[0].largest.get("weights", [])
    for b in buckets[1:]:
        for w, v in zip(first, b.largest.get("weights", [])):
            if w != v:
                raise ParameterShapeError(f"weight {w.get('name')}'s shape changes with {', '.join(names)}: a dynamic "
                                          "dimension must leave the parameters alone")
    return SymbolicPlan(tuple(bindings), buckets)


def _check_made_at_create(bucket: Bucket, names: Sequence[str],
                          accept: Callable[[Mapping[str, int], dict[str, Any]], bool]) -> None:
    """What is made once at the largest shape but depends on the symbols (a causal mask's block map)
    is served only where the plan interpreter finds the runs right with it: at every corner of the
    bucket and its middle."""
    if not bucket.at_create:
        return
    box = bucket.ranges
    points = [dict(zip(names, c)) for c in itertools.product(*({box[n][0], box[n][1]} for n in names))]
    points.append({n: (box[n][0] + box[n][1]) // 2 for n in names})
    for v in points:
        if not accept(v, bucket.instantiate(v)):
            raise GeneraliseError(f"{', '.join(sorted(bucket.at_create))} (made once, when the program is created "
                                  f"at the largest shape) depend on {', '.join(names)} and the runs are not right at "
                                  f"{_fmt(v)} with them")


def _join_bottom(buckets: list[Bucket], n: str, names: Sequence[str],
                 accept: Callable[[Mapping[str, int], dict[str, Any]], bool]) -> list[Bucket]:
    """Each bucket of one value of ``n`` at the bottom of its range joined to the bucket above it
    where that bucket's plan is accepted there (:func:`generalise`)."""
    out = list(buckets)
    for single in buckets:
        lo, hi = single.ranges[n]
        if lo != hi:
            continue
        others = {m: single.ranges[m] for m in names if m != n}
        above = next((b for b in out if b.ranges[n][0] == lo + 1 and all(b.ranges[m] == r for m, r in others.items())),
                     None)
        if above is None or single not in out:
            continue
        corners = [dict(zip(others, c), **{n: lo}) for c in itertools.product(*({a, b} for a, b in others.values()))]
        if all(accept(v, above.instantiate(v)) for v in corners):
            above.fitted_over = dict(above.fit_ranges)
            above.ranges = {**above.ranges, n: (lo, above.ranges[n][1])}
            out.remove(single)
    return out


def _points(names: Sequence[str], ranges: Mapping[str, tuple[int, int]], extra: int) -> list[dict[str, int]]:
    """Where a bucket is fitted and checked: every corner of its box (what a multilinear term needs),
    each symbol's ``extra`` interior values with the others at their largest, and the box's middle;
    each point beyond the corners is a check the fit must pass."""
    corners = [dict(zip(names, c)) for c in itertools.product(*({ranges[n][0], ranges[n][1]} for n in names))]
    hi = {n: ranges[n][1] for n in names}
    inner = [{**hi, n: v} for n in names for v in _grid(*ranges[n], extra)]
    middle = [{n: (ranges[n][0] + ranges[n][1]) // 2 for n in names}]
    out: list[dict[str, int]] = []
    for v in corners + inner + middle:
        if v not in out:
            out.append(v)
    return out


def _dense_points(names: Sequence[str], ranges: Mapping[str, tuple[int, int]]) -> list[dict[str, int]]:
    """Every point of a grid of the box, four values a symbol (three from three symbols on): what
    a symbol's square needs, which the box's edges and middle do not pin down."""
    per = 4 if len(names) <= 2 else 3
    return [dict(zip(names, c)) for c in itertools.product(*(_grid(*ranges[n], per - 2) for n in names))]


def _grid(lo: int, hi: int, extra: int) -> list[int]:
    """Two values to fit a multilinear term and ``extra`` more to check it (fewer in a short interval)."""
    if lo == hi:
        return [lo]
    vs = [lo, hi]
    for k in range(1, extra + 1):
        vs.append(lo + (hi - lo) * k // (extra + 1))
    return sorted(set(vs))


# ---------------------------------------------------------------------- from a reference


class _Problems:
    """A reference captured at values of its dynamic dimensions (each once), its plans there, and
    whether a plan is right there (the plan interpreter against the reference in float64)."""

    def __init__(self, ref: Any, bindings: Sequence[Binding], precision: str, *, seed: int = 0,
                 arch: str | None = None, compiling: bool = False, constraints: Any = None,
                 progress: Callable[[str], None] | None = None):
        self.ref, self.bindings, self.precision, self.seed = ref, tuple(bindings), precision, seed
        self.arch, self.compiling, self.constraints = arch, compiling, constraints
        self.say = progress or (lambda text: None)
        self.cache: dict[tuple, Any] = {}

    def sizes(self, values: Mapping[str, int]) -> Sizes:
        return Sizes(self.ref.module, {b.dim.variable: values[b.dim.name] for b in self.bindings})

    def at(self, values: Mapping[str, int], weights: bool = False):
        from . import pipeline

        key = (tuple(values[b.dim.name] for b in self.bindings), weights)
        if key not in self.cache:
            with self.sizes(values):
                self.cache[key] = pipeline.capture_problem(self.ref, precision=self.precision, weights=weights,
                                                           seed=self.seed, arch=self.arch, compiling=self.compiling)
        return self.cache[key]

    def plan_at(self, values: Mapping[str, int]) -> Mapping[str, Any]:
        self.say(f"plan at {_fmt(values)}")
        return self.at(values).plan(self.constraints).to_dict()

    def accept(self, values: Mapping[str, int], plan: dict[str, Any], tol: float = 1e-4) -> bool:
        import copy

        import torch

        from . import plan as P
        from .check.interp import simulate

        with self.sizes(values):
            model, inputs = self.ref.instantiate(seed=self.seed)
        try:
            outs = simulate(P.Plan.from_dict(plan), self.at(values, weights=True).weights,
                            [x for x in inputs if isinstance(x, torch.Tensor)])
        except Exception:  # noqa: BLE001 - a plan the interpreter cannot run there is not right there
            return False
        with torch.no_grad():
            want = copy.deepcopy(model).double()(*[x.double() if isinstance(x, torch.Tensor) and x.is_floating_point()
                                                   else x for x in inputs])
        want = list(want) if isinstance(want, (tuple, list)) else [want]
        for o, w in zip(outs, want):
            if tuple(o.shape) != tuple(w.shape):
                return False
            o, w = o.double(), w.double()
            if torch.isnan(o).any() and not torch.isnan(w).any():
                return False
            if ((o - w).abs() / (1 + w.abs())).nan_to_num(0.0).max().item() > tol:
                return False
        return True


def plan_over(reference: Any, dims: Iterable[str] | Mapping[str, tuple[int, int]], *, precision: str = "fp32",
              constraints: Any = None, seed: int = 0,
              progress: Callable[[str], None] | None = None) -> SymbolicPlan:
    """Capture and plan ``reference`` (a path, ``kernelbench:L:ID`` or a Reference) at sample values of
    its dynamic dimensions and generalise (the module docstring). Needs PyTorch; compiles nothing."""
    from . import pipeline

    ref, _, _ = pipeline.load_source(reference, None)
    problems = _Problems(ref, bind(ref, parse_dynamic(dims)), precision, seed=seed, constraints=constraints,
                         progress=progress)
    return _named(generalise(problems.bindings, problems.plan_at, accept=problems.accept))


def _named(sym: SymbolicPlan) -> SymbolicPlan:
    """The bindings' places named after the plan's inputs."""
    names = [d["name"] for d in sym.buckets[-1].largest["inputs"]]
    sym.bindings = tuple(Binding(b.dim, tuple(Place(p.index, names[p.index] if p.index < len(names) else p.input,
                                                    p.axis) for p in b.places)) for b in sym.bindings)
    return sym


# ---------------------------------------------------------------------- programs over symbols

_SEGMENT = re.compile(r'R"(?P<d>\w*)\((?s:.*?)\)(?P=d)"|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*(?s:.*?)\*/')
_NUMBER = re.compile(r"(?<![\w.])(\d+\.\d*(?:[eE][-+]?\d+)?f?|\d+[eE][-+]?\d+f?|\d+)(?![\w.])")
_PROSE_NUMBER = re.compile(r"(?<!\w)(?<!\d\.)\d+(?:\.\d+)?(?!\w)")  # in strings and comments: "0..255", "1.5 ms"


def _tokens(src: str) -> list[tuple[str, str]]:
    """program.cu as (context, text) tokens: ``text`` between numbers, and numbers in ``code``,
    ``raw`` (a raw string: the manifest's JSON), ``string`` or ``comment`` context."""
    out: list[tuple[str, str]] = []

    def split(text: str, ctx: str) -> None:
        pos = 0
        for m in (_NUMBER if ctx == "code" else _PROSE_NUMBER).finditer(text):
            out.append(("text", text[pos:m.start()]))
            out.append((ctx, m.group(0)))
            pos = m.end()
        out.append(("text", text[pos:]))

    pos = 0
    for m in _SEGMENT.finditer(src):
        split(src[pos:m.start()], "code")
        seg = m.group(0)
        ctx = "raw" if seg.startswith('R"') else "string" if seg[0] in "\"'" else "comment"
        split(seg, ctx)
        pos = m.end()
    split(src[pos:], "code")
    return out


def _number(text: str) -> int | float:
    t = text[:-1] if text.endswith("f") else text
    return float(t) if any(c in t for c in ".eE") else int(t)


def _c_expr(poly: Poly, index: Mapping[str, int]) -> str:
    """``poly`` as C++ over ``st_dyn[k]`` (int64_t; a fractional coefficient divides last: exact under
    the divisibility guard that coefficient made)."""
    parts = []
    for mono, c in poly.terms:
        if c == 0:
            continue
        factors = [f"st_dyn[{index[s]}]" for s in mono]
        coef = [] if c.numerator == 1 and factors else [f"int64_t({c.numerator})"]
        body = " * ".join([*coef, *factors])
        parts.append(f"({body}) / {c.denominator}" if c.denominator != 1 else body)
    expr = " + ".join(parts) or "int64_t(0)"
    if poly.inverse:
        return f"(1.0 / double({expr}))"
    return expr if len(parts) == 1 and " " not in expr else f"({expr})"


def _text_expr(poly: Poly) -> str:
    return str(poly).replace(" * ", "*")


def generalise_source(sym: SymbolicPlan, render_at: Callable[[Mapping[str, int]], str], *,
                      extra: int = 3, checks: int = 2) -> tuple[str, dict[str, int]]:
    """program.cu over the symbols of a one-bucket plan: the Coder's program rendered at the bucket's
    fit points (from :meth:`SymbolicPlan.instantiate`), then every number that differs between the
    renders fitted as in :func:`_fit_bucket` and written as an expression of the run's symbols (C++
    ``st_dyn[k]``; in the manifest's JSON a quoted expression, in strings and comments the
    expression's text). Every render must be the same text but for numbers; a number no polynomial
    reproduces is a GeneraliseError naming its line; the fit is then checked against the Coder's own
    program at ``checks`` random values it was not made from. Returns the source and what each symbol
    must be a multiple of for its numbers to be whole (the bucket's guards and the code's own)."""
    bucket = _one_bucket(sym)
    names = list(sym.names)
    index = {n: k for k, n in enumerate(names)}
    points = _points(names, bucket.fit_ranges, extra)
    renders = [(v, _tokens(render_at(v))) for v in points]
    top = {n: hi for n, (lo, hi) in bucket.fit_ranges.items()}
    base = next(t for v, t in renders if v == top)

    def same_text(v: Mapping[str, int], toks: list) -> None:
        bad = next((i for i, (a, b) in enumerate(zip(toks, base))
                    if a[0] != b[0] or (a[0] == "text" and a[1] != b[1])), None)
        if bad is not None or len(toks) != len(base):
            i = bad if bad is not None else min(len(toks), len(base)) - 1
            line = 1 + sum(t.count("\n") for _, t in base[:i])
            show = lambda ts: "".join(t for _, t in ts[max(0, i - 3):i + 2]).strip().replace("\n", " | ")[:160]
            raise GeneraliseError(f"program.cu at {_fmt(v)} differs from the one at {_fmt(top)} in more than its "
                                  f"numbers (line {line}: {show(toks)!r} against {show(base)!r}): the Coder made "
                                  "another choice there")

    for v, toks in renders:
        same_text(v, toks)
    dense: list = []  # renders on a full grid of the box, made when a number is a symbol's square

    def dense_renders() -> list:
        if not dense:
            for v in _dense_points(names, bucket.fit_ranges):
                toks = _tokens(render_at(v))
                same_text(v, toks)
                dense.append((v, toks))
        return dense
    out: list[str] = []
    need = dict(bucket.divisors)
    polys: dict[int, Poly] = {}
    line = 1
    for i, (ctx, text) in enumerate(base):
        if ctx == "text" or all(toks[i][1] == text for _, toks in renders):
            out.append(text)
            line += text.count("\n")
            continue
        samples = [(v, _number(toks[i][1])) for v, toks in renders]
        active = [n for n in names if len({v[n] for v, _ in samples}) > 1]
        poly = fit(active, samples)
        if poly is None:  # a symbol's square: the full grid's renders too
            poly = fit(active, samples + [(v, _number(toks[i][1])) for v, toks in dense_renders()])
        if poly is None:
            shown = ", ".join(f"{y} at {_fmt(v)}" for v, y in samples[:4])
            raise GeneraliseError(f"program.cu line {line}: {text} is no polynomial of {', '.join(active)} "
                                  f"({shown}, ...)")
        polys[i] = poly
        for sym_name, q in poly.divisors().items():
            need[sym_name] = math.lcm(need.get(sym_name, 1), q)
        if ctx == "code":
            expr = _c_expr(poly, index)
            out.append(f"static_cast<float>{expr}" if text.endswith("f") and poly.is_float else expr)
        elif ctx == "raw":
            out.append(f'"{_text_expr(poly)}"')
        else:
            out.append(_text_expr(poly))
    # checked where nothing was fitted: the Coder's own program at values between the fit points has
    # every number the fitted expressions give there (a guard-breaking value is not a check)
    rng = random.Random(0)
    for _ in range(checks):
        v = {n: rng.randint(lo, hi) for n, (lo, hi) in bucket.fit_ranges.items()}
        if any(v[n] % q for n, q in need.items()) or v in points:
            continue
        toks = _tokens(render_at(v))
        if len(toks) != len(base) or any(a[0] != b[0] or (a[0] == "text" and a[1] != b[1]) for a, b in zip(toks, base)):
            raise GeneraliseError(f"program.cu at {_fmt(v)} differs from the fitted one in more than its numbers")
        for i, (ctx, text) in enumerate(base):
            if ctx == "text":
                continue
            got = _number(toks[i][1])
            want = polys[i](v) if i in polys else _number(text)
            if not (math.isclose(got, want, rel_tol=1e-6) if isinstance(want, float) else got == want):
                line = 1 + sum(t.count("\n") for _, t in base[:i])
                raise GeneraliseError(f"program.cu line {line}: {toks[i][1]} at {_fmt(v)}, but the fit gives {want}")
    return "".join(out), need


def _one_bucket(sym: SymbolicPlan) -> Bucket:
    """The plan's only bucket: a program over several is not generated yet (GeneraliseError names them)."""
    if len(sym.buckets) != 1:
        raise GeneraliseError(f"{len(sym.buckets)} buckets ({'; '.join(_box(b) for b in sym.buckets)}): a program "
                              "over several buckets is not generated yet; narrow the range to one of them")
    return sym.buckets[0]


def _box(b: Bucket) -> str:
    return ", ".join(f"{s} {lo}..{hi}" for s, (lo, hi) in b.ranges.items())


def _glue(src: str, sym: SymbolicPlan, input_names: Sequence[str], name: str, divisors: Mapping[str, int]) -> str:
    """The run-time part of a program over symbols: ``st_dyn`` (the symbols' values, the largest
    while the program is created), set and checked at the top of ``st_program_run`` from the inputs'
    shapes (one-line errors naming the input, the dimension and the symbol), and the symbols in the
    CUDA graph key, so each shape captures and replays its own graph."""
    from .code.skeleton import GRAPH_SLOTS

    n = len(sym.bindings)
    tops = ", ".join(str(b.dim.hi) for b in sym.bindings)
    names = ", ".join(b.dim.name for b in sym.bindings)
    decl = (f"\nnamespace {{\n\n// The dynamic dimensions ({names}): a run's are read from its inputs' shapes and checked by\n"
            f"// st_program_run before anything else, then handed to each task that needs them (Io::dyn);\n"
            f"// the program is created at their largest values.\n"
            f"constexpr int kDynSyms = {n};\nconstexpr int64_t kDynLargest[{n}] = {{{tops}}};\n\n}}  // namespace\n")
    at = src.find("\nnamespace {\n")  # the first: after the program's includes, before any use
    if at < 0:
        raise GeneraliseError("program.cu has no anonymous namespace to put the dynamic dimensions before")
    src = src[:at] + decl + src[at:]

    def edit(old: str, new: str) -> None:
        nonlocal src
        if src.count(old) != 1:
            raise GeneraliseError(f"program.cu: expected one {old.strip()!r} to extend for dynamic dimensions")
        src = src.replace(old, new)

    edit("constexpr int kGraphKeys = kNumInputs + kNumOutputs + 1;",
         "constexpr int kGraphKeys = kNumInputs + kNumOutputs + kDynSyms + 1;")
    edit(f"constexpr int kGraphSlots = {GRAPH_SLOTS};",
         f"constexpr int kGraphSlots = {DYNAMIC_GRAPH_SLOTS};  // a graph a shape: a range of sizes served in turn")
    edit("  for (int i = 0; i < kNumOutputs; ++i) key[kNumInputs + i] = io.out[i];\n",
         "  for (int i = 0; i < kNumOutputs; ++i) key[kNumInputs + i] = io.out[i];\n"
         "  for (int k = 0; k < kDynSyms; ++k)  // a shape is a graph of its own\n"
         "    key[kNumInputs + kNumOutputs + k] = reinterpret_cast<const void*>(static_cast<intptr_t>(io.dyn[k]));\n")
    edit("  char* arena;\n};", "  char* arena;\n  int64_t dyn[kDynSyms];  // the run's dynamic dimensions\n};")
    edit("  io.arena = static_cast<char*>(arena);\n",
         "  io.arena = static_cast<char*>(arena);\n  for (int k = 0; k < kDynSyms; ++k) io.dyn[k] = st_dyn[k];\n")
    lines = ["  // dynamic dimensions: each read where it sits, checked against its other places, its range and",
             "  // what it must be a multiple of", "  int64_t st_dyn[kDynSyms];", "  char dyn_msg[320];"]
    for k, b in enumerate(sym.bindings):
        d, first = b.dim, b.places[0]
        where = f"input {first.index} '{input_names[first.index]}' dimension {first.axis} ({d.name})"
        lines += [
            f"  if (n_in > {first.index} && in[{first.index}].ndim <= {first.axis})",
            f"    return fail(ST_ERR_INVALID_ARGUMENT, \"{name}: run: input {first.index} '{input_names[first.index]}' "
            f"has too few dimensions: dimension {first.axis} is {d.name}\");",
            f"  st_dyn[{k}] = in[{first.index}].shape[{first.axis}];",
            f"  if (st_dyn[{k}] < {d.lo} || st_dyn[{k}] > {d.hi}) {{",
            f"    std::snprintf(dyn_msg, sizeof dyn_msg, \"{name}: run: {where} is %lld: this program serves "
            f"{d.name} {d.lo}..{d.hi}\", static_cast<long long>(st_dyn[{k}]));",
            "    return fail(ST_ERR_INVALID_ARGUMENT, dyn_msg);", "  }"]
        q = divisors.get(d.name, 1)
        if q > 1:
            lines += [f"  if (st_dyn[{k}] % {q} != 0) {{",
                      f"    std::snprintf(dyn_msg, sizeof dyn_msg, \"{name}: run: {where} is %lld: this program needs "
                      f"{d.name} a multiple of {q}\", static_cast<long long>(st_dyn[{k}]));",
                      "    return fail(ST_ERR_INVALID_ARGUMENT, dyn_msg);", "  }"]
        for p in b.places[1:]:
            lines += [
                f"  if (in[{p.index}].ndim <= {p.axis} || in[{p.index}].shape[{p.axis}] != st_dyn[{k}]) {{",
                f"    std::snprintf(dyn_msg, sizeof dyn_msg, \"{name}: run: {d.name}: input {first.index} "
                f"'{input_names[first.index]}' dimension {first.axis} is %lld but input {p.index} "
                f"'{input_names[p.index]}' dimension {p.axis} is %lld (both are {d.name})\", "
                f"static_cast<long long>(st_dyn[{k}]), static_cast<long long>(in[{p.index}].ndim > {p.axis} ? "
                f"in[{p.index}].shape[{p.axis}] : -1));",
                "    return fail(ST_ERR_INVALID_ARGUMENT, dyn_msg);", "  }"]
    run = src.find("ST_API st_status st_program_run(")
    first_check = src.find("  const int64_t si0[] =", run)
    if run < 0 or first_check < 0:
        raise GeneraliseError("program.cu: st_program_run's input checks not found")
    src = src[:first_check] + "\n".join(lines) + "\n" + src[first_check:]
    src = _hand_symbols(src)
    if "#include <cstdio>" not in src:
        src = src.replace("#include <cstdint>\n", "#include <cstdint>\n#include <cstdio>\n", 1)
    return src


_FUNCTION = re.compile(r"^(?:ST_API\s+)?[A-Za-z_][\w:<>*&\s]*?\b(\w+)\(([^;{}]*?)\)\s*\{", re.M)


def _hand_symbols(src: str) -> str:
    """Where the symbols come from in each function that uses them (no state outlives a call): a task
    takes them as its first parameter (``const int64_t* st_dyn``) and its callers pass the run's
    (``io.dyn``) or, at create, the largest (``kDynLargest``); a function with the run's Io reads
    ``io.dyn``; st_program_run has its own. Device code cannot use them: GeneraliseError."""
    spans = []
    for m in _FUNCTION.finditer(src):
        depth, i = 1, m.end()
        while depth and i < len(src):
            depth += {"{": 1, "}": -1}.get(src[i], 0)
            i += 1
        spans.append((m.start(), m.end(), i, m.group(1), m.group(2)))
    tasks = {name for a, b, e, name, params in spans
             if "st_dyn[" in src[b:e] and params.rstrip().endswith("cudaStream_t stream")
             and "const Io&" not in params}
    out, pos = [], 0
    for a, b, e, name, params in spans:
        if a < pos:
            continue  # nested (a lambda or a local struct): its enclosing function was handled
        head, body = src[a:b], src[b:e]
        if re.search(r"__(device|global)__", head) and "st_dyn[" in body:
            raise GeneraliseError(f"device code {name} holds a number that depends on the dynamic dimensions")
        if name in tasks:
            head = head.replace(f"{name}(", f"{name}(const int64_t* st_dyn, ", 1)
        elif name == "st_program_run":
            pass  # its own st_dyn, read from the inputs
        elif "const Io& io" in params:
            body = body.replace("st_dyn[", "io.dyn[")
        else:
            body = body.replace("st_dyn[", "kDynLargest[")
        for t in tasks:
            body = body.replace(f"task::{t}(", f"task::{t}({'io.dyn' if 'const Io& io' in params else 'kDynLargest'}, ")
        out.append(src[pos:a] + head + body)
        pos = e
    out.append(src[pos:])
    return "".join(out)


def _shape_exprs(bucket: Bucket, key: str) -> tuple[tuple[int | str, ...], ...]:
    out = []
    for i, spec in enumerate(bucket.largest[key]):
        dims = []
        for j, x in enumerate(spec["shape"]):
            poly = bucket.fitted.get((key, i, "shape", j))
            dims.append(x if poly is None else _text_expr(poly))
        out.append(tuple(dims))
    return tuple(out)


def build_dynamic(reference: Any, dims: Iterable[str] | Mapping[str, tuple[int, int]], *, precision: str = "fp32",
                  out: Any = None, arch: str | None = None, seed: int = 0, compile: bool = True, cache: Any = None,
                  progress: Callable[[str], None] | None = None,
                  tune_shapes: Iterable[str] | Mapping[str, Iterable[int]] = ()):
    """A program folder serving the dynamic dimensions ``dims`` (``["batch=1:64"]``): the plan over
    symbols (:func:`generalise`), its program (:func:`generalise_source` and the run-time glue), the
    manifest's ``dynamic`` block, weights drawn once (no dimension may change them), compiled.
    Returns the pipeline's BuildOutcome; the folder's ``plan.json`` is the plan at the largest shape
    and ``plan.dynamic.txt`` says how the plan depends on the symbols. ``tune_shapes``
    (``["batch=1,8,32"]``): sizes the manifest names for the Verifier to time and tune at."""
    import dataclasses as dc

    from . import code as coder
    from . import manifest as mf
    from . import pipeline
    from . import plan as P

    t0 = time.monotonic()
    if precision not in pipeline._POLICY_NAMES:
        raise pipeline.BuildInputError(f"unknown precision {precision!r}: use one of {', '.join(pipeline._POLICY_NAMES)}")
    pipeline.need_torch("build")
    ref, _, text = pipeline.load_source(reference, None)
    out = pipeline._check_out(Path(out) if out is not None else Path(pipeline.DEFAULT_OUT) / ref.name)
    say = progress or (lambda stage: None)
    parsed = parse_dynamic(dims)
    tuned = parse_tune_shapes(tune_shapes, parsed)
    problems = _Problems(ref, bind(ref, parsed), precision, seed=seed, arch=arch, compiling=compile)
    problem_at = problems.at

    say("plan")
    sym = _named(generalise(problems.bindings, problems.plan_at, accept=problems.accept, progress=say))
    top = {b.dim.name: b.dim.hi for b in sym.bindings}
    input_names = [x["name"] for x in sym.buckets[-1].largest["inputs"]]
    bucket = _one_bucket(sym)

    def render_at(values: Mapping[str, int]) -> str:
        return problem_at(values).code(P.Plan.from_dict(sym.instantiate(values))).program_cu

    say("code")
    name = bucket.largest["name"]
    src, divisors = generalise_source(sym, render_at)
    src = _glue(src, sym, input_names, name, divisors)
    final = problem_at(top, weights=True)
    plan = P.Plan.from_dict(sym.instantiate(top))
    ps = final.code(plan)
    for name, sizes in tuned.items():
        q = divisors.get(name, 1)
        if any(x % q for x in sizes):
            raise DynamicSpecError(f"--tune-shapes {name}: this program needs {name} a multiple of {q}")
    dyn = mf.Dynamic(
        tuple(mf.DynamicDim(b.dim.name, b.dim.lo, b.dim.hi, tuple((p.input, p.axis) for p in b.places),
                            divisors.get(b.dim.name, 1), b.dim.variable, tuned.get(b.dim.name, ()))
              for b in sym.bindings),
        _shape_exprs(bucket, "inputs"), _shape_exprs(bucket, "outputs"), int(plan.arena_bytes))
    manifest = dc.replace(ps.manifest, source_hash=mf.hash_source(src), dynamic=dyn,
                          generator=f"{ps.manifest.generator}, over {', '.join(str(b.dim) for b in sym.bindings)}")
    outcome = pipeline.write_program(plan, coder.ProgramSource(src, manifest, ps.weights), final.weights, out,
                                     reference_text=text, compile=compile, cache=cache, progress=progress)
    outcome = dc.replace(outcome, seconds={**outcome.seconds, "total": time.monotonic() - t0})
    if outcome.ok:
        (outcome.directory / "plan.dynamic.txt").write_text(sym.describe() + "\n", encoding="utf-8")
    return outcome
