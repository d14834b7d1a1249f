"""The reference on the verification device: its weights, fresh inputs, its outputs.

:class:`ReferenceHarness` is the model built with the Verifier's own seed, every parameter and
buffer the manifest names taken from it (non-persistent buffers included) and handed to both the
reference and the program, fresh inputs per seed drawn on the device, and the reference's outputs
in fp32 eager (TF32 off, the KernelBench setting), in float64 where it fits, and at a precision
policy. Nothing in the program folder (its weights file) flows into the reference.

Random draws inside the reference's forward (manifest ``lifted_random``) are program inputs: the
harness draws them (``frontend.sample_random_inputs``) and the reference is evaluated from its
captured graph with the same draws (``frontend.evaluate_graph``), since the eager model would
draw its own.

State the reference keeps between calls in a plain tensor attribute (manifest ``state``) is a
program input and output too: each draw supplies the attribute's value before the call (for the
first seed drawn, the value the model holds once built; for every other seed, a fresh draw of
the attribute's shape, standard normal for floats, so a program that ignores its state input
cannot pass), the reference's attribute is set to a copy of that value before forward and read
after it, and the value read is the reference's output for the state's program output, judged
like any other. The model's attribute is put back after every call. A reference whose forward
changes an attribute the manifest's ``state`` does not list is refused.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from ... import manifest as mf
from .parameters import calibrate_norms, independent_of_inputs, redraw_parameters, vary_parameters
from .reference import (ProblemError, ReferenceSpec, call_reference, flatten_outputs, fp32_exact, inputs_on,
                        load_module, model_state, program_inputs, split_args, state_attributes)

#: The factor of the third set of inputs of the degeneracy check (``_depend_on_inputs``).
SCALED_UP = 16.0

def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:200] if text else ''}"



class ReferenceHarness:
    """The reference on ``device`` with weights the Verifier drew itself (module docstring).

    The model is built with ``weights_seed`` (``torch.manual_seed`` then ``Model(*get_init_inputs())``),
    its parameters and buffers drawn away from their initial values (:func:`.parameters.vary_parameters`,
    unless ``vary`` is False) and, where its outputs then do not depend on its inputs, its batch
    norms' statistics measured on drawn inputs (:func:`.parameters.calibrate_norms`), else its
    parameters drawn again at the layers' scale (:func:`.parameters.redraw_parameters`);
    ``degenerate`` says why when even that does not help. Every tensor the manifest lists as a
    weight is taken from it by name: parameters, buffers, non-persistent buffers. ``weights``
    (manifest order and dtypes, contiguous, on the device) is what the program's create() gets; the
    reference computes with the same values. Nothing of the program folder (its weights file) flows
    into the reference.

    ``draw(seed)`` gives fresh inputs (drawn on the device, state as the module docstring says);
    ``forward`` the reference's outputs in
    fp32 eager with TF32 off, ``forward64`` in float64 (None when the model cannot be cast or the
    device has no room), ``forward_at(policy)`` with PyTorch allowed that policy's precision (or
    computing with its arithmetic, ``emulated="round"``). Implements ``correctness.ReferenceLike``.
    """

    def __init__(self, spec: ReferenceSpec, manifest: mf.Manifest, device: Any, *, weights_seed: int = 0,
                 manifest_file: str | os.PathLike = mf.MANIFEST_FILE, vary: bool = True):
        import torch

        from .compare import torch_dtype
        from .copies import indexed

        self.spec, self.manifest, self.device = spec, manifest, indexed(device)
        self.input_specs, self.output_specs = manifest.inputs, manifest.outputs
        self.notes: list[str] = []
        self.module = load_module(spec)
        torch.manual_seed(weights_seed)
        init = call_reference(spec, self.module.module.get_init_inputs, "get_init_inputs()")
        try:
            with torch.device(self.device):  # initialised where it runs: a GiB of weights in milliseconds
                model = self.module.Model(*init)
        except Exception as e:  # noqa: BLE001
            raise ProblemError(spec.label, f"Model(*get_init_inputs()) failed: {type(e).__name__}: {e}") from None
        model = model.to(self.device)
        state = model_state(model)
        for w in manifest.weights:
            if w.name not in state:
                raise ProblemError(manifest_file, f"weight {w.name!r} is not a parameter or buffer of the reference "
                                                  f"model (it has {', '.join(list(state)[:6])}"
                                                  f"{' ...' if len(state) > 6 else ''})")
            if tuple(state[w.name].shape) != w.shape:
                raise ProblemError(manifest_file, f"weight {w.name!r} is {list(state[w.name].shape)} in the "
                                                  f"reference; the manifest says {list(w.shape)}")
        self.degenerate = ""
        if vary:
            kept = vary_parameters(model, weights_seed)
            self.notes.append("the reference's parameters and buffers were drawn away from their initial values "
                              "(the same values for the reference and the program)"
                              + (f"; left as they are (integer-valued): {', '.join(kept[:6])}" if kept else ""))
        self.model = model
        from .copies import CopyBudget

        self.budget = CopyBudget(self.device)  # where the copies of the inputs handed to the reference go
        self._model64: Any = None
        self._no64 = ""
        self._graph = None
        self._graph_weights: dict[str, Any] = {}
        lifted = {r.input for r in manifest.lifted_random}
        self._lifted = [t for t in manifest.inputs if t.name in lifted]
        self._plain = program_inputs(manifest)
        self.lifted_indices = tuple(i for i, t in enumerate(manifest.inputs) if t.name in lifted)
        position = {t.name: i for i, t in enumerate(manifest.inputs)}
        #: Where each state entry's value before the call is among the program's inputs.
        self.state_indices = tuple(position[st.input] for st in manifest.state)
        self._state_attrs = state_attributes(model, manifest, manifest_file)
        self._initial_state = [vars(m)[k].detach().to(self.device).clone() for m, k in self._state_attrs]
        self._first_seed: int | None = None
        if self._lifted:
            self._capture()
        if vary:
            self._depend_on_inputs(weights_seed)
        state = model_state(model)
        self.weights = [state[w.name].detach().to(torch_dtype(w.dtype)).contiguous().clone() for w in manifest.weights]

    def _depend_on_inputs(self, seed: int) -> None:
        """Where the outputs for two sets of inputs, and the first scaled up by ``SCALED_UP``, are
        within tolerance of each other (a head initialised to zeros, activations vanished through the
        layers), the remedies of :mod:`.parameters` tried in turn, the mildest first;
        ``degenerate`` says why when the outputs still do not depend on the inputs."""
        import torch

        from ...precision import get as get_policy
        from .compare import errors

        if self._graph is not None:
            return  # the captured graph holds its own copy of the weights
        out_bytes = sum(t.nbytes for t in self.manifest.outputs)
        in_bytes = sum(t.nbytes for t in self.manifest.inputs)
        if not self.budget.on_device(3 * out_bytes + 2 * in_bytes):  # three sets of outputs, the inputs scaled
            self.notes.append("whether the outputs depend on the inputs was not checked before the trials (no room "
                              "for three sets of outputs and scaled inputs); the trials check it")
            return
        tol = get_policy("tf32").tolerance

        def outputs() -> list[list[Any]]:
            # two draws of get_inputs()'s distribution, then the first scaled up: a reference whose outputs
            # are small beside the tolerance at that distribution (a row mean of zero-mean inputs) still
            # moves with its inputs, where a zero head or outputs of order 1e-14 do not
            out, first = [], None
            for k in range(2):
                d = self.draw(seed ^ (0x5EED << k))
                first = first or d
                out.append(self.forward(d))
            out.append(self.forward(first, [x * SCALED_UP if x.is_floating_point() else x for x in first.program]))
            self._first_seed = None  # the trials' first draw keeps the model's initial state
            return out

        def close(a: Any, b: Any, t: float) -> bool:
            return errors(a, b, t).passed

        why = independent_of_inputs(outputs(), tol, close)
        if not why:
            return

        def calibrate() -> int:
            def run() -> None:
                self.forward(self.draw(seed ^ 0xCA1B))
                self._first_seed = None

            return calibrate_norms(self.model, run)

        def redraw() -> int:
            redraw_parameters(self.model, seed)
            calibrate()
            return 1

        # the remedies of parameters.py's docstring, the mildest first, each from the varied parameters
        remedies = (("calibrating the batch norms", "its batch norms' running statistics were measured on drawn "
                     "inputs", calibrate),
                    ("drawing the parameters again", "its parameters were drawn again at the layers' scale (a norm's "
                     "scale around one) and its batch norms' statistics measured on drawn inputs", redraw))
        saved = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        still = why
        for name, what, remedy in remedies:
            self.model.load_state_dict(saved)
            self._model64 = None
            try:
                if not remedy():
                    continue
            except Exception as e:  # noqa: BLE001 - a norm that cannot run in training mode (one value a channel)
                self.notes.append(f"the reference's outputs did not depend on its inputs; {name} failed "
                                  f"({type(e).__name__}: {e})")
                continue
            still = independent_of_inputs(outputs(), tol, close)
            if not still:
                self.notes.append(f"the reference's outputs did not depend on its inputs ({why}): {what}, "
                                  "the same values for the reference and the program")
                break
        if still:
            self.model.load_state_dict(saved)
            self._model64 = None
            self.degenerate = still
            self.notes.append(f"degenerate reference: {still}, even with its batch norms calibrated and its "
                              "parameters drawn again")
        torch.cuda.empty_cache() if self.device.type == "cuda" else None

    def nbytes(self) -> int:
        """Bytes of one set of inputs, outputs and weights (what a float64 copy would double)."""
        return sum(t.nbytes for t in (*self.manifest.inputs, *self.manifest.outputs, *self.manifest.weights))

    def _capture(self) -> None:
        import torch

        from ...frontend import CaptureError, capture

        torch.manual_seed(0)
        args = [a.to(self.device) if isinstance(a, torch.Tensor) else a
                for a in call_reference(self.spec, self.module.module.get_inputs, "get_inputs()")]
        try:
            cap = capture(self.model, args, self.spec.name, supported_ops=None,
                          state="lift" if self.manifest.state else "refuse")
        except CaptureError as e:
            raise ProblemError(self.spec.label, f"the reference draws random numbers in forward and could not be "
                                                f"captured to evaluate it with the harness's draws: {e}") from None
        names = [t.name for t in cap.graph.inputs]
        missing = [t.name for t in self.manifest.inputs if t.name not in names]
        if missing:
            raise ProblemError(mf.MANIFEST_FILE, f"input(s) {', '.join(missing)} are not inputs of the captured "
                                                 f"reference graph ({', '.join(names)})")
        self._graph = cap.graph
        self._graph_weights = dict(cap.weights)
        self.notes.append("the reference draws random numbers in forward: its outputs come from the captured graph "
                          "evaluated on the harness's draws")

    def draw(self, seed: int):
        """Fresh inputs under ``seed``: ``get_inputs()`` drawn on the device, in manifest order and
        dtypes (a Draw), with the draws lifted from forward made by the harness."""
        import torch

        from .compare import torch_dtype
        from .session import Draw

        torch.manual_seed(seed)
        args = inputs_on(self.spec, self.module.module, self.device)
        idx = split_args(self.spec, args, "get_inputs()")
        if len(idx) != len(self._plain):
            raise ProblemError(mf.MANIFEST_FILE, f"lists {len(self._plain)} input(s); get_inputs() gave {len(idx)} "
                                                 "tensor(s)")
        program: dict[str, Any] = {}
        model_args = list(args)
        dtypes = []
        for i, spec in zip(idx, self._plain):
            a = args[i]
            p = a.to(device=self.device, dtype=torch_dtype(spec.dtype)).contiguous()
            if tuple(p.shape) != spec.shape:
                raise ProblemError(mf.MANIFEST_FILE, f"input {spec.name} is {list(spec.shape)}; get_inputs() gave "
                                                     f"{list(p.shape)}")
            program[spec.name] = p
            model_args[i] = None  # filled with whatever inputs the reference is asked about
            dtypes.append(a.dtype)
        del args
        if self._lifted:
            from ...frontend import sample_random_inputs

            drawn = sample_random_inputs(self._graph, seed=seed, device=self.device)
            for spec in self._lifted:
                program[spec.name] = drawn[spec.name].to(torch_dtype(spec.dtype)).contiguous()
        if self._first_seed is None:
            self._first_seed = seed
        for i, initial in zip(self.state_indices, self._initial_state):
            spec = self.manifest.inputs[i]
            value = initial if seed == self._first_seed else _draw_like(spec.shape, initial.dtype, self.device)
            program[spec.name] = value.to(torch_dtype(spec.dtype)).contiguous().clone()
        return Draw(program=[program[t.name] for t in self.manifest.inputs], model_args=model_args, seed=seed,
                    arg_index=tuple(idx), arg_dtypes=tuple(dtypes))

    # -------------------------------------------------------------- outputs

    def model_args(self, draw, inputs=None) -> list[Any]:
        """The reference's forward arguments for program ``inputs`` (default: the draw's), each in the
        dtype the reference drew; copies where the memory budget allows one on the device (a
        reference may write its inputs), else the program's own tensors (through an alias, so an
        in-place metadata change stays the reference's)."""
        return self._model_args(draw, inputs)[0]

    def _model_args(self, draw, inputs=None) -> tuple[list[Any], list[Any]]:
        """``(arguments, the program's tensors handed over uncopied)``."""
        inputs = list(draw.program if inputs is None else inputs)
        given = {s.name for s in self._plain}
        plain = [t for spec, t in zip(self.manifest.inputs, inputs) if spec.name in given]
        args = list(draw.model_args)
        same = [t for want, t in zip(draw.arg_dtypes, plain) if t.dtype == want]
        copy_ok = self.budget.on_device(sum(t.numel() * t.element_size() for t in same))
        shared = []
        for pos, want, t in zip(draw.arg_index, draw.arg_dtypes, plain):
            if t.dtype != want:
                args[pos] = t.to(want)
            elif copy_ok:
                args[pos] = t.clone()
            else:
                args[pos] = t.view(t.shape)
                shared.append(t)
        return args, shared

    def _run_model(self, model, draw, inputs) -> Any:
        """``model`` on the arguments for ``inputs``; where the program's own tensors were handed over
        uncopied, a checksum before and after proves the reference left them as they were."""
        args, shared = self._model_args(draw, inputs)
        before = [_checksum(t) for t in shared]
        out = self._call_with_state(model, args, draw.program if inputs is None else inputs)
        for t, c in zip(shared, before):
            if _checksum(t) != c:
                raise ProblemError(self.spec.label, "the reference's forward writes its inputs in place, and they are "
                                                    "too large for a device copy under the Verifier's memory budget: "
                                                    "set STITCHCUDA_VERIFY_COPY_GIB above "
                                                    f"{t.numel() * t.element_size() / 2**30:.1f} to verify it")
        return out

    def forward(self, draw, inputs=None) -> list[Any]:
        """The reference's outputs for ``inputs`` (default: the draw's), fp32 eager, TF32 off."""
        import torch

        with torch.no_grad(), fp32_exact():
            if self._graph is not None:
                return self._graph_forward(draw, inputs, self._graph_weights, torch.float32)
            out = self._run_model(self.model, draw, inputs)
        return [t.detach() for t in flatten_outputs(out)]

    def forward_at(self, policy: str, draw, inputs=None, *, emulated: str = "") -> list[Any] | None:
        """The reference's outputs with PyTorch allowed ``policy``'s precision (TF32 flags, autocast),
        as a program honestly computing at that policy would get them; None where that means nothing
        here (a CPU device, where neither TF32 nor CUDA autocast applies). ``emulated`` (one of
        ``precision.EMULATIONS``): the policy's arithmetic whichever engine runs it (``Policy.emulated``:
        ``"round"``, TF32-rounded operands; ``"truncate"``, truncated ones), on any device; None for a
        policy it adds nothing to (fp32, 16-bit storage)."""
        import torch

        from ...precision import EMULATIONS, get

        pol = get(policy)
        if emulated and emulated not in EMULATIONS:  # under every policy, not only where it would run
            raise ValueError(f"forward_at(emulated={emulated!r}): one of {', '.join(EMULATIONS)}, or '' for none")
        if (not emulated and self.device.type != "cuda") or (emulated and not pol.tf32):
            return None
        try:
            with torch.no_grad(), (pol.emulated(emulated) if emulated else pol.baseline()):
                if self._graph is not None:
                    return [t.float() for t in self._graph_forward(draw, inputs, self._graph_weights, torch.float32)]
                out = self._run_model(self.model, draw, inputs)
        except torch.OutOfMemoryError:
            raise
        except RuntimeError as e:  # PyTorch's own limit (an op autocast leaves in the wrong dtype): no comparison
            note = f"PyTorch cannot run the reference at {policy} ({_first_line(e)}): not compared at {policy}"
            if note not in self.notes:
                self.notes.append(note)
            return None
        return [t.detach().float() if t.is_floating_point() else t.detach() for t in flatten_outputs(out)]

    def forward64(self, draw, inputs=None) -> list[Any] | None:
        """The reference in float64, or None (with a note) when the model cannot be cast or a float64
        copy of its inputs, outputs and weights does not fit on the device."""
        import torch

        if self._no64:
            return None
        if not _room_for(2 * self.nbytes(), 3, self.device):
            self._no64 = "no float64 reference: a float64 copy of inputs, outputs and weights does not fit on the device"
            self.notes.append(self._no64)
            return None
        try:
            with torch.no_grad():
                if self._graph is not None:
                    w64 = {k: (v.double() if v.is_floating_point() else v) for k, v in self._graph_weights.items()}
                    return self._graph_forward(draw, inputs, w64, torch.float64)
                if self._model64 is None:
                    self._model64 = copy.deepcopy(self.model).double()
                args = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                        for a in self.model_args(draw, inputs)]  # float64 copies: the inputs cannot be written
                out = self._call_with_state(self._model64, args, draw.program if inputs is None else inputs,
                                            torch.float64)
                return [t.detach() for t in flatten_outputs(out)]
        except Exception as e:  # noqa: BLE001 - some ops have no float64 kernel, or no room: fp32 only
            self._no64 = f"no float64 reference ({type(e).__name__}: {str(e)[:120]})"
            self.notes.append(self._no64)
            self._model64 = None
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return None

    def _call_with_state(self, model, args: list[Any], inputs, float_dtype: Any = None) -> Any:
        """``model(*args)`` with each state attribute set to a copy of its program input (cast to
        ``float_dtype`` for a float64 model, else to the dtype the model holds it in) and read after
        the call into the state's output slot; the attributes are put back whatever forward did."""
        if not self.state_indices:
            return model(*args)
        from ...stateful import find_attributes

        attrs = [(m, k) for m, _, k in find_attributes(model, [st.attribute for st in self.manifest.state])] \
            if model is not self.model else self._state_attrs
        saved = [vars(m)[k] for m, k in attrs]
        try:
            for (m, k), i, initial in zip(attrs, self.state_indices, self._initial_state):
                want = float_dtype if float_dtype is not None and initial.is_floating_point() else initial.dtype
                vars(m)[k] = inputs[i].to(dtype=want, copy=True)
            outs = flatten_outputs(model(*args))
            after = [vars(m)[k] for m, k in attrs]
        finally:
            for (m, k), v in zip(attrs, saved):
                vars(m)[k] = v
        return self._with_state(outs, after)

    def _with_state(self, outs: list[Any], after: list[Any]) -> list[Any]:
        """The reference's outputs in manifest order: the state's values after the call in the state
        entries' output slots, forward's own outputs in the others (in order)."""
        slot = {st.output: k for k, st in enumerate(self.manifest.state)}
        if len(outs) != len(self.manifest.outputs) - len(slot):
            return outs + after  # a count the manifest does not have: check_shapes names it
        own = iter(outs)
        return [after[slot[o.name]] if o.name in slot else next(own) for o in self.manifest.outputs]

    def _graph_forward(self, draw, inputs, weights, float_dtype) -> list[Any]:
        from ...frontend import evaluate_graph

        feed = {}
        for spec, t in zip(self.manifest.inputs, draw.program if inputs is None else inputs):
            feed[spec.name] = t.to(float_dtype) if t.is_floating_point() else t
        return [t.detach() for t in evaluate_graph(self._graph, feed, weights)]


