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
  with exact rational coefficients (``128 * batch * seq + 256``) and every float as a polynomial
  or the reciprocal of one (a mean's ``1 / (batch * 49)``); each fit is checked on samples it was
  not fitted from, and a number that fits neither is a plan decision that depends on the shape: the
  build says which task and field, instead of guessing;
- arena offsets and the arena's size are taken at the bucket's largest shape (buffers sized for
  the largest shape: each buffer's region at a smaller shape is a prefix of its region there, so
  liveness still keeps them apart); costs are informational and taken there too.

A fitted coefficient that is a fraction makes a divisibility guard (``seq`` a multiple of 64); the
range is a guard; both are checked against the shapes of a call before anything runs, and a
violation is one line naming the input, the dimension and the symbol (:class:`DynamicShapeError`).
:meth:`SymbolicPlan.instantiate` gives the concrete plan at any values in range, which the plan
interpreter (:mod:`stitchcuda.check.interp`) runs against the reference at that shape: how the
generalisation is tested (``tests/test_dynamic.py``).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Iterable, Mapping, Sequence

from .errors import ArgumentError


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


def _monomials(names: Sequence[str]) -> list[tuple[str, ...]]:
    return [c for r in range(len(names) + 1) for c in itertools.combinations(names, r)]


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

    @property
    def constant(self) -> bool:
        return all(not mono for mono, c in self.terms if c != 0)

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
    """The multilinear polynomial (or reciprocal of one, for floats) through every sample, or None."""
    monos = _monomials(names)
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
    plans = [(v, at(v)) for v in _points(names, ranges, extra)]
    largest_v = {n: hi for n, (lo, hi) in ranges.items()}
    largest = at(largest_v)
    skel = skeleton_key(largest)
    for v, p in plans:
        if skeleton_key(p) != skel:
            raise GeneraliseError(f"the plan's structure at {_fmt(v)} differs from the one at {_fmt(largest_v)} "
                                  "inside one bucket (a boundary of two symbols together)")
    bucket = Bucket(dict(ranges), json.loads(json.dumps(largest)))
    leaves = [dict(_leaves(p)) for _, p in plans]
    for path, y_top in _leaves(largest):
        if _is_arena_offset(path):
            continue
        used = [(v, lv[path]) for (v, _), lv in zip(plans, leaves) if not _dont_care(lv, path)]
        if all(y == y_top for _, y in used):
            continue
        active = [n for n in names if len({v[n] for v, _ in used}) > 1]
        if path[0] == "weights":
            raise ParameterShapeError(f"weight {largest['weights'][path[1]]['name']}'s shape changes with "
                                  f"{', '.join(active)}: a dynamic dimension must leave the parameters alone")
        poly = fit(active, used)
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


def generalise(bindings: Sequence[Binding], plan_at: PlanAt, *, extra: int = 3) -> SymbolicPlan:
    """The plan over the bindings' symbols from ``plan_at(values)`` (a plan dict at those values).

    Each symbol's interval is cut, with the other symbols at their largest values, where the plan's
    structure changes and then where a number stops being one polynomial; the buckets are the boxes
    of those intervals, each fitted and checked on its own grid (:func:`_fit_bucket`)."""
    names = [b.dim.name for b in bindings]
    top = {b.dim.name: b.dim.hi for b in bindings}
    cache: dict[tuple, Mapping[str, Any]] = {}

    def at(values: Mapping[str, int]) -> Mapping[str, Any]:
        k = tuple(values[n] for n in names)
        if k not in cache:
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
    first = buckets[0].largest.get("weights", [])
    for b in buckets[1:]:
        for w, v in zip(first, b.largest.get("weights", [])):
            if w != v:
                raise ParameterShapeError(f"weight {w.get('name')}'s shape changes with {', '.join(names)}: a dynamic "
                                          "dimension must leave the parameters alone")
    return SymbolicPlan(tuple(bindings), buckets)


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


def _grid(lo: int, hi: int, extra: int) -> list[int]:
    """Two values to fit a multilinear term and ``extra`` more to check it (fewer in a short interval)."""
    if lo == hi:
        return [lo]
    vs = [lo, hi]
    for k in range(1, extra + 1):
        vs.append(lo + (hi - lo) * k // (extra + 1))
    return sorted(set(vs))


# ---------------------------------------------------------------------- from a reference


def plan_over(reference: Any, dims: Iterable[str] | Mapping[str, tuple[int, int]], *, precision: str = "fp32",
              constraints: Any = None, progress: Callable[[str], None] | None = None) -> SymbolicPlan:
    """Capture and plan ``reference`` (a path, ``kernelbench:L:ID`` or a Reference) at sample values of
    its dynamic dimensions and generalise (the module docstring). Needs PyTorch; compiles nothing."""
    from . import pipeline

    ref, _, _ = pipeline.load_source(reference, None)
    bindings = bind(ref, parse_dynamic(dims))
    say = progress or (lambda text: None)

    def plan_at(values: Mapping[str, int]) -> Mapping[str, Any]:
        sizes = {b.dim.variable: values[b.dim.name] for b in bindings}
        say(f"plan at {_fmt(values)}")
        with Sizes(ref.module, sizes):
            problem = pipeline.capture_problem(ref, precision=precision, weights=False, compiling=False)
            return problem.plan(constraints).to_dict()

    sym = generalise(bindings, plan_at)
    names = [d["name"] for d in sym.buckets[-1].largest["inputs"]]
    sym.bindings = tuple(Binding(b.dim, tuple(Place(p.index, names[p.index] if p.index < len(names) else p.input,
                                                    p.axis) for p in b.places)) for b in sym.bindings)
    return sym
