/* stitchrt/tuning.h — the runtime's choices by measurement, kept across processes.
 *
 * The first call of a GEMM or a convolution of a new shape times its candidates (cuBLASLt's
 * heuristic algorithms, cuDNN's engines) and keeps the fastest in the stream's plan cache; that
 * choice dies with the process. These calls let a loader carry it: export the choices this process
 * made, as text, and import them into another before its first call, which then takes the
 * imported choice instead of timing (a choice this process timed itself is exported, never taken again
 * without timing). A choice is the position of the chosen candidate in the
 * library's own ranked list for that plan key (and, for a GELU GEMM, whether the epilogue is
 * split): meaningful only with the same GPU, library versions and workspace, which the file's
 * header records and the loader checks (stitchcuda.tuning). An index past the end of the list is
 * ignored and the plan is timed as without it.
 *
 * Text: one choice a line, "<kind> <split> <index> <key words...>" (kind g: GEMM, c: convolution,
 * s: whether a split-TF32 convolution beats the fp32 one, index 1 or 0; the key's int64 words in
 * decimal); lines that do not parse are skipped. For loaders (the
 * Program class, a wheel's loader), not for programs. */
#ifndef STITCHRT_TUNING_H_
#define STITCHRT_TUNING_H_

#include <stddef.h>

#include "stitchrt/stitchrt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The choices timed or imported in this process, as text. *len: the text's length (without the
 * terminating NUL); the text is written when cap > *len. */
ST_API st_status st_tuning_export(char* buf, size_t cap, size_t* len);
/* Take the choices of `text` (NUL-terminated); *taken: how many lines were taken. */
ST_API st_status st_tuning_import(const char* text, size_t* taken);
/* Forget every imported and recorded choice (plans already made stay). */
ST_API st_status st_tuning_clear(void);
/* What a choice is valid for, as one line: the current device's compute capability, SM count and
 * memory, the cuBLASLt and cuDNN versions loaded, the default workspace. Same contract as export. */
ST_API st_status st_tuning_identity(char* buf, size_t cap, size_t* len);

#ifdef __cplusplus
}
#endif

#endif  /* STITCHRT_TUNING_H_ */
