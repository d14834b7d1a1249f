"""Strided views: the layout algebra the planner uses to fold views into layouts.

A :class:`View` is a tensor as a program sees it in memory: a buffer, an element offset, a
shape and element strides. Every layout operator of the IR (``view``, ``permute``,
``slice``, ``unsqueeze``, ``expand`` ...) maps a View to a View without touching memory when
the result is expressible with strides — exactly PyTorch's rules — and to ``None`` when it is
not (a ``view`` of a non-contiguous tensor that would need a copy). The planner then inserts
a copy. Kernels ask the questions the functions at the bottom answer: can these dims be
collapsed into one with a uniform stride, is this a row-major matrix, which dims can be
merged for an elementwise launch.

Plain data and plain Python: no PyTorch, so planning runs anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from .ir import DTYPE_SIZES

#: PyTorch's "to the end" for slice ends.
INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class View:
    """``buffer[offset + sum(i_d * strides[d])]`` for every index ``i`` of ``shape``."""

    buffer: str
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "strides", tuple(int(s) for s in self.strides))
        if len(self.shape) != len(self.strides):
            raise ValueError(f"view of {self.buffer}: shape {self.shape} and strides {self.strides} differ in rank")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return DTYPE_SIZES[self.dtype]

    @property
    def footprint(self) -> int:
        """Distinct elements addressed (a broadcast dim counts once)."""
        return math.prod(d for d, s in zip(self.shape, self.strides) if s != 0) if self.numel else 0

    @property
    def span(self) -> int:
        """Elements from the first to one past the last addressed element (0 when empty)."""
        if self.numel == 0:
            return 0
        return 1 + sum((d - 1) * abs(s) for d, s in zip(self.shape, self.strides))

    def is_contiguous(self) -> bool:
        return same_strides(self.shape, self.strides, contiguous_strides(self.shape))

    def describe(self) -> str:
        return f"{self.buffer}+{self.offset} {self.dtype}{list(self.shape)} strides {list(self.strides)}"


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= max(int(d), 1)
    return tuple(reversed(out))


def contiguous(buffer: str, shape: Sequence[int], dtype: str, offset: int = 0) -> View:
    return View(buffer, offset, tuple(shape), contiguous_strides(shape), dtype)


def strides_in_order(shape: Sequence[int], order: Sequence[int]) -> tuple[int, ...]:
    """Dense strides with the dims laid out outermost to innermost as ``order`` lists them
    (``order`` = (0, 1, ..., n-1): contiguous; :func:`channels_last_order`: PyTorch's channels_last)."""
    out = [0] * len(shape)
    s = 1
    for d in reversed(tuple(order)):
        out[d] = s
        s *= max(int(shape[d]), 1)
    return tuple(out)


def dense(buffer: str, shape: Sequence[int], dtype: str, order: Sequence[int] | None = None, offset: int = 0) -> View:
    """A dense view of a new buffer: contiguous, or laid out in ``order`` (see :func:`strides_in_order`)."""
    if order is None:
        return contiguous(buffer, shape, dtype, offset)
    return View(buffer, offset, tuple(shape), strides_in_order(shape, order), dtype)


def channels_last_order(ndim: int) -> tuple[int, ...]:
    """The dim order of channels-last data ([N, C, *spatial] stored N, *spatial, C: NHWC / NDHWC)."""
    return (0,) + tuple(range(2, ndim)) + (1,)


def is_dense_in(v: View, order: Sequence[int] | None) -> bool:
    """Whether ``v`` is dense in ``order`` (None: contiguous)."""
    if order is None:
        return v.is_contiguous()
    return same_strides(v.shape, v.strides, strides_in_order(v.shape, order))


def is_channels_last(v: View) -> bool:
    """Dense channels-last data of 4 or 5 dims (what a 2-d or 3-d channels-last convolution reads
    and writes) whose channels and spatial extent both exceed 1 (where the two layouts differ)."""
    return 4 <= v.ndim <= 5 and v.shape[1] > 1 and math.prod(v.shape[2:]) > 1 and \
        is_dense_in(v, channels_last_order(v.ndim))


def same_strides(shape: Sequence[int], a: Sequence[int], b: Sequence[int]) -> bool:
    """Strides that address the same elements (size-1 dims do not matter)."""
    if math.prod(shape) == 0:
        return True
    return all(d == 1 or x == y for d, x, y in zip(shape, a, b))


def norm_dim(d: int, ndim: int) -> int:
    n = max(ndim, 1)
    if not -n <= d < n:
        raise ValueError(f"dim {d} out of range for {ndim} dims")
    return d % n


# ------------------------------------------------------------------ layout operators


def reshape(v: View, shape: Sequence[int]) -> View | None:
    """``v.view(shape)`` when strides can express it (PyTorch's computeStride), else None."""
    shape = list(int(d) for d in shape)
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        shape[shape.index(-1)] = v.numel // known if known else 0
    if math.prod(shape) != v.numel:
        raise ValueError(f"cannot view {list(v.shape)} as {shape}")
    if v.numel <= 1:
        return replace(v, shape=tuple(shape), strides=contiguous_strides(shape))
    strides = _compute_stride(v.shape, v.strides, shape)
    return None if strides is None else replace(v, shape=tuple(shape), strides=tuple(strides))


def _compute_stride(oldshape: Sequence[int], oldstride: Sequence[int], newshape: Sequence[int]) -> list[int] | None:
    newstride = [0] * len(newshape)
    view_d = len(newshape) - 1
    chunk_base_stride = oldstride[-1] if oldstride else 1
    tensor_numel = 1
    view_numel = 1
    for tensor_d in range(len(oldshape) - 1, -1, -1):
        tensor_numel *= oldshape[tensor_d]
        if tensor_d == 0 or (oldshape[tensor_d - 1] != 1 and oldstride[tensor_d - 1] != tensor_numel * chunk_base_stride):
            while view_d >= 0 and (view_numel < tensor_numel or newshape[view_d] == 1):
                newstride[view_d] = view_numel * chunk_base_stride
                view_numel *= newshape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base_stride = oldstride[tensor_d - 1]
                tensor_numel = 1
                view_numel = 1
    if view_d != -1:
        return None
    return newstride


def permute(v: View, dims: Sequence[int]) -> View:
    dims = [norm_dim(d, v.ndim) for d in dims]
    if sorted(dims) != list(range(v.ndim)):
        raise ValueError(f"permute {dims} is not a permutation of {v.ndim} dims")
    return replace(v, shape=tuple(v.shape[d] for d in dims), strides=tuple(v.strides[d] for d in dims))


def inverse_permutation(dims: Sequence[int]) -> tuple[int, ...]:
    inv = [0] * len(dims)
    for i, d in enumerate(dims):
        inv[d % len(dims)] = i
    return tuple(inv)


def transpose(v: View, a: int, b: int) -> View:
    dims = list(range(v.ndim))
    a, b = norm_dim(a, v.ndim), norm_dim(b, v.ndim)
    dims[a], dims[b] = dims[b], dims[a]
    return permute(v, dims)


def slice_(v: View, dim: int, start: int | None, end: int | None, step: int = 1) -> View:
    """PyTorch's ``aten.slice.Tensor``: negative and out-of-range bounds are clamped."""
    dim = norm_dim(dim, v.ndim)
    size = v.shape[dim]
    start = 0 if start is None else int(start)
    end = size if end is None or end >= INT64_MAX else int(end)
    if start < 0:
        start += size
    if end < 0:
        end += size
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    length = (end - start + step - 1) // step
    shape = list(v.shape)
    strides = list(v.strides)
    shape[dim] = length
    strides[dim] = v.strides[dim] * step
    return replace(v, offset=v.offset + start * v.strides[dim], shape=tuple(shape), strides=tuple(strides))


def select(v: View, dim: int, index: int) -> View:
    dim = norm_dim(dim, v.ndim)
    index = index + v.shape[dim] if index < 0 else index
    return replace(v, offset=v.offset + index * v.strides[dim],
                   shape=v.shape[:dim] + v.shape[dim + 1:], strides=v.strides[:dim] + v.strides[dim + 1:])


def unsqueeze(v: View, dim: int) -> View:
    dim = dim + v.ndim + 1 if dim < 0 else dim
    stride = v.strides[dim] * v.shape[dim] if dim < v.ndim else 1
    return replace(v, shape=v.shape[:dim] + (1,) + v.shape[dim:], strides=v.strides[:dim] + (stride,) + v.strides[dim:])


def squeeze(v: View, dims: Sequence[int] | None = None) -> View:
    """Drop the given dims (those of size 1 among them), or every size-1 dim."""
    if dims is None:
        keep = [i for i, d in enumerate(v.shape) if d != 1]
    else:
        drop = {norm_dim(d, v.ndim) for d in dims} if v.ndim else set()
        keep = [i for i in range(v.ndim) if not (i in drop and v.shape[i] == 1)]
    return replace(v, shape=tuple(v.shape[i] for i in keep), strides=tuple(v.strides[i] for i in keep))


def expand(v: View, sizes: Sequence[int]) -> View:
    sizes = list(sizes)
    lead = len(sizes) - v.ndim
    if lead < 0:
        raise ValueError(f"expand to {sizes}: fewer dims than {list(v.shape)}")
    shape, strides = [], []
    for i, s in enumerate(sizes):
        if i < lead:
            shape.append(int(s))
            strides.append(0)
            continue
        d, st = v.shape[i - lead], v.strides[i - lead]
        if s == -1 or s == d:
            shape.append(d)
            strides.append(st)
        elif d == 1:
            shape.append(int(s))
            strides.append(0)
        else:
            raise ValueError(f"cannot expand {list(v.shape)} to {sizes}")
    return replace(v, shape=tuple(shape), strides=tuple(strides))


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    n = max((len(s) for s in shapes), default=0)
    out = [1] * n
    for s in shapes:
        for i, d in enumerate(s):
            j = n - len(s) + i
            if d != 1:
                if out[j] not in (1, d):
                    raise ValueError(f"shapes {[list(x) for x in shapes]} do not broadcast")
                out[j] = d
    return tuple(out)


def broadcast_to(v: View, shape: Sequence[int]) -> View:
    """Right-aligned NumPy broadcasting: missing and size-1 dims get stride 0."""
    return expand(v, list(shape))


# ------------------------------------------------------------------ questions kernels ask


def collapse(shape: Sequence[int], strides: Sequence[int]) -> tuple[int, int] | None:
    """(size, stride) of dims merged into one dim with a uniform stride, or None.

    Size-1 dims are ignored; an empty group is (1, 0) — callers substitute their own
    stride. A group of size 0 collapses to (0, 0).
    """
    size = math.prod(shape)
    if size == 0:
        return (0, 0)
    dims = [(d, s) for d, s in zip(shape, strides) if d != 1]
    if not dims:
        return (1, 0)
    for (d0, s0), (d1, s1) in zip(dims, dims[1:]):
        if s0 != s1 * d1:
            return None
    return (size, dims[-1][1])


def coalesce(shape: Sequence[int], *strides: Sequence[int]) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """Drop size-1 dims and merge neighbours contiguous in every stride set (row-major).

    Returns the new shape and one new stride tuple per input stride tuple; this is what the
    elementwise template does at launch, done once at plan time.
    """
    out_shape: list[int] = []
    out_strides: list[list[int]] = [[] for _ in strides]
    for d in range(len(shape)):
        if shape[d] == 1:
            continue
        if out_shape and all(st[-1] == s[d] * shape[d] for st, s in zip(out_strides, strides)):
            out_shape[-1] *= shape[d]
            for st, s in zip(out_strides, strides):
                st[-1] = s[d]
        else:
            out_shape.append(shape[d])
            for st, s in zip(out_strides, strides):
                st.append(s[d])
    return tuple(out_shape), tuple(tuple(s) for s in out_strides)


@dataclass(frozen=True)
class Matrix:
    """How a GEMM operand view [*batch, rows, cols] is handed to cuBLASLt: row-major with
    leading dim ``ld`` (``trans`` False) or stored transposed ([cols, rows] row-major,
    ``trans`` True), one batch stride (0: one matrix for every batch item)."""

    ld: int
    trans: bool
    batch_stride: int


def as_matrix(v: View, allow_trans: bool = True) -> Matrix | None:
    """The Matrix form of a view with ndim >= 2, or None (a copy is needed)."""
    if v.ndim < 2:
        return None
    rows, cols = v.shape[-2], v.shape[-1]
    rs, cs = v.strides[-2], v.strides[-1]
    batch = collapse(v.shape[:-2], v.strides[:-2])
    if batch is None:
        return None
    bsize, bstride = batch
    if bsize > 1 and bstride < 0:
        return None
    if cols == 1 and rows == 1:
        return Matrix(1, False, bstride if bsize > 1 else 0)
    if (cs == 1 or cols == 1) and (rows == 1 or rs >= cols):
        return Matrix(rs if rows > 1 else cols, False, bstride if bsize > 1 else 0)
    if allow_trans and (rs == 1 or rows == 1) and (cols == 1 or cs >= rows):
        return Matrix(cs if cols > 1 else rows, True, bstride if bsize > 1 else 0)
    return None


def rows_cols(v: View, k: int) -> tuple[int, int, int] | None:
    """(rows, cols, ld) of a view read as a row-major matrix whose rows are its last ``k``
    dims flattened (unit stride) and whose leading dims collapse with stride ``ld``."""
    lead, tail = v.shape[: v.ndim - k], v.shape[v.ndim - k:]
    cols_c = collapse(tail, v.strides[v.ndim - k:])
    rows_c = collapse(lead, v.strides[: v.ndim - k])
    if cols_c is None or rows_c is None:
        return None
    cols, cstride = cols_c
    rows, rstride = rows_c
    if cols > 1 and cstride != 1:
        return None
    if rows <= 1:
        rstride = cols
    if rows > 1 and rstride < cols:
        return None
    return rows, cols, rstride


__all__ = [
    "View", "Matrix", "INT64_MAX", "contiguous_strides", "contiguous", "same_strides", "norm_dim",
    "reshape", "permute", "inverse_permutation", "transpose", "slice_", "select", "unsqueeze",
    "squeeze", "expand", "broadcast_shapes", "broadcast_to", "collapse", "coalesce", "as_matrix",
    "rows_cols", "strides_in_order", "dense", "channels_last_order", "is_dense_in", "is_channels_last",
]
