"""Static anti-hacking rules, the program directory / manifest format, and the adversarial set."""

from __future__ import annotations

import json
import re
import struct
import sys
from pathlib import Path

import pytest

from stitchcuda import manifest as mf
from stitchcuda import weights_file as wf
from stitchcuda.verifier import RULES, check_manifest, check_program, check_source
from tests import ahead

REPO = Path(__file__).resolve().parents[1]
ADVERSARIAL = Path(__file__).resolve().parent / "adversarial"

#: Program folder -> rule ids the static checker must reject it with.
STATIC_REJECT = {
    "calls_torch": {"torch-include", "torch-symbol"},
    "pointer_cache": {"pointer-keyed-cache", "host-state-static-local"},
    "side_stream": {"own-stream", "foreign-stream"},
    "constant_table": {"hardcoded-output-table", "const-copy-to-output"},
    "constant_memset": {"output-only-memset"},
    "stale_state": {"host-state-global"},
    "missing_provenance": {"provenance-coverage"},
    "conv_default_stream": {"foreign-stream"},
}
NOT_COMPILED = {"calls_torch"}  # needs libtorch headers


from .adversarial.catalogue import CATALOGUE  # noqa: E402
#: Everything else: the static rules must not refuse it (the build, its imports or the run do).
NOT_STATIC = sorted(e.name for e in CATALOGUE if e.name not in STATIC_REJECT)


def _programs() -> list[str]:
    return sorted(p.name for p in ADVERSARIAL.iterdir() if (p / "program.cu").is_file())


def test_every_adversarial_program_is_classified():
    assert set(_programs()) == {e.name for e in CATALOGUE}
    assert len([e for e in CATALOGUE if e.cls != "control"]) >= 25
    for cls in ("1", "2", "3", "4", "5", "6") + tuple(f"25.{k}" for k in range(1, 13)):
        assert any(e.cls == cls for e in CATALOGUE), cls
    for e in CATALOGUE:
        if e.name in STATIC_REJECT:
            assert e.reason in STATIC_REJECT[e.name], e
        src = (ADVERSARIAL / e.name / "program.cu").read_text()
        assert "Expected verdict" in src and (e.reason or "").split("-")[0] in src, e.name


@pytest.mark.parametrize("name", sorted(STATIC_REJECT))
def test_static_cheats_are_rejected_with_their_rule(name):
    result = check_program(ADVERSARIAL / name)
    assert result.rejected, f"{name} should be rejected"
    missing = STATIC_REJECT[name] - result.rule_ids("reject")
    assert not missing, f"{name}: expected rules {sorted(missing)}; got {[str(f) for f in result.findings]}"
    for f in result.rejections:
        assert f.file in ("program.cu", "manifest.json")
        assert f.line > 0, str(f)
        assert f.excerpt, str(f)


@pytest.mark.parametrize("name", NOT_STATIC)
def test_other_programs_pass_the_static_rules(name):
    """Whatever refuses them, it is not a spelling in the source: the static rules let them through."""
    result = check_program(ADVERSARIAL / name)
    assert not result.rejected, [str(f) for f in result.rejections]


@pytest.mark.parametrize("name", sorted(e.name for e in CATALOGUE if e.cls == "control"
                                        and e.name != "graph_replay_honest"))
def test_honest_controls_have_no_findings(name):
    result = check_program(ADVERSARIAL / name)
    assert result.findings == (), [str(f) for f in result.findings]


def test_runtime_example_has_no_findings():
    src = (REPO / "runtime" / "examples" / "example_mlp.cu").read_text()
    assert check_source(src) == []


def test_readme_names_every_program_and_reason():
    readme = (ADVERSARIAL / "README.md").read_text()
    for e in CATALOGUE:
        assert f"`{e.name}/`" in readme
        if e.reason:
            assert f"`{e.reason}`" in readme


def ahead_commands(out_dir: Path) -> dict[str, list[str]]:
    """nvcc for each adversarial program (run in the background: tests/ahead.py)."""
    nvcc = ahead.nvcc()
    if nvcc is None:
        return {}
    include = REPO / "runtime" / "include"
    return {name: [nvcc, "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC", f"-I{include}", "-c",
                   str(ADVERSARIAL / name / "program.cu"), "-o", str(out_dir / f"{name}.o")]
            for name in _programs() if name not in NOT_COMPILED}


def test_adversarial_programs_compile(nvcc, tmp_path):
    results = ahead.results(sys.modules[__name__], tmp_path)
    assert set(results) == set(_programs()) - NOT_COMPILED
    failed = {n: r.output for n, r in results.items() if r.returncode != 0}
    assert not failed, failed
    warned = {n: r.output for n, r in results.items() if re.search(r"program\.cu\(\d+\): warning", r.output)}
    assert not warned, warned


