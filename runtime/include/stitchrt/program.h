/* program.h — the C ABI every stitchcuda program exports.
 *
 * A program is a shared library built from generated (or hand-written) CUDA C++ that calls
 * libstitchrt. The host that loads it (stitchcuda.Program, or any C/C++ application) does:
 *
 *     manifest = st_program_manifest();             // JSON: inputs, outputs, weights, precision
 *     st_program_create(weights, n, device, &p);    // weights in manifest order, host or device
 *     st_program_run(p, inputs, n_in, outputs, n_out, stream);   // any number of times
 *     st_program_destroy(p);
 *
 * Tensors cross the ABI as plain descriptors. A program checks every descriptor against its
 * manifest and fails with ST_ERR_INVALID_ARGUMENT (message in st_last_error()) when one
 * differs: shapes are specialised to the example inputs the program was built for.
 * Outputs are written by the program into buffers the caller owns; the run is asynchronous on
 * the given stream.
 */
#ifndef STITCHRT_PROGRAM_H
#define STITCHRT_PROGRAM_H

#include "stitchrt/graph.h"
#include "stitchrt/stitchrt.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ST_PROGRAM_ABI_VERSION 1
#define ST_MAX_DIMS 8

typedef enum st_device_type { ST_DEVICE_HOST = 1, ST_DEVICE_CUDA = 2 } st_device_type;

typedef struct st_tensor {
  void* data;
  st_dtype dtype;
  int32_t ndim;
  int64_t shape[ST_MAX_DIMS];
  int64_t strides[ST_MAX_DIMS]; /* in elements */
  st_device_type device_type;
  int32_t device_id;
} st_tensor;

typedef struct st_program st_program;

/* Every program defines these five symbols. */
typedef int (*st_program_abi_version_fn)(void);
typedef const char* (*st_program_manifest_fn)(void);
typedef st_status (*st_program_create_fn)(const st_tensor* weights, int32_t n_weights,
                                          int32_t device, st_program** out);
typedef st_status (*st_program_run_fn)(st_program* p, const st_tensor* inputs, int32_t n_inputs,
                                       const st_tensor* outputs, int32_t n_outputs, void* stream);
typedef void (*st_program_destroy_fn)(st_program* p);

/* Helpers for programs: check a descriptor against an expected dense spec. On mismatch they
 * set the thread's last error to a message naming `what` and the expected spec. */
ST_API st_status st_check_tensor(const st_tensor* t, const char* what, st_dtype dtype, int32_t ndim,
                                 const int64_t* shape, int require_contiguous, st_device_type device);
ST_API void st_set_error(st_status status, const char* message);

#ifdef __cplusplus
}
#endif

#endif /* STITCHRT_PROGRAM_H */
