"""Entries for the operators that are not elementwise: layout views, GEMMs, row reductions,
batch / group / instance norm, arg reductions, pooling, scans, gathers, ``arange``, convolutions,
recurrent layers, attention and concatenation. Their lowering lives in the planner pass of their kind
(:mod:`stitchcuda.plan`); the registry says which pass, their schema's tensor arguments, and
their cost-model FLOPs per element (of the input for reductions and norms)."""

from __future__ import annotations

from .registry import A, AtenOp, add_aten


def _add(kind: str, names, args=("self",), flops: int = 1, chain: bool = False) -> None:
    for n in names:
        add_aten(AtenOp(A + n, kind, tuple(args), flops, None, chain))


_add("view", ("view.default", "_unsafe_view.default", "reshape.default", "unsqueeze.default", "squeeze.dims",
              "squeeze.dim", "squeeze.default", "permute.default", "transpose.int", "t.default", "slice.Tensor",
              "select.int", "split_with_sizes.default", "split.Tensor", "expand.default", "clone.default",
              "alias.default", "detach.default", "lift_fresh_copy.default", "contiguous.default"), flops=0)
_add("gemm", ("linear.default",), ("input", "weight", "bias"), 2)
_add("gemm", ("matmul.default",), ("self", "other"), 2)
_add("gemm", ("mm.default", "bmm.default"), ("self", "mat2"), 2)
_add("gemm", ("addmm.default",), ("self", "mat1", "mat2"), 2)
_add("row", ("_softmax.default", "_log_softmax.default"), flops=5)
_add("row", ("logsumexp.default", "var.correction"), flops=4)
_add("row", ("native_layer_norm.default",), ("input", "weight", "bias"), 8)
_add("row", ("sum.dim_IntList", "sum.default", "mean.dim", "mean.default", "amax.default", "amin.default"))
_add("row", ("max.default", "min.default", "any.default", "any.dim", "any.dims", "var.dim"))
_add("row", ("linalg_vector_norm.default",), flops=2)
_add("batch_norm", ("_native_batch_norm_legit_functional.default", "_native_batch_norm_legit_no_training.default"),
     ("input", "weight", "bias", "running_mean", "running_var"), 8)
_add("batch_norm", ("_native_batch_norm_legit.no_stats",), ("input", "weight", "bias"), 8)
_add("batch_norm", ("_native_batch_norm_legit.default",), ("input", "weight", "bias", "running_mean", "running_var"), 8)
_add("scatter", ("slice_scatter.default", "select_scatter.default"), ("self", "src"), 0)
_add("group_norm", ("native_group_norm.default",), ("input", "weight", "bias"), 8)
_add("arg", ("max.dim", "min.dim", "argmax.default", "argmin.default"), flops=1)
_add("pool", ("max_pool1d.default", "max_pool2d.default", "max_pool2d_with_indices.default",
              "max_pool3d_with_indices.default", "avg_pool1d.default", "avg_pool2d.default", "avg_pool3d.default",
              "_adaptive_avg_pool2d.default", "_adaptive_avg_pool3d.default", "adaptive_max_pool1d.default",
              "adaptive_max_pool2d.default", "adaptive_max_pool3d.default"))
_add("scan", ("cumsum.default", "cumprod.default", "logcumsumexp.default", "cummax.default", "cummin.default"),
     flops=2)
_add("gather", ("gather.default",), ("self", "index"), 0)
_add("gather", ("index_select.default",), ("self", "index"), 0)
_add("gather", ("embedding.default",), ("weight", "indices"), 0)
_add("gather", ("index.Tensor", "flip.default", "constant_pad_nd.default", "repeat.default",
                "upsample_nearest1d.vec", "upsample_nearest2d.vec", "upsample_nearest3d.vec",
                "upsample_nearest2d.default"), flops=0)
# Linear interpolations: the taps blended in fp32 (a multiply-add a tap, per output element).
_add("gather", ("upsample_linear1d.vec", "upsample_linear1d.default", "upsample_bilinear2d.vec",
                "upsample_trilinear3d.vec", "upsample_trilinear3d.default"), flops=8)
_add("iota", ("arange.start_step", "arange.start", "arange.default"), (), 1)
_add("view", ("unfold.default", "diagonal.default"), flops=0)
_add("conv", ("convolution.default",), ("input", "weight", "bias"), 2)
_add("attention", ("scaled_dot_product_attention.default",), ("query", "key", "value", "attn_mask"), 4)
_add("cat", ("cat.default",), flops=0)
# One node per recurrent module (stitchcuda.recurrent): every input, state and weight it reads is
# positional in Node.inputs; the planner reads them with stitchcuda.recurrent.recurrence.
_add("recurrent", ("lstm.input", "gru.input", "rnn_tanh.input", "rnn_relu.input"), ("input",), 2)

#: Row-major reshapes: the same elements in the same order, another shape.
RESHAPES = frozenset(A + s for s in ("view.default", "_unsafe_view.default", "reshape.default"))

#: Layout ops that leave a tensor's value and shape as they are.
TRANSPARENT = frozenset(A + s for s in ("clone.default", "alias.default", "detach.default", "lift_fresh_copy.default",
                                        "contiguous.default"))

__all__ = ["RESHAPES", "TRANSPARENT"]