# ------------------------------------------------------------------ rules on snippets

ABI = """
extern "C" {
ST_API int st_program_abi_version(void) { return 1; }
ST_API const char* st_program_manifest(void) { return "{}"; }
ST_API st_status st_program_create(const st_tensor* w, int32_t n, int32_t device, st_program** out) { return ST_OK; }
ST_API st_status st_program_run(st_program* p, const st_tensor* in, int32_t n_in, const st_tensor* out,
                                int32_t n_out, void* stream) {
  RUN_BODY
  return ST_OK;
}
ST_API void st_program_destroy(st_program* p) {}
}
"""


def rules_of(src: str, severity: str | None = None, **kw) -> set[str]:
    return {f.rule for f in check_source(src, **kw) if severity is None or f.severity == severity}


def program(prelude: str = "", run: str = "") -> str:
    return prelude + ABI.replace("RUN_BODY", run)


# (name, source, rule that must fire)
POSITIVES = [
    ("torch include", '#include <torch/extension.h>\n', "torch-include"),
    ("quoted ATen include", '#include "ATen/cuda/CUDAContext.h"\n', "torch-include"),
    ("Python.h", '#include <Python.h>\n', "torch-include"),
    ("pybind11", '#include <pybind11/pybind11.h>\n', "torch-include"),
    ("header through a macro", '#define HDR <torch/extension.h>\n#include HDR\n', "torch-include"),
    ("at:: call", "void f(float* x) { auto t = at::zeros({4}); }\n", "torch-symbol"),
    ("torch:: call", "void f() { torch::Tensor t; }\n", "torch-symbol"),
    ("c10 macro", "void f() { C10_CUDA_CHECK(cudaGetLastError()); }\n", "torch-symbol"),
    ("python C API", "void f() { PyGILState_Ensure(); }\n", "torch-symbol"),
    ("dlopen", 'void f() { void* h = dlopen("libtorch_cuda.so", 2); }\n', "dynamic-loading"),
    ("system", 'void f() { system("python ref.py"); }\n', "subprocess"),
    ("fopen", 'void f() { auto* fp = fopen("y.bin", "rb"); }\n', "file-io"),
    ("ifstream", 'void f() { std::ifstream in("y.bin"); }\n', "file-io"),
    ("file-scope pointer", "static float* g_out = nullptr;\n", "host-state-global"),
    ("namespace counter", "namespace { int calls = 0; }\n", "host-state-global"),
    ("pointer to const is a mutable pointer", "static const float* g_prev = nullptr;\n", "host-state-global"),
    ("thread_local", "thread_local int t_calls;\n", "host-state-global"),
    ("static member", "struct st_program { static float* last; };\n", "host-state-global"),
    ("managed", "__managed__ float g_m[4];\n", "host-state-global"),
    ("object of anonymous struct", "struct { void* y; } g_cache;\n", "host-state-global"),
    ("static local pointer", "void f() { static void* prev = nullptr; }\n", "host-state-static-local"),
    ("static local in nested block", "void f() { for (;;) { static int k; } }\n", "host-state-static-local"),
    ("map keyed by pointer", "struct S { std::map<const float*, int> m; };\n", "pointer-keyed-cache"),
    ("unordered_map keyed by uintptr_t", "void f() { std::unordered_map<uintptr_t, void*> c; }\n",
     "pointer-keyed-cache"),
    ("device global", "__device__ int g_ticket;\n", "device-global-state"),
    ("constant global", "__constant__ float c_w[64];\n", "device-global-state"),
    ("stream create", "void f() { cudaStream_t s; cudaStreamCreate(&s); }\n", "own-stream"),
    ("stream create with flags", "void f(cudaStream_t* s) { cudaStreamCreateWithFlags(s, 1); }\n", "own-stream"),
    ("std::thread", "void f() { std::thread t([] {}); t.join(); }\n", "host-thread"),
    ("pthread", "void f() { pthread_create(0, 0, 0, 0); }\n", "host-thread"),
    ("omp", "void f() {\n#pragma omp parallel for\n  for (int i = 0; i < 4; ++i) {}\n}\n", "host-thread"),
    ("host func", "void f(cudaStream_t s) { cudaLaunchHostFunc(s, 0, 0); }\n", "host-callback"),
    ("event", "void f() { cudaEvent_t e; cudaEventCreate(&e); }\n", "own-event"),
    ("per-thread stream", "__global__ void k(); void f() { k<<<1, 1, 0, cudaStreamPerThread>>>(); }\n",
     "foreign-stream"),
    ("launch without stream in run", program("__global__ void k(void*);\n", "k<<<1, 32>>>(out[0].data);"),
     "foreign-stream"),
    ("launch on stream 0 in run", program("__global__ void k(void*);\n", "k<<<1, 32, 0, 0>>>(out[0].data);"),
     "foreign-stream"),
    ("gemm on nullptr in run", program("", "st_gemm_args g{}; g.out = out[0].data; st_gemm(&g, nullptr);"),
     "foreign-stream"),
    ("memcpy on another stream in run",
     program("", "cudaMemcpyAsync(out[0].data, in[0].data, 4, cudaMemcpyDeviceToDevice, p->side);"),
     "foreign-stream"),
    ("helper launches on default stream", "__global__ void k(float*); void h(float* x) { k<<<1, 1>>>(x); }\n",
     "default-stream-launch"),
    ("device sync in run", program("", "st_gemm_args g{}; g.out = out[0].data; st_gemm(&g, stream); "
                                       "cudaDeviceSynchronize();"), "host-sync-in-run"),
    ("malloc in run", program("", "void* t; cudaMalloc(&t, 64); st_gemm_args g{}; g.out = out[0].data; "
                                  "st_gemm(&g, stream);"), "alloc-in-run"),
    ("big table", "static const float kY[] = {" + ", ".join(f"{i * 0.25}f" for i in range(300)) + "};\n",
     "hardcoded-output-table"),
    ("medium table", "const float kY[] = {" + ", ".join(str(i) for i in range(80)) + "};\n", "large-constant-table"),
    ("h2d copy into output", program("static const float kY[4] = {1, 2, 3, 4};\n",
                                     "st_copy_h2d(out[0].data, kY, sizeof(kY), stream);"), "const-copy-to-output"),
    ("cudaMemcpyAsync H2D into an output alias",
     program("", "float* y = static_cast<float*>(out[0].data);\n"
                 "  cudaMemcpyAsync(y, p->host, 16, cudaMemcpyHostToDevice, (cudaStream_t)stream);"),
     "const-copy-to-output"),
    ("cudaMemcpyDefault of a file-scope table into output",
     program("static const float kY[4] = {1, 2, 3, 4};\n",
             "cudaMemcpyAsync(out[0].data, kY, 16, cudaMemcpyDefault, (cudaStream_t)stream);"),
     "const-copy-to-output"),
    ("from symbol into output", program("", "cudaMemcpyFromSymbolAsync(out[0].data, g_y, 16, 0, "
                                            "cudaMemcpyDeviceToDevice, (cudaStream_t)stream);"),
     "const-copy-to-output"),
    ("only memset", program("", "TRY(st_check_tensor(&out[0], \"y\", ST_FLOAT32, 1, s, 1, ST_DEVICE_CUDA));\n"
                                "  cudaMemsetAsync(out[0].data, 0, 64, (cudaStream_t)stream);"),
     "output-only-memset"),
    ("output to symbol", program("", "cudaMemcpyToSymbolAsync(g_prev, out[0].data, 16, 0, "
                                     "cudaMemcpyDeviceToDevice, (cudaStream_t)stream);"), "output-to-global"),
    ("memset of input", program("", "st_memset(in[0].data, 0, 64, stream); st_gemm_args g{}; g.out = out[0].data; "
                                    "st_gemm(&g, stream);"), "input-write"),
    ("memset of input alias", program("", "float* x = (float*)in[0].data;\n  cudaMemsetAsync(x, 0, 64, "
                                          "(cudaStream_t)stream);"), "input-write"),
    ("output address kept in the program", program("", "p->last_y = out[0].data; st_gemm_args g{}; "
                                                       "g.out = out[0].data; st_gemm(&g, stream);"),
     "io-pointer-kept"),
    ("input address compared with a kept one", program("", "if (in[0].data == p->last_x) return ST_OK; "
                                                           "st_gemm_args g{}; g.out = out[0].data; st_gemm(&g, stream);"),
     "io-pointer-kept"),
    ("local include", '#include "precomputed.inc"\n', "foreign-include"),
    ("getenv", 'void f() { const char* v = getenv("STITCHCUDA_VERIFY"); }\n', "reads-environment"),
    ("macro static", "#define CACHE(T, n) static T n\n", "macro-hides-state"),
    ("missing ABI", "__global__ void k() {}\n", "abi-exports"),
    ("mutable array of structs", "st_ep_op kOps[] = {{ST_EP_RELU, 0.f, 0.f}};\n", "host-state-global"),
    ("vector of pointers", "std::vector<float*> g_history;\n", "host-state-global"),
    ("atomic counter", "std::atomic<int> g_calls{0};\n", "host-state-global"),
    ("static member definition", "float* Cache::last = nullptr;\n", "host-state-global"),
    ("static in a lambda", "void f() { auto g = []() { static int n = 0; return ++n; }; }\n",
     "host-state-static-local"),
    ("static in a member function", "struct S { void f() { static void* p = nullptr; } };\n",
     "host-state-static-local"),
    ("ABI without extern C", ABI.replace('extern "C" {', "namespace x {").replace("RUN_BODY", ""), "abi-exports"),
    # the dynamic linker's list of loaded libraries: a way to the host process without importing it
    ("_r_debug", "extern struct r_debug _r_debug;\nvoid* f() { return _r_debug.r_map; }\n", "link-map"),
    ("dl_iterate_phdr", "int cb(struct dl_phdr_info* i, size_t, void*);\nvoid f() { dl_iterate_phdr(cb, 0); }\n",
     "link-map"),
    ("link.h", "#include <link.h>\n", "link-map"),
    ("own _DYNAMIC", "void f() { for (auto* d = _DYNAMIC; d->d_tag; ++d) {} }\n", "link-map"),
    ("getauxval", "unsigned long f() { return getauxval(AT_BASE); }\n", "link-map"),
    ("ELF headers by hand", "void f(const Elf64_Ehdr* e) { (void)e; }\n", "link-map"),
    # every runtime entry point with a stream (read from the runtime's headers), and graph bodies
    ("convolution on nullptr in run", program("", "st_conv_args c{}; c.y = out[0].data; st_conv(&c, nullptr);"),
     "foreign-stream"),
    ("graph runner on the legacy stream in run",
     program("st_status body(void* c, void* s);\n",
             "const void* key[1] = {out[0].data}; st_graph_run(p->g, nullptr, key, 1, body, p);"), "foreign-stream"),
    ("graph body launching on the default stream",
     program("__global__ void k(float*);\nst_status body(void* c, void* s) { k<<<1, 32, 0, 0>>>((float*)c); "
             "return ST_OK; }\n",
             "const void* key[1] = {out[0].data}; st_graph_run(p->g, stream, key, 1, body, out[0].data);"),
     "foreign-stream"),
    ("graph body with a gemm on another stream",
     program("st_status body(void* c, void* s) { st_gemm_args g{}; return st_gemm(&g, nullptr); }\n",
             "const void* key[1] = {out[0].data}; st_graph_run(p->g, stream, key, 1, &body, out[0].data);"),
     "foreign-stream"),
]

