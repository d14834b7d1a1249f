// graph.cpp — the CUDA-graph runner of stitchrt/graph.h: eager on first sight, captured on the
// second, replayed after; eager whenever a graph cannot be captured; the legacy default stream's
// runs by way of a stream of the runtime's own.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "error.hpp"
#include "stitchrt/graph.h"

struct st_graph_cache {
  // One captured run: the device, stream and addresses it was seen with.
  struct Slot {
    int device = -1;
    cudaStream_t stream = nullptr;
    std::vector<const void*> key;
    cudaGraphExec_t exec = nullptr;  // null: seen once and run eagerly, not captured yet
    uint64_t last_use = 0;
    bool used = false;
  };
  std::vector<Slot> slots;
  uint64_t tick = 0;
  std::atomic<bool> graphs_off{false};  // a capture failed: run eagerly from then on
  std::atomic<int64_t> eager{0}, captures{0}, replays{0};
  std::mutex mu;
};

namespace {

using st::guarded;

bool is_legacy_stream(cudaStream_t s) { return s == nullptr || s == cudaStreamLegacy; }

// The legacy default stream cannot be captured, and a run launched there kernel by kernel is bound
// by the host's launches. Its runs go through a stream of the runtime's own, one per device: that
// stream waits for the legacy stream's work before the run, the legacy stream waits for the run
// before anything after it (two events), so the caller sees legacy-stream order while the run is
// captured and replayed as on any stream. One mutex keeps the pair of waits and the run together
// when several threads use the legacy stream.
struct LegacyDetour {
  cudaStream_t stream = nullptr;
  cudaEvent_t before = nullptr, after = nullptr;
};

std::mutex& legacy_mutex() {
  static std::mutex mu;
  return mu;
}

// The device's detour (made on first use; never destroyed: it lives as long as the process's
// CUDA context), or null where one cannot be made (then the run is eager on the legacy stream).
LegacyDetour* legacy_detour(int device) {
  static std::vector<LegacyDetour*> detours;
  if (device < 0) return nullptr;
  if (detours.size() <= static_cast<size_t>(device)) detours.resize(static_cast<size_t>(device) + 1, nullptr);
  if (!detours[device]) {
    auto* d = new LegacyDetour();
    if (cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&d->before, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&d->after, cudaEventDisableTiming) != cudaSuccess) {
      cudaGetLastError();
      if (d->stream) cudaStreamDestroy(d->stream);
      if (d->before) cudaEventDestroy(d->before);
      delete d;
      return nullptr;
    }
    detours[device] = d;
  }
  return detours[device];
}

// The body's status, counted as an eager run. The body reports its own failures (its message is
// the thread's last error).
st_status run_eagerly(st_graph_cache* g, st_graph_body_fn body, void* ctx, cudaStream_t stream) {
  g->eager.fetch_add(1, std::memory_order_relaxed);
  return body(ctx, stream);
}

bool same_key(const st_graph_cache::Slot& s, int device, cudaStream_t stream, const void* const* key, int32_t n) {
  if (!s.used || s.device != device || s.stream != stream || s.key.size() != static_cast<size_t>(n)) return false;
  for (int32_t i = 0; i < n; ++i)
    if (s.key[i] != key[i]) return false;
  return true;
}

}  // namespace

