"""Dynamic dimensions, the planner's part (CPU): a plan over symbols, checked by the plan interpreter.

Each reference is planned over a range of its batch (and sequence) size by :func:`stitchcuda.dynamic.
plan_over`; the symbolic plan is then instantiated at values inside the range — several that no
fit was made from among them — and (1) run by the plan interpreter against the reference model at
that shape in float64, and (2) compared with the plan the planner makes for that shape directly:
every number the same, but for the arena (sized for the bucket's largest shape), the costs, and
strides along dimensions of extent 1 (which no kernel reads), and what is made once at create (a
causal mask's slice and block map, made at the largest shape and read as laid out there). Guards: a shape out of range, two
inputs that disagree on one symbol, a divisibility the plan needs — each a one-line error naming
the input, the dimension and the symbol.
"""

from __future__ import annotations

import copy
from fractions import Fraction

import pytest
import torch

from stitchcuda import dynamic as D
from stitchcuda import pipeline
from stitchcuda import plan as P
from tests.plan_sim import simulate

MLP = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.fc1 = nn.Linear(d, h)
        self.ln = nn.LayerNorm(h)
        self.fc2 = nn.Linear(h, d)

    def forward(self, x):
        y = self.fc2(torch.relu(self.ln(self.fc1(x))))
        return y - y.mean(dim=0, keepdim=True)   # a mean over the dynamic dimension: 1 / batch

batch_size = 8
d = 16
h = 32

def get_inputs():
    return [torch.randn(batch_size, d)]

def get_init_inputs():
    return [d, h]
'''

CONV = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(3, c, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)           # training mode: statistics over the batch too
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(c * 4 * 4, 10)

    def forward(self, x):
        y = self.pool(torch.relu(self.bn(self.conv(x))))
        return self.fc(y.flatten(1))

batch_size = 4
c = 8

def get_inputs():
    return [torch.randn(batch_size, 3, 8, 8)]

def get_init_inputs():
    return [c]
'''

SEQ = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x, bias):
        y = self.proj(x) + bias
        w = torch.softmax(y, dim=1)           # over the sequence
        return (w * y).sum(1) + x.mean(1)

batch_size = 3
seq_len = 10
d = 8

def get_inputs():
    return [torch.randn(batch_size, seq_len, d), torch.randn(batch_size, 1, d)]

def get_init_inputs():
    return [d]
'''


ATTN = '''
import math
import torch
import torch.nn as nn
import torch.nn.functional as F

class Model(nn.Module):
    def __init__(self, d, max_len):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.register_buffer("mask", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool)), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C)
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        return F.softmax(att, dim=-1) @ v

batch_size = 2
seq_len = 16
d = 32
max_len = 64

def get_inputs():
    return [torch.randn(batch_size, seq_len, d)]

def get_init_inputs():
    return [d, max_len]