# (name, source) that must not produce any finding except abi-exports (snippets are not programs)
NEGATIVES = [
    ("comment mentions torch", "// the reference is torch.matmul; we do not call at::matmul here\n"
                               "/* #include <torch/extension.h>\n   cudaStreamCreate(&s); static float* g; */\n"),
    ("string mentions torch", 'const char* const kDoc = "uses at::Tensor and cudaStreamCreate";\n'),
    ("raw string manifest", 'namespace { const char* kManifest = R"json({"name": "x", "torch::": 1})json"; }\n'),
    ("small const table", "static const float kTable[] = {0.5f, 0.25f, 0.125f, 1e-3f};\n"),
    ("constexpr table", "constexpr float kCoeff[8] = {1, 2, 3, 4, 5, 6, 7, 8};\n"),
    ("const pointer to const", "static const float* const kP = nullptr;\n"),
    ("string table", 'static const char* kNames[] = {"x", "y"};\n'),
    ("static function", "static int helper(const float* x, int n) { return n; }\n"),
    ("static kernel", "static __global__ void k(float* y) { y[0] = 1.f; }\n"),
    ("function declarations", "ST_API st_status st_check(const st_tensor* t, int n);\n__global__ void k(float*);\n"),
    ("templates", "template <int N> __global__ void k(float* x) { x[0] = N; }\n"
                  "template <class T> struct Vec { T v[4]; };\n"),
    ("constexpr and using", "using u32 = unsigned;\ntypedef float f32;\nconstexpr int64_t B = 64, D = 256;\n"),
    ("struct with instance members", "struct st_program { int device; void* w; std::vector<int> shape; };\n"),
    ("map keyed by value", "struct S { std::map<int64_t, int> plans; };\n"),
    ("static_cast", "void f(void* p) { auto* x = static_cast<float*>(p); }\n"),
    ("static const local", "void f() { static const int k = 4; static constexpr float t[2] = {1, 2}; }\n"),
    ("shared memory", "__global__ void k(float* y) { __shared__ float tile[32][33]; extern __shared__ float s[]; "
                      "tile[0][0] = 1; y[0] = tile[0][0] + s[0]; }\n"),
    ("device const", "__device__ const float kEps = 1e-5f;\n"),
    ("captureless lambda", "auto add = [](float a, float b) { return a + b; };\n"),
    ("extern shared at file scope", "extern __shared__ float smem[];\n"),
    ("launches on the run stream", program("__global__ void k(void*);\n",
                                           "cudaStream_t s = static_cast<cudaStream_t>(stream);\n"
                                           "  k<<<1, 32, 0, s>>>(out[0].data);\n"
                                           "  k<<<1, 32, 0, (cudaStream_t)stream>>>(out[0].data);\n"
                                           "  st_gemm_args g{}; g.out = out[0].data; st_gemm(&g, stream);")),
    ("split-k zero then accumulate", program("__global__ void acc(float*);\n",
                                             "cudaMemsetAsync(out[0].data, 0, 64, (cudaStream_t)stream);\n"
                                             "  acc<<<4, 32, 0, (cudaStream_t)stream>>>((float*)out[0].data);")),
    ("device copy with cudaMemcpyDefault", program("", "cudaMemcpyAsync(out[0].data, in[0].data, 64, "
                                                       "cudaMemcpyDefault, (cudaStream_t)stream);")),
    ("uintptr alignment check", "bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }\n"),
    ("enums", "enum class Kind : int { A, B };\nenum { kX = 1 };\ntypedef enum { Q } Q_t;\n"),
    ("operators", "struct F { __device__ float operator()(float x) const { return x; } "
                  "F& operator=(const F&) = default; };\n"),
    ("template specialisation", "template <class T> struct Tr; template <> struct Tr<float> { "
                                "static constexpr int v = 4; using type = float; };\n"),
    ("default member initialisers", "struct st_program { int device = 0; void* w{nullptr}; float scale = 1.0f; };\n"),
    ("constructor", "struct Plan { Plan(int m, int n) : m_(m), n_(n) {} int m_, n_; };\n"),
    ("const array of structs", "const st_ep_op kOps[] = {{ST_EP_RELU, 0.f, 0.f}, {ST_EP_SCALE, 2.f, 0.f}};\n"),
    ("helper launching on its stream parameter", "__global__ void k(float*);\nstatic st_status go(float* y, "
                                                 "cudaStream_t s) { dim3 g(4, 2), b(128); k<<<g, b, 0, s>>>(y); "
                                                 "return ST_OK; }\n"),
    ("digit separators and char literals", "const int kBig = 1'000'000; const char kQ = '\"'; const char kB = '{';\n"),
    ("memset of scratch beside a launch on the output", program(
        "__global__ void k(float*, float*);\n",
        "if (cudaMemsetAsync(p->scratch, 0, 64, (cudaStream_t)stream) == cudaSuccess) "
        "k<<<4, 32, 0, (cudaStream_t)stream>>>((float*)p->scratch, (float*)out[0].data);")),
    ("graph body on the runner's stream", program(
        "__global__ void k(float*);\nst_status body(void* c, void* s) { "
        "k<<<1, 32, 0, static_cast<cudaStream_t>(s)>>>((float*)c); st_gemm_args g{}; return st_gemm(&g, s); }\n",
        "const void* key[1] = {out[0].data}; return st_graph_run(p->g, stream, key, 1, body, out[0].data);")),
]


