// runner.cu — stitch-runner: one candidate program in a process of its own, with no Python interpreter
// and no PyTorch loaded: only this runner, libstitchrt (with the CUDA libraries it links) and the
// program. The Verifier (stitchcuda.verifier.run.native) feeds it over a pipe and reads its replies
// over another; tensors cross as CUDA IPC handles of buffers the Verifier allocated (or, for the
// sanitizer trial and the CPU tests, as ranges of a shared host file). A program that walks the
// dynamic linker's list of loaded libraries here finds nothing to reach.
//
// Protocol: one command per line on --in FD; one reply per command on --out FD, a line
// "<token> <json>" (the token is the first line the Verifier sends: "token T"). Commands:
//
//   buf ID ipc HANDLE_HEX OFFSET BYTES   a buffer inside a CUDA IPC allocation (opened once per handle)
//   buf ID host OFFSET BYTES             a range of the shared host file (--host-fd), host memory
//   buf ID dev OFFSET BYTES              device memory of exactly BYTES, filled from the host file
//   readback ID                          a dev buffer copied back to its host-file range
//   free ID                              forget a buffer (dev: freed; ipc: handle closed when unused)
//   tensor TID BUF DTYPE NDIM D0 .. Dn   a dense descriptor over a buffer
//   create DEVICE N TID..                st_program_create on those weights
//   run ARGS                             st_program_run on the runner's stream, then a stream sync
//   time FLUSH ARGS                      the same between two CUDA events (L2 flushed first if FLUSH)
//   wall ARGS                            the same between device-wide synchronisations, host clock
//   wall_empty                           one empty kernel on the stream between two device-wide
//                                        synchronisations, host clock (what waiting for a launch costs)
//   repeat K ARGS                        K runs, then a stream sync
//   capture ARGS / replay / drop_graph   the run captured from the runner's stream into a graph
//   copy DST SRC BYTES                   cudaMemcpyAsync on the stream (not awaited)
//   hold US                              the stream held US microseconds by a spinning kernel
//   sync / syncall                       the stream / the whole device awaited
//   memory                               device free/total, resident and pinned host bytes, runtime pool
//   calls                                the runtime calls the program made since the last "calls"
//   tuning                               the runtime's choices by timing in this process, and their identity
//   destroy / quit
//   hello                                the runner's source hash and the program's ABI version
//   ARGS = N_IN TID.. N_OUT TID.. [pressure] [nosync]  ("pressure": a busy kernel on a second stream
//          meanwhile; "nosync": run returns without awaiting the stream)
//
// Every runtime entry point of stitchrt.h / graph.h that a program calls resolves to this executable
// first (it exports them): each call is counted by entry point, precision policy and dtypes, and a
// call made during a run on a stream other than the run's is recorded, before the call is passed on
// to libstitchrt. Failures are replies ({"ok":false,...}); a crash of the program ends the process,
// which the Verifier sees as the pipe closing.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "stitchrt/program.h"
#include "stitchrt/tuning.h"

#ifndef STITCH_RUNNER_HASH
#define STITCH_RUNNER_HASH "unknown"
#endif

namespace {

// ------------------------------------------------------------------ what the program called

struct CallKey {
  std::string fn;
  int policy;  // -1 where the entry point takes none
  std::string dtypes;
  bool operator<(const CallKey& o) const {
    if (fn != o.fn) return fn < o.fn;
    if (policy != o.policy) return policy < o.policy;
    return dtypes < o.dtypes;
  }
};

std::mutex g_log_mu;
std::map<CallKey, long> g_calls;
long g_foreign = 0;
std::string g_foreign_first;
bool g_in_run = false;
void* g_run_stream = nullptr;

void note_call(const char* fn, void* stream, bool has_stream, int policy, const std::string& dtypes) {
  std::lock_guard<std::mutex> lock(g_log_mu);
  g_calls[CallKey{fn, policy, dtypes}] += 1;
  if (has_stream && g_in_run && stream != g_run_stream) {
    if (g_foreign++ == 0) {
      char buf[160];
      snprintf(buf, sizeof buf, "%s on stream %p during a run on stream %p", fn, stream, g_run_stream);
      g_foreign_first = buf;
    }
  }
}

std::string dt(st_dtype a) { return std::to_string(static_cast<int>(a)); }

template <class F>
F next_fn(const char* name) {
  void* s = dlsym(RTLD_NEXT, name);
  if (!s) {
    fprintf(stderr, "stitch-runner: libstitchrt has no %s\n", name);
    abort();
  }
  return reinterpret_cast<F>(s);
}

}  // namespace

