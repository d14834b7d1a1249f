// tuning.hpp — choices by measurement kept across processes (stitchrt/tuning.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace st {

struct TunedChoice {
  int64_t index = 0;  // position of the chosen candidate in the library's ranked list
  int64_t split = 0;  // GEMM with GELU: the epilogue applied by the runtime's kernel
};

// A plan key as its int64 words (PlanKey, ConvKey: int64 fields only).
template <class Key>
const int64_t* key_words(const Key& k, size_t* n) {
  static_assert(sizeof(Key) % sizeof(int64_t) == 0, "a plan key is int64 words");
  *n = sizeof(Key) / sizeof(int64_t);
  return reinterpret_cast<const int64_t*>(&k);
}

// What a plan chose by timing: kept for st_tuning_export.
void tuning_record(char kind, const int64_t* words, size_t n, TunedChoice c);
// An imported choice for this key, if any (one this process timed itself is not taken again: a plan
// of another context times its own, under its own workspace).
bool tuning_lookup(char kind, const int64_t* words, size_t n, TunedChoice* out);
std::string tuning_export();
size_t tuning_import(const std::string& text);
void tuning_clear();

}  // namespace st