@pytest.mark.parametrize("name,src,rule", POSITIVES, ids=[p[0] for p in POSITIVES])
def test_rule_fires(name, src, rule):
    assert rule in RULES
    got = rules_of(src)
    assert rule in got, f"{name}: expected {rule}, got {sorted(got)}"


@pytest.mark.parametrize("name,src", NEGATIVES, ids=[n[0] for n in NEGATIVES])
def test_rule_does_not_fire(name, src):
    findings = [f for f in check_source(src) if f.rule != "abi-exports"]
    assert findings == [], [str(f) for f in findings]


HELPERS = """
__global__ void k(float* y) {}
static st_status zero_it(const st_tensor* t, void* s) { return st_memset(t[0].data, 0, 64, s); }
static st_status launch_on(float* y, cudaStream_t s) { k<<<1, 32, 0, s>>>(y); return ST_OK; }
static st_status launch_default(float* y) { k<<<1, 32>>>(y); return ST_OK; }
static st_status deeper(const st_tensor* t, void* s) { return zero_it(t, s); }
"""


@pytest.mark.parametrize("run, rule, where", [
    ("TRY(zero_it(in, stream));", "input-write", "zero_it (called from st_program_run)"),
    ("TRY(deeper(in, stream));", "input-write", "zero_it (called from st_program_run)"),
    ("TRY(launch_default(static_cast<float*>(out[0].data)));", "foreign-stream", "launch_default"),
    ("TRY(launch_on(static_cast<float*>(out[0].data), nullptr));", "foreign-stream", "launch_on"),
])
def test_rules_follow_calls_through_the_translation_unit(run, rule, where):
    """What a helper called from st_program_run does counts as the run's: the rules follow the calls,
    with the helper's parameters standing for what the run passed."""
    found = [f for f in check_source(program("#define TRY(x) x\n" + HELPERS, run)) if f.rule == rule]
    assert found and where in found[0].message, [str(f) for f in check_source(program(HELPERS, run))]