def _draw_like(shape: tuple[int, ...], dtype: Any, device: Any) -> Any:
    """A state value for a trial: standard normal for floats, 0..15 for integers, fair coins for
    booleans (drawn from the global generator, seeded by the draw)."""
    import torch

    if dtype.is_floating_point:
        return torch.randn(shape, device=device).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, device=device) < 0.5
    return torch.randint(0, 16, shape, device=device, dtype=dtype)


def _checksum(t: Any) -> tuple[int, int]:
    """Two sums of ``t``'s bits (all elements, even positions): any write the reference makes to its
    inputs changes one (a cheap read; the reference is not an adversary, the program is)."""
    import torch

    from .compare import CHUNK, bits

    b = bits(t).reshape(-1)
    acc = torch.zeros(2, dtype=torch.int64, device=b.device)
    for lo in range(0, b.numel(), CHUNK):
        c = b[lo:lo + CHUNK]
        acc[0] += c.sum(dtype=torch.int64)
        acc[1] += c[0::2].sum(dtype=torch.int64)  # CHUNK is even: the even positions of the whole
    a0, a1 = acc.tolist()
    return a0, a1


def _room_for(nbytes: int, factor: float, device: Any) -> bool:
    """Whether ``factor`` times ``nbytes`` fits in the device's free memory (always on the CPU)."""
    import torch

    if getattr(device, "type", str(device)) != "cuda":
        return True
    free, total = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)  # torch's own cache
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", lambda d: 0.9)(device)
    cap = fraction * total - torch.cuda.memory_allocated(device)  # what torch may still take in this process
    return nbytes * factor <= 0.9 * min(free, cap)


__all__ = ["ReferenceHarness"]