// The runtime's entry points, as the program sees them (this executable is searched first).
#define ST_FORWARD(ret, name, params, args, stream_expr, policy_expr, dtypes_expr) \
  extern "C" __attribute__((visibility("default"))) ret name params {                 \
    static auto real = next_fn<ret(*) params>(#name);                                 \
    note_call(#name, stream_expr, true, policy_expr, dtypes_expr);                    \
    return real args;                                                                 \
  }

#define ST_FORWARD_NOSTREAM(ret, name, params, args) \
  extern "C" __attribute__((visibility("default"))) ret name params { \
    static auto real = next_fn<ret(*) params>(#name);                 \
    note_call(#name, nullptr, false, -1, "");                         \
    return real args;                                                 \
  }

ST_FORWARD(st_status, st_gemm, (const st_gemm_args* a, void* stream), (a, stream), stream, a ? (int)a->policy : -1,
           a ? dt(a->a_dtype) + "," + dt(a->b_dtype) + "," + dt(a->out_dtype) : std::string())
ST_FORWARD(st_status, st_gemm_epilogue,
           (const st_gemm_args* a, const st_ep_op* ops, int32_t n_ops, const void* residual, int64_t ldr,
            void* stream),
           (a, ops, n_ops, residual, ldr, stream), stream, a ? (int)a->policy : -1,
           a ? dt(a->a_dtype) + "," + dt(a->b_dtype) + "," + dt(a->out_dtype) : std::string())
ST_FORWARD(st_status, st_gemm_split_tf32, (const st_gemm_args* a, void* stream), (a, stream), stream,
           a ? (int)a->policy : -1, a ? dt(a->a_dtype) + "," + dt(a->b_dtype) + "," + dt(a->out_dtype) : std::string())
// its bf16 GEMM kernels are what the Verifier's kernel-name check excuses (three products a call)
ST_FORWARD(st_status, st_gemm_split_bf16, (const st_gemm_args* a, void* stream), (a, stream), stream,
           a ? (int)a->policy : -1, a ? dt(a->a_dtype) + "," + dt(a->b_dtype) + "," + dt(a->out_dtype) : std::string())
ST_FORWARD(st_status, st_epilogue_apply, (const st_epilogue_args* a, void* stream), (a, stream), stream, -1,
           a ? dt(a->dtype) : std::string())
ST_FORWARD(st_status, st_conv, (const st_conv_args* a, void* stream), (a, stream), stream, a ? (int)a->policy : -1,
           a ? dt(a->x_dtype) + "," + dt(a->w_dtype) + "," + dt(a->y_dtype) : std::string())
ST_FORWARD(st_status, st_graph_run,
           (st_graph_cache * g, void* stream, const void* const* key, int32_t n_key, st_graph_body_fn body, void* ctx),
           (g, stream, key, n_key, body, ctx), stream, -1, "")
ST_FORWARD(st_status, st_device_alloc, (size_t bytes, void* stream, void** ptr), (bytes, stream, ptr), stream, -1, "")
ST_FORWARD(st_status, st_device_free, (void* ptr, void* stream), (ptr, stream), stream, -1, "")
ST_FORWARD(st_status, st_memcpy_d2d, (void* dst, const void* src, size_t bytes, void* stream),
           (dst, src, bytes, stream), stream, -1, "")
ST_FORWARD(st_status, st_memset, (void* dst, int value, size_t bytes, void* stream), (dst, value, bytes, stream),
           stream, -1, "")
ST_FORWARD(st_status, st_copy_h2d, (void* dst, const void* src, size_t bytes, void* stream),
           (dst, src, bytes, stream), stream, -1, "")
ST_FORWARD(st_status, st_copy_d2h, (void* dst, const void* src, size_t bytes, void* stream),
           (dst, src, bytes, stream), stream, -1, "")
ST_FORWARD(st_status, st_arena_reserve, (void* stream, size_t bytes, void** base), (stream, bytes, base), stream, -1,
           "")
ST_FORWARD(st_status, st_workspace_info, (void* stream, void** ptr, size_t* bytes), (stream, ptr, bytes), stream, -1,
           "")
ST_FORWARD(st_status, st_stream_synchronize, (void* stream), (stream), stream, -1, "")
ST_FORWARD_NOSTREAM(st_status, st_host_alloc, (size_t bytes, void** ptr, int* pinned), (bytes, ptr, pinned))
ST_FORWARD_NOSTREAM(st_status, st_host_free, (void* ptr), (ptr))

namespace {

// ------------------------------------------------------------------ device helpers

// Keeps a few blocks busy for about `ns` nanoseconds, reading and writing `scratch`: other work on
// the device is scheduled around it (a race that needs one order of blocks sees another).
__global__ void pressure_kernel(unsigned* scratch, size_t n, long long ns) {
  long long t0 = clock64();
  unsigned acc = blockIdx.x;
  size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) % (n ? n : 1);
  while (clock64() - t0 < ns) {
    if (n) {
      acc = acc * 1664525u + scratch[i];
      scratch[i] = acc;
      i = (i + 4099 * blockDim.x) % n;
    }
  }
}

// Nothing: what a launch and its wait cost by themselves (wall_empty).
__global__ void empty_kernel() {}

// Holds the stream: one thread spinning for about `ns` nanoseconds (clock ticks; close enough).
__global__ void hold_kernel(long long ticks) {
  long long t0 = clock64();
  while (clock64() - t0 < ticks) {
  }
}

// ------------------------------------------------------------------ state

struct Buffer {
  char kind = 0;  // 'i' ipc, 'h' host, 'd' device (runner-owned)
  void* ptr = nullptr;
  size_t bytes = 0;
  size_t host_offset = 0;
  std::string handle;  // ipc
};

struct Opened {
  void* base = nullptr;
  int users = 0;
};

struct Program {
  void* lib = nullptr;
  st_program_abi_version_fn abi = nullptr;
  st_program_manifest_fn manifest = nullptr;
  st_program_create_fn create = nullptr;
  st_program_run_fn run = nullptr;
  st_program_destroy_fn destroy = nullptr;
  st_program* p = nullptr;
};

std::string g_token = "-";
FILE* g_out = nullptr;
char* g_host = nullptr;
size_t g_host_bytes = 0;
std::map<int, Buffer> g_bufs;
std::map<std::string, Opened> g_opened;
std::map<int, st_tensor> g_tensors;
Program g_prog;
cudaStream_t g_stream = nullptr;
cudaStream_t g_side = nullptr;
bool g_cuda = false;  // CUDA in use (a device buffer, a device tensor, create on a device)
int g_device = 0;
unsigned* g_scratch = nullptr;
size_t g_scratch_n = 0;
void* g_flush = nullptr;
size_t g_flush_bytes = 0;
cudaEvent_t g_ev0 = nullptr, g_ev1 = nullptr;
cudaGraph_t g_graph = nullptr;
cudaGraphExec_t g_exec = nullptr;
int g_sm_count = 1;
double g_clock_ghz = 1.5;

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char b[8];
          snprintf(b, sizeof b, "\\u%04x", c);
          o += b;
        } else {
          o += c;
        }
    }
  }
  return o;
}