def test_the_stream_argument_of_every_runtime_entry_point_comes_from_its_headers(tmp_path):
    """The table of runtime calls that take a stream is read from the runtime's own headers: an entry
    point declared tomorrow is covered the day it is declared, whatever this table said."""
    from stitchcuda.verifier.static.source import runtime_stream_args

    found = runtime_stream_args(REPO / "runtime" / "include" / "stitchrt")
    assert found["st_conv"] == 1 and found["st_graph_run"] == 1 and found["st_gemm_epilogue"] == 5
    assert found["st_gemm"] == 1 and "st_check_tensor" not in found
    (tmp_path / "stitchrt.h").write_text("/* a new one */\nST_API st_status st_pool(int n, void* stream);\n"
                                         "ST_API st_status st_other(int n);\n")
    assert runtime_stream_args(tmp_path) == {"st_pool": 1}


def test_an_output_memset_stays_refused_when_a_statement_also_memsets_scratch():
    """The memset rule reads data flow: the destination decides, not the statement's spelling."""
    src = program("", "if (cudaMemsetAsync(p->scratch, 0, 64, (cudaStream_t)stream) == cudaSuccess) "
                      "cudaMemsetAsync(out[0].data, 0, 64, (cudaStream_t)stream);")
    assert "output-only-memset" in rules_of(src)