'''


def _write(tmp_path, name: str, text: str):
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    return path


def _plan_direct(ref, sym: D.SymbolicPlan, values, precision):
    sizes = {b.dim.variable: values[b.dim.name] for b in sym.bindings}
    with D.Sizes(ref.module, sizes):
        problem = pipeline.capture_problem(ref, precision=precision, weights=True, compiling=False)
        return problem, problem.plan().to_dict()


def _same_but_arena_and_costs(got: dict, want: dict) -> list[str]:
    assert D.skeleton_key(got) == D.skeleton_key(want)
    a, b = dict(D._leaves(got)), dict(D._leaves(want))
    return [f"{'/'.join(map(str, k))}: {a[k]} != {b[k]}" for k in b
            if a[k] != b[k] and not D._is_arena_offset(k) and not D._dont_care(b, k)
            and not D._made_at_create(want, k)]


def _check_at(ref, sym, values, precision="fp32"):
    """The symbolic plan at ``values``: as the planner's own, and right in the interpreter."""
    problem, direct = _plan_direct(ref, sym, values, precision)
    got = sym.instantiate(values)
    if all(lo <= values[n] <= hi for n, (lo, hi) in sym.bucket(values).fit_ranges.items()):
        assert _same_but_arena_and_costs(got, direct) == []
    # else: a value a bucket was joined to (batch 1) runs that bucket's plan, checked below alone
    sizes = {b.dim.variable: values[b.dim.name] for b in sym.bindings}
    with D.Sizes(ref.module, sizes):
        model, inputs = ref.instantiate(seed=0)
    plan = P.Plan.from_dict(got)
    outs = simulate(plan, problem.weights, list(inputs))
    model = copy.deepcopy(model).double()
    with torch.no_grad():
        want = model(*[x.double() for x in inputs])
    want = want if isinstance(want, (tuple, list)) else [want]
    for o, w in zip(outs, want):
        assert tuple(o.shape) == tuple(w.shape)
        assert not torch.isnan(o).any(), "output not fully written"
        err = ((o.double() - w).abs() / (1 + w.abs())).max().item()
        assert err < 1e-4, f"{D._fmt(values)}: error {err:.2e}"


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    path = _write(tmp_path_factory.mktemp("dyn"), "mlp", MLP)
    ref, _, _ = pipeline.load_source(path, None)
    return ref, D.plan_over(ref, ["batch=1:24"])


def test_batch_of_an_mlp_is_one_plan_right_at_every_batch(mlp):
    ref, sym = mlp
    assert [p.axis for p in sym.bindings[0].places] == [0] and sym.bindings[0].dim.variable == "batch_size"
    assert len(sym.buckets) <= 2, sym.describe()
    for batch in (1, 2, 5, 7, 13, 19, 24):
        _check_at(ref, sym, {"batch": batch})


def test_a_conv_net_with_batch_statistics_over_a_dynamic_batch(tmp_path):
    ref, _, _ = pipeline.load_source(_write(tmp_path, "conv", CONV), None)
    sym = D.plan_over(ref, {"batch": (2, 9)})
    for batch in (2, 3, 6, 9):
        _check_at(ref, sym, {"batch": batch})


def test_batch_and_sequence_together(tmp_path):
    ref, _, _ = pipeline.load_source(_write(tmp_path, "seq", SEQ), None)
    sym = D.plan_over(ref, ["batch=1:5", "seq=2:20"])
    assert {b.dim.name: [(p.index, p.axis) for p in b.places] for b in sym.bindings} == \
        {"batch": [(0, 0), (1, 0)], "seq": [(0, 1)]}
    for values in ({"batch": 1, "seq": 2}, {"batch": 3, "seq": 11}, {"batch": 4, "seq": 17}, {"batch": 5, "seq": 20}):
        _check_at(ref, sym, values)


def test_causal_attention_over_batch_and_sequence_with_its_mask_made_at_create(tmp_path):
    # the mask's slice and its block map are made once at the largest shape; the runs read them as
    # laid out there at their own extents: one bucket, right at every shape the interpreter tries
    ref, _, _ = pipeline.load_source(_write(tmp_path, "attn", ATTN), None)
    sym = D.plan_over(ref, ["batch=1:4", "seq=4:63"])
    assert len(sym.buckets) == 1 and sym.buckets[0].at_create, sym.describe()
    for values in ({"batch": 1, "seq": 4}, {"batch": 3, "seq": 17}, {"batch": 2, "seq": 40}, {"batch": 4, "seq": 63}):
        _check_at(ref, sym, values)


PADDED = '''
import math
import torch
import torch.nn as nn
import torch.nn.functional as F

class Model(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x, keep):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C)
        # a padding mask as an encoder's: (B, T) -> (B, T, T), its strides T * T and T
        pad = keep[:, None, :].expand(B, T, T)
        att = att.masked_fill(pad == 0, float("-inf"))
        return F.softmax(att, dim=-1) @ v

batch_size = 2
seq_len = 16
d = 32

def get_inputs():
    keep = (torch.arange(seq_len)[None, :] < torch.randint(1, seq_len + 1, (batch_size, 1))).long()
    return [torch.randn(batch_size, seq_len, d), keep]

def get_init_inputs():
    return [d]