void reply(const std::string& json) {
  fprintf(g_out, "%s %s\n", g_token.c_str(), json.c_str());
  fflush(g_out);
}

void ok(const std::string& more = "") { reply(more.empty() ? "{\"ok\":true}" : "{\"ok\":true," + more + "}"); }

void fail(const std::string& what) { reply("{\"ok\":false,\"error\":\"" + json_escape(what) + "\"}"); }

// A CUDA failure: a sticky one (an illegal address) means the context is gone; say which.
bool cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::string m = std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  reply("{\"ok\":false,\"cuda\":\"" + json_escape(m) + "\"}");
  return false;
}

bool use_cuda() {
  if (g_cuda) return true;
  if (!cuda_ok(cudaSetDevice(g_device), "cudaSetDevice")) return false;
  if (!cuda_ok(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking), "cudaStreamCreate")) return false;
  if (!cuda_ok(cudaStreamCreateWithFlags(&g_side, cudaStreamNonBlocking), "cudaStreamCreate")) return false;
  if (!cuda_ok(cudaEventCreate(&g_ev0), "cudaEventCreate")) return false;
  if (!cuda_ok(cudaEventCreate(&g_ev1), "cudaEventCreate")) return false;
  int sms = 1, khz = 1500000, l2 = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, g_device);
  cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, g_device);
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, g_device);
  g_sm_count = sms > 0 ? sms : 1;
  g_clock_ghz = khz > 0 ? khz / 1e6 : 1.5;
  g_flush_bytes = std::max<size_t>(2 * (size_t)l2, 32u << 20);
  if (!cuda_ok(cudaMalloc(&g_flush, g_flush_bytes), "cudaMalloc(L2 flush)")) return false;
  g_scratch_n = 1u << 20;
  if (!cuda_ok(cudaMalloc(&g_scratch, g_scratch_n * sizeof(unsigned)), "cudaMalloc(pressure)")) return false;
  g_cuda = true;
  return true;
}

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream is(line);
  std::string w;
  while (is >> w) out.push_back(w);
  return out;
}

bool parse_i64(const std::string& s, long long* v) {
  char* end = nullptr;
  errno = 0;
  long long x = strtoll(s.c_str(), &end, 10);
  if (errno || !end || *end) return false;
  *v = x;
  return true;
}