def test_a_helper_on_the_callers_stream_is_fine():
    src = program("#define TRY(x) x\n" + HELPERS, "TRY(launch_on(static_cast<float*>(out[0].data), "
                                                  "static_cast<cudaStream_t>(stream)));")
    assert "foreign-stream" not in rules_of(src)


def test_unloadable_program_is_a_finding(tmp_path):
    (tmp_path / "program.cu").write_text("// x\n")
    (tmp_path / "manifest.json").write_text("{not json")
    result = check_program(tmp_path)
    (f,) = result.findings
    assert (f.rule, f.severity, f.file) == ("manifest-invalid", "reject", "manifest.json")
    assert "not valid JSON" in f.message and result.rejected


def test_finding_has_location_and_excerpt():
    src = "// header\n\nstatic float* g_out = nullptr;  // remembered\n"
    (f,) = [f for f in check_source(src, file="p.cu") if f.rule != "abi-exports"]
    assert (f.rule, f.severity, f.file, f.line) == ("host-state-global", "reject", "p.cu", 3)
    assert f.location == "p.cu:3"
    assert "g_out" in f.message and "g_out" in f.excerpt
    assert set(f.to_dict()) == {"rule", "severity", "file", "line", "message", "excerpt"}


def test_output_sized_table_is_rejected_below_the_size_limit():
    m = _manifest(outputs=[{"name": "y", "dtype": "float32", "shape": [8, 12]}])
    src = "static const float kY[] = {" + ", ".join(f"{i}.5f" for i in range(96)) + "};\n"
    assert "hardcoded-output-table" in rules_of(src, manifest=m)
    assert "hardcoded-output-table" not in rules_of(src)


def test_many_hits_are_capped_per_rule():
    src = "\n".join(f"void f{i}() {{ at::Tensor t{i}; }}" for i in range(12))
    hits = [f for f in check_source(src) if f.rule == "torch-symbol"]
    assert len(hits) == 5
    assert "7 more" in hits[-1].message


def test_every_rule_has_severity_and_summary():
    for r in RULES.values():
        assert r.severity in ("reject", "warn")
        assert re.fullmatch(r"[a-z0-9-]+", r.id) and r.summary


# ------------------------------------------------------------------ provenance and manifest rules


def _manifest(**over) -> mf.Manifest:
    d = json.loads((ADVERSARIAL / "correct" / "manifest.json").read_text())
    d.update(over)
    return mf.Manifest.from_dict(d, "m.json")


def test_provenance_rules():
    m = _manifest(tasks=[{"name": "linear", "strategy": "cublaslt_gemm", "covers": ["permute", "addmm", "ghost"]}])
    got = {f.rule: f for f in check_manifest(m)}
    assert got["provenance-coverage"].severity == "reject" and "relu" in got["provenance-coverage"].message
    assert got["provenance-unknown-node"].severity == "warn" and "ghost" in got["provenance-unknown-node"].message
    empty = _manifest(reference_ops=[], tasks=[])
    assert [f.rule for f in check_manifest(empty)] == ["provenance-empty"]


def test_provenance_finding_points_at_the_manifest_line():
    text = (ADVERSARIAL / "missing_provenance" / "manifest.json").read_text()
    m = mf.Manifest.from_json(text, "manifest.json")
    (f,) = check_manifest(m, text=text)
    assert text.splitlines()[f.line - 1].strip() == '"node": "relu",'