extern "C" {

st_status st_graph_cache_create(int32_t slots, st_graph_cache** out) {
  return guarded([&] {
    ST_REQUIRE(out, "st_graph_cache_create: out is null");
    *out = nullptr;
    ST_REQUIRE(slots >= 1, "st_graph_cache_create: slots must be >= 1, got ", slots);
    auto* g = new st_graph_cache();
    g->slots.resize(static_cast<size_t>(slots));
    *out = g;
  });
}

void st_graph_cache_destroy(st_graph_cache* g) {
  if (!g) return;
  for (auto& s : g->slots)
    if (s.exec) cudaGraphExecDestroy(s.exec);
  cudaGetLastError();  // a failed destroy at teardown is not worth a sticky error
  delete g;
}

st_status st_graph_cache_stats(const st_graph_cache* g, int64_t* eager, int64_t* captures, int64_t* replays) {
  return guarded([&] {
    ST_REQUIRE(g, "st_graph_cache_stats: cache is null");
    if (eager) *eager = g->eager.load();
    if (captures) *captures = g->captures.load();
    if (replays) *replays = g->replays.load();
  });
}

st_status st_graph_run(st_graph_cache* g, void* stream_arg, const void* const* key, int32_t n_key,
                       st_graph_body_fn body, void* ctx) {
  // Arguments first, before any device work.
  {
    const st_status s = guarded([&] {
      ST_REQUIRE(g, "st_graph_run: cache is null");
      ST_REQUIRE(body, "st_graph_run: body is null");
      ST_REQUIRE(n_key >= 0, "st_graph_run: n_key must be >= 0, got ", n_key);
      ST_REQUIRE(key || n_key == 0, "st_graph_run: key is null but n_key is ", n_key);
    });
    if (s != ST_OK) return s;
  }
  const auto stream = static_cast<cudaStream_t>(stream_arg);
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  int device = -1;
  if (is_legacy_stream(stream) && !g->graphs_off.load() && cudaGetDevice(&device) == cudaSuccess) {
    std::lock_guard<std::mutex> detour_lock(legacy_mutex());
    LegacyDetour* d = legacy_detour(device);
    if (d && cudaEventRecord(d->before, stream) == cudaSuccess && cudaStreamWaitEvent(d->stream, d->before, 0) == cudaSuccess) {
      const st_status s = st_graph_run(g, d->stream, key, n_key, body, ctx);
      // the legacy stream waits for the run whatever its status (an eager run may have enqueued work)
      if (cudaEventRecord(d->after, d->stream) != cudaSuccess || cudaStreamWaitEvent(stream, d->after, 0) != cudaSuccess) {
        cudaGetLastError();
        cudaStreamSynchronize(d->stream);  // the order the caller is owed, the slow way
      }
      return s;
    }
    cudaGetLastError();
  }
  if (is_legacy_stream(stream) || g->graphs_off.load() || cudaStreamIsCapturing(stream, &capturing) != cudaSuccess ||
      capturing != cudaStreamCaptureStatusNone || cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return run_eagerly(g, body, ctx, stream);
  }
  std::lock_guard<std::mutex> lock(g->mu);
  st_graph_cache::Slot* slot = nullptr;
  for (auto& s : g->slots)
    if (same_key(s, device, stream, key, n_key)) slot = &s;
  if (slot && slot->exec) {
    slot->last_use = ++g->tick;
    g->replays.fetch_add(1, std::memory_order_relaxed);
    return guarded([&] { ST_CUDA_CHECK(cudaGraphLaunch(slot->exec, stream)); });
  }
  if (!slot) {
    // First sighting: remember the addresses in the least recently used slot and run eagerly.
    slot = &g->slots[0];
    for (auto& s : g->slots)
      if (!s.used || (slot->used && s.last_use < slot->last_use)) slot = &s;
    if (slot->exec) cudaGraphExecDestroy(slot->exec);
    slot->exec = nullptr;
    slot->used = true;
    slot->device = device;
    slot->stream = stream;
    slot->key.assign(key, key + n_key);
    slot->last_use = ++g->tick;
    return run_eagerly(g, body, ctx, stream);
  }
  // Second sighting: capture. Nothing runs during a capture, so whatever goes wrong in it, the
  // body is then run for real, eagerly, and graphs stay off for this cache.
  slot->last_use = ++g->tick;
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    g->graphs_off.store(true);
    return run_eagerly(g, body, ctx, stream);
  }
  cudaGraph_t graph = nullptr;
  const st_status s = body(ctx, stream);
  const cudaError_t e = cudaStreamEndCapture(stream, &graph);
  if (s != ST_OK || e != cudaSuccess || graph == nullptr || cudaGraphInstantiate(&slot->exec, graph, 0) != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    slot->exec = nullptr;
    g->graphs_off.store(true);
    return run_eagerly(g, body, ctx, stream);
  }
  cudaGraphDestroy(graph);
  g->captures.fetch_add(1, std::memory_order_relaxed);
  return guarded([&] { ST_CUDA_CHECK(cudaGraphLaunch(slot->exec, stream)); });
}

}  // extern "C"
