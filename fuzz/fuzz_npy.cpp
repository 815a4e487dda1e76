// libFuzzer target: any byte string as an .npy file. parse_npy must either give an array whose values match
// its shape or throw IoError; anything else (another exception, a sanitizer report) is a bug. The seeds in
// fuzz/corpus/npy/ have no .npy extension (the repository ignores *.npy files); empty_0x64 is the array with
// no values that once passed a null pointer to memcpy.
#include <cstddef>
#include <cstdint>

#include "io/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moe::FloatArray a;
  try {
    a = moe::parse_npy(data, size, "fuzz.npy");
  } catch (const moe::IoError&) {
    return 0;
  }
  uint64_t n = 1;
  for (int64_t d : a.shape) {
    if (d < 0) __builtin_trap();
    n *= static_cast<uint64_t>(d);
  }
  // Every value comes from the input: at least 2 bytes each ('<u2'), after a 10-byte prefix.
  if (a.values.size() != n || 10 + 2 * n > size) __builtin_trap();
  return 0;
}