def test_source_hash_mismatch_is_a_warning():
    m = _manifest()
    src = (ADVERSARIAL / "correct" / "program.cu").read_text()
    assert check_manifest(m, source=src) == []
    (f,) = check_manifest(m, source=src + "\n// edited\n")
    assert (f.rule, f.severity) == ("manifest-hash", "warn")


# ------------------------------------------------------------------ manifest format


def _write_program(tmp_path: Path, manifest_text: str | None = None, source: str = "// x\n") -> Path:
    d = tmp_path / "prog"
    d.mkdir()
    (d / "program.cu").write_text(source)
    if manifest_text is not None:
        (d / "manifest.json").write_text(manifest_text)
    return d


def _good() -> dict:
    return json.loads((ADVERSARIAL / "correct" / "manifest.json").read_text())


def test_manifest_round_trip(tmp_path):
    m = mf.Manifest.from_dict(_good(), "m.json")
    assert m.inputs[0] == mf.TensorSpec("x", (64, 256), "float32")
    assert m.weights[0].nbytes == 128 * 256 * 4
    assert m.reference.path == "../reference.py"
    assert mf.Manifest.from_json(m.to_json()) == m
    path = m.save(tmp_path)
    assert path.name == "manifest.json" and mf.Manifest.load(tmp_path) == m
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]  # no temp file left


def test_manifest_kernelbench_reference_and_lifted_random():
    d = _good()
    d["reference"] = {"kernelbench": {"level": 1, "problem_id": 23, "name": "23_Softmax"}}
    d["inputs"].append({"name": "noise", "dtype": "float32", "shape": [64, 128]})
    d["lifted_random"] = ["noise", {"input": "noise", "node": "randn_like", "op": "aten.randn_like.default"},
                          {"input": "noise", "op": "aten.normal.default", "shape": [64, 128], "dtype": "float32",
                           "distribution": "normal", "params": [["mean", 0.0], ["std", 2.0]], "source": "x.py:3"}]
    m = mf.Manifest.from_dict(d)
    assert m.reference.kernelbench == mf.KernelBenchRef(1, 23, "23_Softmax")
    assert m.lifted_random[1].node == "randn_like"
    assert m.lifted_random[2].params == (("mean", 0.0), ("std", 2.0))
    assert mf.Manifest.from_dict(m.to_dict()) == m
    d["lifted_random"][2]["shape"] = [64, 64]
    with pytest.raises(mf.ManifestError, match=r"lifted_random\[2\]: float32\[64, 64\] does not match input noise"):
        mf.Manifest.from_dict(d)


def test_missing_manifest_names_the_file(tmp_path):
    d = _write_program(tmp_path)
    with pytest.raises(mf.ManifestError, match=r"prog/manifest\.json: file not found"):
        mf.load_program_dir(d)


def test_missing_source_names_the_file(tmp_path):
    d = tmp_path / "prog"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps(_good()))
    with pytest.raises(mf.ManifestError, match=r"program\.cu: file not found"):
        mf.load_program_dir(d)
    with pytest.raises(mf.ManifestError, match="program folder not found"):
        mf.load_program_dir(tmp_path / "nope")


def test_corrupt_json_names_file_and_position(tmp_path):
    d = _write_program(tmp_path, '{"format": "stitchcuda-program", "version": 1,\n  "name": }')
    with pytest.raises(mf.ManifestError, match=r"manifest\.json: not valid JSON: .* line 2"):
        mf.load_program_dir(d)