bool hex_handle(const std::string& hex, cudaIpcMemHandle_t* h) {
  if (hex.size() != 2 * sizeof(cudaIpcMemHandle_t)) return false;
  auto* out = reinterpret_cast<unsigned char*>(h);
  for (size_t i = 0; i < sizeof(cudaIpcMemHandle_t); ++i) {
    unsigned v = 0;
    if (sscanf(hex.c_str() + 2 * i, "%2x", &v) != 1) return false;
    out[i] = static_cast<unsigned char>(v);
  }
  return true;
}

void drop_buffer(int id) {
  auto it = g_bufs.find(id);
  if (it == g_bufs.end()) return;
  Buffer& b = it->second;
  if (b.kind == 'd') cudaFree(b.ptr);
  if (b.kind == 'i') {
    auto o = g_opened.find(b.handle);
    if (o != g_opened.end() && --o->second.users <= 0) {
      cudaIpcCloseMemHandle(o->second.base);
      g_opened.erase(o);
    }
  }
  g_bufs.erase(it);
}

void cmd_buf(const std::vector<std::string>& a) {
  long long id, off, bytes;
  if (a.size() < 5 || !parse_i64(a[1], &id)) return fail("buf: expected ID KIND ...");
  drop_buffer((int)id);
  Buffer b;
  const std::string& kind = a[2];
  if (kind == "ipc") {
    if (a.size() != 6 || !parse_i64(a[4], &off) || !parse_i64(a[5], &bytes)) return fail("buf ipc: bad arguments");
    if (!use_cuda()) return;
    auto o = g_opened.find(a[3]);
    if (o == g_opened.end()) {
      cudaIpcMemHandle_t h;
      if (!hex_handle(a[3], &h)) return fail("buf ipc: bad handle");
      void* base = nullptr;
      if (!cuda_ok(cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle")) return;
      o = g_opened.emplace(a[3], Opened{base, 0}).first;
    }
    o->second.users += 1;
    b.kind = 'i';
    b.handle = a[3];
    b.ptr = static_cast<char*>(o->second.base) + off;
    b.bytes = (size_t)bytes;
  } else if (kind == "host" || kind == "dev") {
    if (a.size() != 5 || !parse_i64(a[3], &off) || !parse_i64(a[4], &bytes)) return fail("buf: bad arguments");
    if (!g_host || off < 0 || bytes < 0 || (size_t)(off + bytes) > g_host_bytes)
      return fail("buf: the range is not inside the shared host file");
    b.host_offset = (size_t)off;
    b.bytes = (size_t)bytes;
    if (kind == "host") {
      b.kind = 'h';
      b.ptr = g_host + off;
    } else {
      if (!use_cuda()) return;
      b.kind = 'd';
      if (!cuda_ok(cudaMalloc(&b.ptr, b.bytes ? b.bytes : 1), "cudaMalloc")) return;
      if (!cuda_ok(cudaMemcpy(b.ptr, g_host + off, b.bytes, cudaMemcpyHostToDevice), "cudaMemcpy(H2D)")) return;
    }
  } else {
    return fail("buf: kind must be ipc, host or dev");
  }
  g_bufs[(int)id] = b;
  ok();
}

void cmd_readback(const std::vector<std::string>& a) {
  long long id;
  if (a.size() != 2 || !parse_i64(a[1], &id) || !g_bufs.count((int)id)) return fail("readback: unknown buffer");
  Buffer& b = g_bufs[(int)id];
  if (b.kind != 'd') return ok();
  if (!cuda_ok(cudaMemcpy(g_host + b.host_offset, b.ptr, b.bytes, cudaMemcpyDeviceToHost), "cudaMemcpy(D2H)")) return;
  ok();
}

void cmd_tensor(const std::vector<std::string>& a) {
  long long tid, bid, dtype, ndim;
  if (a.size() < 5 || !parse_i64(a[1], &tid) || !parse_i64(a[2], &bid) || !parse_i64(a[3], &dtype) ||
      !parse_i64(a[4], &ndim) || ndim < 0 || ndim > ST_MAX_DIMS || (long long)a.size() != 5 + ndim)
    return fail("tensor: expected TID BUF DTYPE NDIM D0 .. Dn");
  auto it = g_bufs.find((int)bid);
  if (it == g_bufs.end()) return fail("tensor: unknown buffer");
  st_tensor t{};
  t.data = it->second.ptr;
  t.dtype = static_cast<st_dtype>(dtype);
  t.ndim = (int32_t)ndim;
  long long numel = 1;
  for (long long i = 0; i < ndim; ++i) {
    long long d;
    if (!parse_i64(a[5 + i], &d) || d < 0) return fail("tensor: bad dimension");
    t.shape[i] = d;
    numel *= d;
  }
  long long stride = 1;
  for (long long i = ndim - 1; i >= 0; --i) {
    t.strides[i] = stride;
    stride *= t.shape[i];
  }
  size_t need = (size_t)numel * st_dtype_size(t.dtype);
  if (need > it->second.bytes) return fail("tensor: larger than its buffer");
  t.device_type = it->second.kind == 'h' ? ST_DEVICE_HOST : ST_DEVICE_CUDA;
  t.device_id = g_device;
  g_tensors[(int)tid] = t;
  ok();
}

bool tensors(const std::vector<std::string>& a, size_t* at, std::vector<st_tensor>* out) {
  long long n;
  if (*at >= a.size() || !parse_i64(a[*at], &n) || n < 0) return false;
  ++*at;
  for (long long i = 0; i < n; ++i, ++*at) {
    long long tid;
    if (*at >= a.size() || !parse_i64(a[*at], &tid) || !g_tensors.count((int)tid)) return false;
    out->push_back(g_tensors[(int)tid]);
  }
  return true;
}

struct RunArgs {
  std::vector<st_tensor> in, out;
  bool pressure = false;
  bool nosync = false;
  bool device = false;
};

bool run_args(const std::vector<std::string>& a, size_t at, RunArgs* r) {
  if (!tensors(a, &at, &r->in) || !tensors(a, &at, &r->out)) return false;
  for (; at < a.size(); ++at) {
    if (a[at] == "pressure") r->pressure = true;
    else if (a[at] == "nosync") r->nosync = true;
    else return false;
  }
  for (auto& t : r->in) r->device |= t.device_type == ST_DEVICE_CUDA;
  for (auto& t : r->out) r->device |= t.device_type == ST_DEVICE_CUDA;
  return true;
}

// One call of the program on the runner's stream (not awaited). Returns the program's status.
st_status call_program(const RunArgs& r) {
  if (r.pressure && g_cuda) {
    int blocks = 1 + rand() % (2 * g_sm_count);
    long long ticks = (long long)(g_clock_ghz * 1e6 * (0.2 + (rand() % 1000) / 1000.0));  // 0.2 .. 1.2 ms
    pressure_kernel<<<blocks, 128, 0, g_side>>>(g_scratch, g_scratch_n, ticks);
  }
  g_in_run = true;
  g_run_stream = g_cuda ? (void*)g_stream : nullptr;
  st_status s = g_prog.run(g_prog.p, r.in.data(), (int32_t)r.in.size(), r.out.data(), (int32_t)r.out.size(),
                           g_run_stream);
  g_in_run = false;
  return s;
}

bool program_ok(st_status s) {
  if (s == ST_OK) return true;
  reply("{\"ok\":false,\"status\":" + std::to_string((int)s) + ",\"error\":\"" +
        json_escape(std::string(st_status_name(s)) + ": " + st_last_error()) + "\"}");
  return false;
}

bool ready(const RunArgs& r) {
  if (!g_prog.p) {
    fail("no program instance (create first)");
    return false;
  }
  if (r.device && !use_cuda()) return false;
  return true;
}

void cmd_run(const std::vector<std::string>& a) {
  RunArgs r;
  if (!run_args(a, 1, &r)) return fail("run: expected N_IN TID.. N_OUT TID.. [pressure] [nosync]");
  if (!ready(r)) return;
  if (!program_ok(call_program(r))) return;
  if (!r.nosync && g_cuda && !cuda_ok(cudaStreamSynchronize(g_stream), "after the program's run")) return;
  ok();
}

void cmd_repeat(const std::vector<std::string>& a) {
  long long k;
  RunArgs r;
  if (a.size() < 2 || !parse_i64(a[1], &k) || k < 0 || !run_args(a, 2, &r)) return fail("repeat: expected K ARGS");
  if (!ready(r)) return;
  for (long long i = 0; i < k; ++i)
    if (!program_ok(call_program(r))) return;
  if (g_cuda && !cuda_ok(cudaStreamSynchronize(g_stream), "after the program's runs")) return;
  ok();
}

void cmd_time(const std::vector<std::string>& a) {
  long long flush;
  RunArgs r;
  if (a.size() < 2 || !parse_i64(a[1], &flush) || !run_args(a, 2, &r)) return fail("time: expected FLUSH ARGS");
  if (!ready(r) || !use_cuda()) return;
  static unsigned char value = 0;
  if (flush && !cuda_ok(cudaMemsetAsync(g_flush, ++value, g_flush_bytes, g_stream), "L2 flush")) return;
  if (!cuda_ok(cudaEventRecord(g_ev0, g_stream), "cudaEventRecord")) return;
  if (!program_ok(call_program(r))) return;
  if (!cuda_ok(cudaEventRecord(g_ev1, g_stream), "cudaEventRecord")) return;
  if (!cuda_ok(cudaEventSynchronize(g_ev1), "after the program's run")) return;
  float ms = 0.f;
  if (!cuda_ok(cudaEventElapsedTime(&ms, g_ev0, g_ev1), "cudaEventElapsedTime")) return;
  char b[64];
  snprintf(b, sizeof b, "\"ms\":%.6g", ms);
  ok(b);
}

void cmd_wall(const std::vector<std::string>& a) {
  RunArgs r;
  if (!run_args(a, 1, &r)) return fail("wall: expected ARGS");
  if (!ready(r) || !use_cuda()) return;
  if (!cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize")) return;
  auto t0 = std::chrono::steady_clock::now();
  if (!program_ok(call_program(r))) return;
  if (!cuda_ok(cudaDeviceSynchronize(), "after the program's run (device-wide)")) return;
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  char b[64];
  snprintf(b, sizeof b, "\"ms\":%.6g", ms);
  ok(b);
}

void cmd_wall_empty() {
  if (!use_cuda()) return;
  if (!cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize")) return;
  cudaGetLastError();  // only this launch's own error below
  auto t0 = std::chrono::steady_clock::now();
  empty_kernel<<<1, 32, 0, g_stream>>>();
  if (!cuda_ok(cudaGetLastError(), "the empty kernel's launch")) return;
  if (!cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize")) return;
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  char b[64];
  snprintf(b, sizeof b, "\"ms\":%.6g", ms);
  ok(b);
}

void drop_graph() {
  if (g_exec) cudaGraphExecDestroy(g_exec);
  if (g_graph) cudaGraphDestroy(g_graph);
  g_exec = nullptr;
  g_graph = nullptr;
}

void cmd_capture(const std::vector<std::string>& a) {
  RunArgs r;
  if (!run_args(a, 1, &r)) return fail("capture: expected ARGS");
  if (!ready(r) || !use_cuda()) return;
  drop_graph();
  if (!cuda_ok(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture")) return;
  st_status s = call_program(r);
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamEndCapture(g_stream, &graph);
  // Whatever the program did inside (a capture of its own refused, an allocation), the stream leaves
  // capture mode here: every later command runs it plainly.
  cudaStreamCaptureStatus still = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(g_stream, &still) == cudaSuccess && still != cudaStreamCaptureStatusNone) {
    cudaGraph_t dropped = nullptr;
    if (cudaStreamEndCapture(g_stream, &dropped) == cudaSuccess && dropped) cudaGraphDestroy(dropped);
  }
  cudaGetLastError();  // a capture that failed leaves its error for no later command to inherit
  if (s != ST_OK) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    program_ok(s);
    return;
  }
  if (!cuda_ok(e, "cudaStreamEndCapture")) return;
  g_graph = graph;
  if (!cuda_ok(cudaGraphInstantiate(&g_exec, g_graph, 0), "cudaGraphInstantiate")) return;
  size_t nodes = 0;
  cudaGraphGetNodes(g_graph, nullptr, &nodes);
  ok("\"nodes\":" + std::to_string(nodes));
}

void cmd_replay() {
  if (!g_exec) return fail("replay: nothing captured");
  if (!cuda_ok(cudaGraphLaunch(g_exec, g_stream), "cudaGraphLaunch")) return;
  if (!cuda_ok(cudaStreamSynchronize(g_stream), "after the graph's replay")) return;
  ok();
}

void cmd_copy(const std::vector<std::string>& a) {
  long long dst, src, bytes;
  if (a.size() != 4 || !parse_i64(a[1], &dst) || !parse_i64(a[2], &src) || !parse_i64(a[3], &bytes) ||
      !g_bufs.count((int)dst) || !g_bufs.count((int)src))
    return fail("copy: expected DST SRC BYTES of known buffers");
  Buffer& d = g_bufs[(int)dst];
  Buffer& s = g_bufs[(int)src];
  if ((size_t)bytes > d.bytes || (size_t)bytes > s.bytes) return fail("copy: more bytes than a buffer holds");
  if (!use_cuda()) return;
  if (!cuda_ok(cudaMemcpyAsync(d.ptr, s.ptr, (size_t)bytes, cudaMemcpyDefault, g_stream), "cudaMemcpyAsync")) return;
  ok();
}

void cmd_hold(const std::vector<std::string>& a) {
  long long us;
  if (a.size() != 2 || !parse_i64(a[1], &us) || us < 0) return fail("hold: expected microseconds");
  if (!use_cuda()) return;
  hold_kernel<<<1, 1, 0, g_stream>>>((long long)(us * 1e3 * g_clock_ghz));
  if (!cuda_ok(cudaGetLastError(), "hold kernel")) return;
  ok();
}

size_t proc_status_kb(const char* key) {
  FILE* f = fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  size_t kb = 0, n = strlen(key);
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, key, n) == 0) {
      kb = strtoull(line + n, nullptr, 10);
      break;
    }
  }
  fclose(f);
  return kb;
}

// The GEMM algorithms and convolution engines the runtime chose by timing in this process, and what
// they hold for (stitchrt/tuning.h): the Verifier writes them into the program folder's tuning file.
void cmd_tuning() {
  std::string parts[2];
  st_status (*fns[2])(char*, size_t, size_t*) = {st_tuning_export, st_tuning_identity};
  for (int i = 0; i < 2; ++i) {
    size_t n = 0;
    if (fns[i](nullptr, 0, &n) != ST_OK) return fail(std::string("tuning: ") + st_last_error());
    std::vector<char> buf(n + 1);
    if (fns[i](buf.data(), buf.size(), &n) != ST_OK) return fail(std::string("tuning: ") + st_last_error());
    if (n >= buf.size()) return fail("tuning: the text grew while it was read");
    parts[i].assign(buf.data(), n);
  }
  ok("\"text\":\"" + json_escape(parts[0]) + "\",\"identity\":\"" + json_escape(parts[1]) + "\"");
}

void cmd_memory() {
  size_t free_b = 0, total_b = 0;
  if (g_cuda && !cuda_ok(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo")) return;
  size_t cached = 0, live = 0;
  int pinning = 0;
  static auto pool = next_fn<st_status (*)(size_t*, size_t*, int*)>("st_host_pool_stats");
  pool(&cached, &live, &pinning);
  char b[256];
  snprintf(b, sizeof b, "\"device_free\":%zu,\"device_total\":%zu,\"rss\":%zu,\"pinned\":%zu,\"pool_live\":%zu",
           free_b, total_b, proc_status_kb("VmRSS:") * 1024, proc_status_kb("VmPin:") * 1024, live);
  ok(b);
}

void cmd_calls() {
  std::lock_guard<std::mutex> lock(g_log_mu);
  std::string s = "\"calls\":[";
  bool first = true;
  for (auto& kv : g_calls) {
    if (!first) s += ",";
    first = false;
    s += "{\"fn\":\"" + kv.first.fn + "\",\"policy\":" + std::to_string(kv.first.policy) + ",\"dtypes\":\"" +
         kv.first.dtypes + "\",\"count\":" + std::to_string(kv.second) + "}";
  }
  s += "],\"foreign_stream\":" + std::to_string(g_foreign) + ",\"foreign_first\":\"" + json_escape(g_foreign_first) +
       "\"";
  g_calls.clear();
  g_foreign = 0;
  g_foreign_first.clear();
  ok(s);
}

void cmd_create(const std::vector<std::string>& a) {
  long long device;
  size_t at = 2;
  std::vector<st_tensor> w;
  if (a.size() < 3 || !parse_i64(a[1], &device) || !tensors(a, &at, &w) || at != a.size())
    return fail("create: expected DEVICE N TID..");
  if (g_prog.p) return fail("create: an instance exists");
  if (g_cuda && (int)device != g_device) return fail("create: the runner was started on another device");
  g_device = (int)device;
  bool dev = false;
  for (auto& t : w) dev |= t.device_type == ST_DEVICE_CUDA;
  if (dev && !use_cuda()) return;
  st_program* p = nullptr;
  if (!program_ok(g_prog.create(w.data(), (int32_t)w.size(), (int32_t)device, &p))) return;
  g_prog.p = p;
  if (g_cuda && !cuda_ok(cudaDeviceSynchronize(), "after create")) return;
  ok();
}

int serve(FILE* in) {
  std::string line;
  char buf[1 << 16];
  while (fgets(buf, sizeof buf, in)) {
    line += buf;
    if (line.empty() || line.back() != '\n') continue;
    std::vector<std::string> a = split(line);
    line.clear();
    if (a.empty()) continue;
    const std::string& c = a[0];
    if (c == "token" && a.size() == 2) {
      g_token = a[1];
      continue;
    }
    if (c == "hello") ok("\"abi\":" + std::to_string(g_prog.abi()) + ",\"runner\":\"" STITCH_RUNNER_HASH "\"");
    else if (c == "buf") cmd_buf(a);
    else if (c == "readback") cmd_readback(a);
    else if (c == "free") {
      long long id;
      if (a.size() == 2 && parse_i64(a[1], &id)) drop_buffer((int)id);
      ok();
    } else if (c == "tensor") cmd_tensor(a);
    else if (c == "create") cmd_create(a);
    else if (c == "run") cmd_run(a);
    else if (c == "repeat") cmd_repeat(a);
    else if (c == "time") cmd_time(a);
    else if (c == "wall") cmd_wall(a);
    else if (c == "wall_empty") cmd_wall_empty();
    else if (c == "capture") cmd_capture(a);
    else if (c == "replay") cmd_replay();
    else if (c == "drop_graph") {
      drop_graph();
      ok();
    } else if (c == "copy") cmd_copy(a);
    else if (c == "hold") cmd_hold(a);
    else if (c == "sync") {
      if (!g_cuda || cuda_ok(cudaStreamSynchronize(g_stream), "cudaStreamSynchronize")) ok();
    } else if (c == "syncall") {
      if (!g_cuda || cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize")) ok();
    } else if (c == "memory") cmd_memory();
    else if (c == "tuning") cmd_tuning();
    else if (c == "calls") cmd_calls();
    else if (c == "destroy") {
      if (g_prog.p) g_prog.destroy(g_prog.p);
      g_prog.p = nullptr;
      ok();
    } else if (c == "quit") {
      ok();
      return 0;
    } else {
      fail("unknown command " + c);
    }
  }
  return 0;
}

template <class F>
bool sym(const char* name, F* out, std::string* err) {
  void* s = dlsym(g_prog.lib, name);
  if (!s) {
    *err = std::string("the program does not export ") + name;
    return false;
  }
  *out = reinterpret_cast<F>(s);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const char* program = nullptr;
  int in_fd = 0, out_fd = 1, host_fd = -1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--version") {
      printf("stitch-runner %s\n", STITCH_RUNNER_HASH);
      return 0;
    }
    if (i + 1 >= argc) break;
    if (a == "--program") program = argv[++i];
    else if (a == "--in") in_fd = atoi(argv[++i]);
    else if (a == "--out") out_fd = atoi(argv[++i]);
    else if (a == "--host-fd") host_fd = atoi(argv[++i]);
    else if (a == "--device") g_device = atoi(argv[++i]);
  }
  if (!program) {
    fprintf(stderr, "usage: stitch-runner --program LIB [--in FD] [--out FD] [--host-fd FD]\n");
    return 2;
  }
  // Dies with whoever started it (the Verifier's child, or compute-sanitizer): a parent killed by a
  // signal runs no cleanup, and a runner left behind keeps the GPU busy for the next verification.
  const pid_t parent = getppid();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) return 3;  // the parent is already gone
  srand((unsigned)std::chrono::steady_clock::now().time_since_epoch().count());
  FILE* in = fdopen(in_fd, "r");
  g_out = fdopen(out_fd, "w");
  if (!in || !g_out) {
    fprintf(stderr, "stitch-runner: cannot open the command pipes\n");
    return 2;
  }
  if (host_fd >= 0) {
    struct stat st;
    if (fstat(host_fd, &st) != 0) {
      fprintf(stderr, "stitch-runner: cannot read the host file\n");
      return 2;
    }
    g_host_bytes = (size_t)st.st_size;
    if (g_host_bytes) {
      void* m = mmap(nullptr, g_host_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, host_fd, 0);
      if (m == MAP_FAILED) {
        fprintf(stderr, "stitch-runner: cannot map the host file\n");
        return 2;
      }
      g_host = static_cast<char*>(m);
    }
  }
  std::string err;
  if (!dlsym(RTLD_NEXT, "st_gemm")) err = "libstitchrt is not loaded beside the runner";
  if (err.empty()) g_prog.lib = dlopen(program, RTLD_NOW | RTLD_LOCAL);
  if (err.empty() && !g_prog.lib) {
    const char* e = dlerror();
    err = std::string("cannot load the program: ") + (e ? e : "dlopen failed");
  }
  if (err.empty()) {
    sym("st_program_abi_version", &g_prog.abi, &err) && sym("st_program_manifest", &g_prog.manifest, &err) &&
        sym("st_program_create", &g_prog.create, &err) && sym("st_program_run", &g_prog.run, &err) &&
        sym("st_program_destroy", &g_prog.destroy, &err);
  }
  if (err.empty() && g_prog.abi() != ST_PROGRAM_ABI_VERSION) err = "the program speaks another ABI version";
  if (!err.empty()) {
    // Answer every command with the load error: the Verifier reads it as the candidate's.
    char buf[1 << 16];
    while (fgets(buf, sizeof buf, in)) {
      std::vector<std::string> a = split(buf);
      if (a.size() == 2 && a[0] == "token") {
        g_token = a[1];
        continue;
      }
      reply("{\"ok\":false,\"load\":\"" + json_escape(err) + "\"}");
      if (!a.empty() && a[0] == "quit") break;
    }
    return 3;
  }
  int rc = serve(in);
  fflush(g_out);
  _exit(rc);  // no destructors of a program that may have wrecked its context
}
