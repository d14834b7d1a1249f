/* graph.h — the CUDA-graph runner programs use to replay their runs.
 *
 * A program hands the runtime a body (a function that enqueues one run's work on a stream) and
 * the device addresses that run touches; the runner decides whether to run the body eagerly,
 * capture it into a CUDA graph, or replay a graph captured before:
 *
 *   - The first sighting of (device, stream, key) runs eagerly: that run builds (and autotunes)
 *     the GEMM and convolution plans and sizes the arena, which cannot happen during a capture.
 *   - The second sighting is captured (thread-local capture mode), instantiated and launched.
 *   - Later sightings replay the graph.
 *   - The legacy default stream (NULL or cudaStreamLegacy) cannot be captured: its runs go through
 *     a stream of the runtime's own (one per device), which waits for the legacy stream's work
 *     before the run while the legacy stream waits for the run before its next (two events), and
 *     are captured and replayed there as above; where that stream cannot be made, they run eagerly.
 *   - A stream the caller is already capturing (our work joins the caller's graph) and a cache
 *     whose graphs are off run eagerly.
 *   - A failed capture (begin, the body itself, end or instantiate) runs nothing: the body is
 *     then run for real, eagerly, and graphs are turned off for that cache from then on.
 *   - The key is addresses only: a graph holds the work of a run, never its results; a key with
 *     other addresses is another entry. `slots` entries are kept, least recently used replaced.
 *
 * Thread-safe: one mutex per cache, held while a run is chosen, run eagerly or captured (so two
 * threads never capture the same entry twice). Every entry point validates its arguments before
 * any device work and returns ST_ERR_INVALID_ARGUMENT with a message (st_last_error()) otherwise.
 */
#ifndef STITCHRT_GRAPH_H
#define STITCHRT_GRAPH_H

#include "stitchrt/stitchrt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct st_graph_cache st_graph_cache;

/* One run's work, enqueued on `stream` (a cudaStream_t); returns ST_OK or the failure. */
typedef st_status (*st_graph_body_fn)(void* ctx, void* stream);

ST_API st_status st_graph_cache_create(int32_t slots, st_graph_cache** out);
/* Destroys the cache's graphs. NULL is a no-op. Call it with the program's device current. */
ST_API void st_graph_cache_destroy(st_graph_cache* g);

/* Run body(ctx, stream) for the addresses key[0..n_key), as described above. Returns the body's
 * status (eager runs) or the status of the graph launch. */
ST_API st_status st_graph_run(st_graph_cache* g, void* stream, const void* const* key, int32_t n_key,
                              st_graph_body_fn body, void* ctx);

/* Runs so far: eager (any reason), captures (graphs captured, instantiated and launched), replays
 * (launches of a graph captured before). Any output pointer may be NULL. */
ST_API st_status st_graph_cache_stats(const st_graph_cache* g, int64_t* eager, int64_t* captures, int64_t* replays);

#ifdef __cplusplus
}
#endif

#endif /* STITCHRT_GRAPH_H */