@pytest.mark.parametrize("mutate,problem", [
    (lambda d: d.pop("precision"), r'missing required field "precision"'),
    (lambda d: d.update(precision="fp8"), r"precision: expected one of fp32, tf32, bf16, fp16"),
    (lambda d: d.update(format="other"), r'format: expected "stitchcuda-program"'),
    (lambda d: d.update(version=2), r"version: this stitchcuda reads version 1"),
    (lambda d: d.update(abi_version=3), r"abi_version: .*ABI 1"),
    (lambda d: d.update(arch="hopper"), r'arch: expected a target like "sm_90"'),
    (lambda d: d.update(source_hash="abc"), r"source_hash: expected the SHA-256"),
    (lambda d: d["inputs"][0].update(shape="64x256"), r"inputs\[0\]\.shape: expected a list of non-negative integers"),
    (lambda d: d["inputs"][0].update(shape=[64, -1]), r"inputs\[0\]\.shape"),
    (lambda d: d["weights"][1].update(dtype="float8"), r"weights\[1\]\.dtype: unknown dtype 'float8'"),
    (lambda d: d["outputs"][0].update(name="x"), r"outputs\[0\]\.name: 'x' is already used by inputs\[0\]"),
    (lambda d: d.update(outputs=[]), r"outputs: a program must have at least one output"),
    (lambda d: d.update(reference={}), r'reference: expected exactly one of "path" or "kernelbench"'),
    (lambda d: d["tasks"][0].update(flops=-1), r"tasks\[0\]\.flops: expected a non-negative integer"),
    (lambda d: d["tasks"][0].update(covers="addmm"), r"tasks\[0\]\.covers: expected a list"),
    (lambda d: d["tasks"].append(dict(d["tasks"][0])), r"tasks\[2\]: duplicate task name 'linear'"),
    (lambda d: d["reference_ops"][0].pop("op"), r'reference_ops\[0\]: missing required field "op"'),
    (lambda d: d.update(lifted_random=["zzz"]), r"lifted_random\[0\]\.input: 'zzz' is not one of the inputs"),
    (lambda d: d.update(inputs={"x": 1}), r"inputs: expected a list, got an object"),
])
def test_manifest_validation_errors(tmp_path, mutate, problem):
    d = _good()
    mutate(d)
    prog = _write_program(tmp_path, json.dumps(d))
    with pytest.raises(mf.ManifestError) as e:
        mf.load_program_dir(prog)
    assert str(e.value).startswith(str(prog / "manifest.json") + ": ")
    assert re.search(problem, str(e.value)), str(e.value)


def _weights(m: mf.Manifest, **override) -> dict:
    out = {}
    for w in m.weights:
        dtype, shape = override.get(w.name, (w.dtype, w.shape))
        n = 1
        for s in shape:
            n *= s
        out[w.name] = (dtype, shape, bytes(n * mf.DTYPE_SIZES[dtype]))
    return out


def test_weights_file_matching_the_manifest_loads(tmp_path):
    prog = _write_program(tmp_path, json.dumps(_good()))
    m = mf.Manifest.load(prog)
    wf.write_safetensors(prog / "weights.safetensors", _weights(m))
    loaded = mf.load_program_dir(prog)
    assert loaded.weights == prog / "weights.safetensors"
    assert set(wf.read_safetensors_header(loaded.weights)) == {"fc.weight", "fc.bias"}


def test_weights_not_matching_the_manifest(tmp_path):
    prog = _write_program(tmp_path, json.dumps(_good()))
    m = mf.Manifest.load(prog)
    wpath = prog / "weights.safetensors"
    wf.write_safetensors(wpath, _weights(m, **{"fc.weight": ("float32", (256, 128))}))
    with pytest.raises(mf.ManifestError, match=r"weights\.safetensors: weight 'fc\.weight' is float32\[256, 128\], "
                                               r"the manifest says float32\[128, 256\]"):
        mf.load_program_dir(prog)
    wf.write_safetensors(wpath, {"fc.weight": _weights(m)["fc.weight"]})
    with pytest.raises(mf.ManifestError, match=r"lacks weight\(s\) the manifest lists: fc\.bias"):
        mf.load_program_dir(prog)
    wf.write_safetensors(wpath, {**_weights(m), "extra": ("float32", (2,), bytes(8))})
    with pytest.raises(mf.ManifestError, match=r"holds tensor\(s\) the manifest does not list: extra"):
        mf.load_program_dir(prog)


def test_corrupt_weights_file(tmp_path):
    prog = _write_program(tmp_path, json.dumps(_good()))
    wpath = prog / "weights.safetensors"
    wpath.write_bytes(b"\x01\x02")
    with pytest.raises(mf.ManifestError, match="not a safetensors file"):
        mf.load_program_dir(prog)
    header = json.dumps({"fc.weight": {"dtype": "F32", "shape": [128, 256], "data_offsets": [0, 10]}}).encode()
    wpath.write_bytes(struct.pack("<Q", len(header)) + header + bytes(10))
    with pytest.raises(mf.ManifestError, match="data_offsets"):
        mf.load_program_dir(prog)
    wpath.write_bytes(struct.pack("<Q", 5) + b"{oops")
    with pytest.raises(mf.ManifestError, match="corrupt safetensors header"):
        mf.load_program_dir(prog)


def test_required_weights_file(tmp_path):
    prog = _write_program(tmp_path, json.dumps(_good()))
    assert mf.load_program_dir(prog).weights is None
    with pytest.raises(mf.ManifestError, match=r"weights\.safetensors: file not found; the manifest lists 2"):
        mf.load_program_dir(prog, require_weights=True)


def test_safetensors_package_reads_our_file(tmp_path):
    safetensors = pytest.importorskip("safetensors.numpy")
    m = mf.Manifest.from_dict(_good())
    path = wf.write_safetensors(tmp_path / "w.safetensors", _weights(m))
    loaded = safetensors.load_file(str(path))
    assert loaded["fc.weight"].shape == (128, 256)