'''


def test_a_number_that_is_a_square_of_a_symbol_is_fitted(tmp_path):
    # an (B, T, T) mask's strides are T * T: no multilinear polynomial, a square of T on a full grid
    # of the box; the plan right at shapes it was not fitted at
    assert str(D.fit(["s"], [({"s": v}, v * v + 2) for v in (4, 9, 20, 33, 40)])) == "2 + s * s"
    assert D.fit(["s"], [({"s": v}, v * v) for v in (4, 40, 9)]) is None  # too few samples to check a square
    assert str(D.fit(["b", "s"], [({"b": b, "s": v}, b * v + 1) for b in (1, 3) for v in (2, 7)])) == "1 + b * s"
    ref, _, _ = pipeline.load_source(_write(tmp_path, "padded", PADDED), None)
    sym = D.plan_over(ref, ["batch=1:4", "seq=4:40"])
    assert len(sym.buckets) == 1, sym.describe()
    assert any("seq * seq" in str(poly) for poly in sym.buckets[0].fitted.values()), sym.describe()
    for values in ({"batch": 1, "seq": 4}, {"batch": 3, "seq": 17}, {"batch": 2, "seq": 31}, {"batch": 4, "seq": 40}):
        _check_at(ref, sym, values)


def test_guards_name_the_input_the_dimension_and_the_symbol(mlp):
    _, sym = mlp
    assert sym.values_of([(7, 16)]) == {"batch": 7}
    with pytest.raises(D.DynamicShapeError) as e:
        sym.values_of([(25, 16)])
    msg = str(e.value)
    assert "\n" not in msg and "x dimension 0 (batch) is 25" in msg and "1..24" in msg
    with pytest.raises(D.DynamicShapeError):
        sym.instantiate({"batch": 0})


def test_two_inputs_that_disagree_on_a_symbol(tmp_path):
    ref, _, _ = pipeline.load_source(_write(tmp_path, "seq", SEQ), None)
    bindings = D.bind(ref, D.parse_dynamic(["batch=1:5"]), ["x", "bias"])
    sym = D.SymbolicPlan(bindings, [D.Bucket({"batch": (1, 5)}, {})])
    with pytest.raises(D.DynamicShapeError, match=r"batch: x dimension 0 is 3 but bias dimension 0 is 4"):
        sym.values_of([(3, 10, 8), (4, 1, 8)])


def test_a_divisibility_the_plan_needs_is_a_guard():
    # a number that is seq / 4 at every sample is fitted with a fractional coefficient: the plan
    # serves multiples of 4 only, and says so
    samples = [({"seq": s}, s // 4) for s in (4, 8, 12, 20)]
    poly = D.fit(["seq"], samples)
    assert poly is not None and poly.divisors() == {"seq": 4}
    bindings = (D.Binding(D.Dim("seq", 4, 20, "seq_len"), (D.Place(0, "tokens", 1),)),)
    sym = D.SymbolicPlan(bindings, [D.Bucket({"seq": (4, 20)}, {}, {}, {"seq": 4})])
    assert sym.values_of([(2, 12)]) == {"seq": 12}
    with pytest.raises(D.DynamicShapeError, match=r"^tokens dimension 1 \(seq\) is 13: this program needs seq a "
                                                   r"multiple of 4 there$"):
        sym.values_of([(2, 13)])


def test_fits_are_exact_or_refused():
    p = D.fit(["b", "s"], [({"b": b, "s": s}, 3 * b * s + 7 * b + 2) for b in (1, 2, 5) for s in (3, 4, 9)])
    assert p is not None and p({"b": 11, "s": 13}) == 3 * 11 * 13 + 7 * 11 + 2
    assert ((("b", "s"), Fraction(3))) in p.terms
    # a step (a count of 32-wide blocks) is no polynomial over a range that crosses a step
    assert D.fit(["s"], [({"s": s}, -(-s // 32)) for s in (16, 40, 64, 100)]) is None
    r = D.fit(["n"], [({"n": n}, 1.0 / (49 * n)) for n in (1, 3, 8)])
    assert r is not None and r.inverse and r({"n": 6}) == pytest.approx(1 / 294)


def test_plan_decisions_that_depend_on_the_shape_are_buckets():
    # a structure that changes at 17: two buckets, split exactly there by bisection
    def plan_at(v):
        n = v["n"]
        kind = "small" if n <= 16 else "large"
        return {"tasks": [{"name": "t", "strategy": kind, "params": {"shape": [n, 4], "strides": [4, 1]}}],
                "buffers": [], "arena_bytes": 64 * n}
    bindings = (D.Binding(D.Dim("n", 1, 40, "n"), (D.Place(0, "x", 0),)),)
    sym = D.generalise(bindings, plan_at)
    assert [b.ranges["n"] for b in sym.buckets] == [(1, 16), (17, 40)]
    assert sym.instantiate({"n": 23})["tasks"][0]["params"]["shape"] == [23, 4]
    assert sym.instantiate({"n": 23})["arena_bytes"] == 64 * 40   # sized for the bucket's largest


def test_specs_that_do_not_parse_or_name_nothing(mlp):
    ref, _ = mlp
    for bad, pattern in [("batch", "NAME=MIN:MAX"), ("batch=4:2", "1 <= MIN <= MAX"), ("batch=0:3", "1 <= MIN")]:
        with pytest.raises(D.DynamicSpecError, match=pattern):
            D.parse_dynamic([bad])
    with pytest.raises(D.DynamicSpecError, match="no module-level integer 'tokens'"):
        D.bind(ref, D.parse_dynamic(["tokens=1:8"]))
    with pytest.raises(D.DynamicSpecError, match="no input dimension follows h"):
        D.bind(ref, D.parse_dynamic(["h=8:16"]))


def test_a_symbol_that_changes_the_parameters_is_refused(mlp):
    ref, _ = mlp
    with pytest.raises(D.GeneraliseError, match=r"weight fc1.weight's shape changes with d"):
        D.plan_over(ref, ["d=8:16"])


# ---------------------------------------------------------------------- programs (CPU: nvcc)


def test_a_dynamic_program_compiles_with_its_guards_and_manifest(tmp_path):
    from stitchcuda import manifest as mf
    from stitchcuda.toolchain import find_nvcc

    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    o = D.build_dynamic(_write(tmp_path, "conv", CONV), ["batch=1:16"], precision="tf32", out=tmp_path / "prog",
                        tune_shapes=["batch=8"],
                        arch="sm_90")
    assert o.ok, o.build.message if o.build else ""
    m = mf.Manifest.load(o.directory)  # read back as a program folder opens it
    assert m.dynamic is not None and m.dynamic.outputs == (("batch", 10),) and m.inputs[0].shape == (16, 3, 8, 8)
    d = m.dynamic.dims[0]
    assert (d.name, d.min, d.max, d.places) == ("batch", 1, 16, (("x", 0),))
    src = (o.directory / mf.PROGRAM_SOURCE).read_text()
    # the symbol is read from the input's shape and checked before anything runs; every extent that
    # follows the batch is an expression of it; each shape its own CUDA graph
    assert "st_dyn[0] = in[0].shape[0];" in src
    assert "input 0 'x' dimension 0 (batch) is %lld: this program serves batch 1..16" in src
    assert "a.batch = st_dyn[0];" in src and "static_cast<intptr_t>(io.dyn[k])" in src
    # a graph kept for each of many shapes, so that sizes served in turn replay (a static program: 4)
    assert f"constexpr int kGraphSlots = {D.DYNAMIC_GRAPH_SLOTS};" in src and D.DYNAMIC_GRAPH_SLOTS >= 32
    assert m.dynamic.arena_bytes == o.plan.arena_bytes > 0  # sized for the largest shape
    assert m.dynamic.values(["x"], [(7, 3, 8, 8)]) == {"batch": 7}
    assert m.dynamic.shape(m.dynamic.outputs[0], {"batch": 7}) == (7, 10)
    with pytest.raises(mf.ShapeError, match=r"^input 'x' dimension 0 \(batch\) is 17: this program serves batch "
                                            r"1\.\.16$"):
        m.dynamic.values(["x"], [(17, 3, 8, 8)])
    assert "batch 1..16" in (o.directory / "plan.dynamic.txt").read_text()
    # no state outlives a call: the symbols are the run's (Io), handed to each task that needs them
    from stitchcuda.verifier import check_program

    result = check_program(o.directory, require_weights=True)
    assert not result.rejected, [str(f) for f in result.rejections]
    assert "thread_local" not in src and "task::convolution(io.dyn, " in src
    # judged at one shape of its range: the manifest at that shape, the reference's size with it
    from stitchcuda.verifier.run.reference import resolve_reference
    from stitchcuda.verifier.run.shapes import at_shape

    at3 = m.at({"batch": 3})
    assert at3.inputs[0].shape == (3, 3, 8, 8) and at3.outputs[0].shape == (3, 10)
    prog3 = at_shape(mf.load_program_dir(o.directory), {"batch": 3})
    # as the child reads it (the range ending at 3: sizes named to tune at are the whole range's)
    assert mf.Manifest.from_dict(prog3.manifest.to_dict()).inputs[0].shape == (3, 3, 8, 8)
    assert m.dynamic.dims[0].tuned == (8,)
    assert resolve_reference(None, o.directory, prog3.manifest).sizes == (("batch_size", 3),)
    with pytest.raises(mf.ShapeError, match=r"\(batch\) is 17: this program serves batch 1\.\.16"):
        m.at({"batch": 17})


def test_dynamic_refuses_what_it_cannot_serve(tmp_path):
    from stitchcuda.pipeline import BuildInputError

    path = _write(tmp_path, "conv", CONV)
    with pytest.raises(BuildInputError, match="unknown precision"):
        D.build_dynamic(path, ["batch=1:4"], precision="fp64", out=tmp_path / "p")
    with pytest.raises(D.DynamicSpecError, match="no module-level integer 'tokens'"):
        D.build_dynamic(path, ["tokens=1:4"], out=tmp_path / "p", compile=False)


def test_the_wheels_loader_reads_the_same_dynamic_block():
    # the loader a program wheel ships (no stitchcuda inside) and the manifest share one reading of it
    from stitchcuda import loader
    from stitchcuda import manifest as mf

    dims = [{"name": "batch", "min": 1, "max": 8, "places": [["x", 0], ["mask", 0]]},
            {"name": "seq", "min": 4, "max": 64, "places": [["x", 1]], "multiple_of": 4}]
    assert loader.dynamic_sizes(dims, ["x", "mask"], [(3, 12, 32), (3, 12)]) == {"batch": 3, "seq": 12}
    assert loader.dim_value("4*batch*seq + 2", {"batch": 3, "seq": 12}) == 146
    assert loader.dim_value("seq/4", {"seq": 12}) == 3
    for shapes, pattern in [([(9, 12, 32), (9, 12)], r"input 'x' dimension 0 \(batch\) is 9: this program serves "
                                                      r"batch 1\.\.8"),
                            ([(3, 12, 32), (2, 12)], r"batch: input 'x' dimension 0 is 3 but input 'mask' "
                                                      r"dimension 0 is 2"),
                            ([(3, 13, 32), (3, 13)], r"\(seq\) is 13: this program needs seq a multiple of 4")]:
        with pytest.raises(ValueError, match=pattern):
            loader.dynamic_sizes(dims, ["x", "mask"], shapes)
    with pytest.raises(mf.ShapeError, match="not a whole number"):
        mf.eval_dim("seq/4", {"seq": 13})
    with pytest.raises(ValueError, match="not a dimension expression"):
        loader.dim_value("__import__('os')", {})


def test_the_verifier_draws_the_shapes_of_a_range_from_its_seed():
    # smallest first, largest last, distinct draws between on each dimension's multiple, the same for
    # one seed (so a report's seed repeats its shapes); a static program has no range to draw from
    import dataclasses

    from stitchcuda import manifest as mf
    from stitchcuda.verifier.run.shapes import range_shapes

    dims = (mf.DynamicDim("batch", 1, 8, (("x", 0),)), mf.DynamicDim("seq", 4, 64, (("x", 1),), multiple_of=4))
    m = mf.Manifest("m", "fp32", "sm_90", "0" * 64, mf.ReferenceSource(path="reference.py"), (), (),
                    dynamic=mf.Dynamic(dims, (("batch", "seq", 32),), (("batch", 32),)))
    shapes = range_shapes(m, 5, 3)
    assert shapes[0] == (("batch", 1), ("seq", 4)) and shapes[-1] == (("batch", 8), ("seq", 64))
    assert len(shapes) == 5 == len(set(shapes))
    assert all(1 <= b <= 8 and 4 <= s <= 64 and s % 4 == 0 for (_, b), (_, s) in shapes)
    assert range_shapes(m, 5, 3) == shapes != range_shapes(m, 6, 3)
    assert range_shapes(m, 5, 0) == [shapes[0], shapes[-1]]
    narrow = dataclasses.replace(m, dynamic=mf.Dynamic((dataclasses.replace(dims[0], max=2),), (("batch", 32),),
                                                      (("batch", 32),)))
    assert range_shapes(narrow, 5, 3) == [(("batch", 1),), (("batch", 2),)]
    assert range_shapes(dataclasses.replace(m, dynamic=None), 5, 3) == []


def test_tune_shapes_are_named_in_the_manifest_and_judged():
    # --tune-shapes: sizes within each range; the manifest keeps them (read back, refused outside the
    # range); the Verifier's shapes include every combination, the other dimensions at their largest
    import dataclasses

    from stitchcuda import manifest as mf
    from stitchcuda.verifier.run.shapes import range_shapes

    dims = D.parse_dynamic(["batch=1:32", "seq=16:256"])
    assert D.parse_tune_shapes(["batch=8,1", "batch=32"], dims) == {"batch": (1, 8, 32)}
    for spec, msg in [(["batch=0,8"], r"0 outside 1\.\.32"), (["beam=2"], "not a dynamic dimension"),
                      (["batch=1;8"], "write NAME=SIZE,SIZE")]:
        with pytest.raises(D.DynamicSpecError, match=msg):
            D.parse_tune_shapes(spec, dims)
    batch = mf.DynamicDim("batch", 1, 32, (("x", 0),), tuned=(1, 8))
    seq = mf.DynamicDim("seq", 16, 256, (("x", 1),))
    dyn = mf.Dynamic((batch, seq), (("batch", "seq", 8),), (("batch", 8),))
    assert dyn.tuned_shapes() == [(("batch", 1), ("seq", 256)), (("batch", 8), ("seq", 256))]
    m = mf.Manifest("m", "fp32", "sm_90", "0" * 64, mf.ReferenceSource(path="reference.py"),
                    (mf.TensorSpec("x", (32, 256, 8), "float32"),), (mf.TensorSpec("y", (32, 8), "float32"),),
                    dynamic=dyn)
    back = mf.Manifest.from_dict(m.to_dict())
    assert back.dynamic.dims[0].tuned == (1, 8) and back.dynamic.dims[1].tuned == ()
    bad = m.to_dict()
    bad["dynamic"]["dims"][0]["tuned"] = [1, 64]
    with pytest.raises(mf.ManifestError, match=r"tuned.*within 1\.\.32"):
        mf.Manifest.from_dict(bad)
    shapes = range_shapes(m, 3, 1)
    assert shapes[0] == (("batch", 1), ("seq", 16)) and shapes[-1] == (("batch", 32), ("seq", 256))
    assert set(dyn.tuned_shapes()) <= set(shapes) and len(shapes) == 5
    untuned = dataclasses.replace(m, dynamic=dataclasses.replace(dyn, dims=(dataclasses.replace(batch, tuned=()), seq)))
    assert len(range_shapes(untuned, 3, 1)) == 3


def test_a_wheel_of_a_dynamic_program_needs_both_ends_of_its_range_judged(tmp_path):
    # a passed report at the largest shape alone (verify --at) does not prove the range the wheel
    # serves; one that judged the smallest and the largest does; a static program's needs no shapes
    import dataclasses
    import json

    from stitchcuda import manifest as mf
    from stitchcuda.ship.wheel import WheelError, check_verified
    from stitchcuda.verifier import Passed, VerificationReport, VerificationResult

    dims = (mf.DynamicDim("batch", 1, 8, (("x", 0),)), mf.DynamicDim("seq", 4, 64, (("x", 1),)))
    m = mf.Manifest("m", "fp32", "sm_90", "0" * 64, mf.ReferenceSource(path="reference.py"),
                    (mf.TensorSpec("x", (8, 64), "float32"),), (mf.TensorSpec("y", (8, 64), "float32"),),
                    dynamic=mf.Dynamic(dims, (("batch", "seq"),), (("batch", "seq"),)))

    def folder(shapes, manifest=m):
        (tmp_path / "manifest.json").write_text(json.dumps(manifest.to_dict()))
        report = VerificationReport("m", "fp32", "sm_90", VerificationResult(Passed(5, 1e-6, 1e-4)), shapes=shapes)
        (tmp_path / "report.json").write_text(json.dumps(report.to_dict()))
        return tmp_path

    with pytest.raises(WheelError, match=r"verified at batch=8, seq=64 only, not across its range"):
        check_verified(folder(("batch=8, seq=64",)))
    ok, said = check_verified(folder(("batch=1, seq=4", "batch=3, seq=20", "batch=8, seq=64")))
    assert ok and said.endswith("at batch=1, seq=4; batch=3, seq=20; batch=8, seq=64"), said
    assert check_verified(folder((), dataclasses.replace(m, dynamic=None)))[0]
