// libFuzzer target: any byte string as a whole safetensors file. The parser must either accept it or throw
// IoError; anything else (another exception, a sanitizer report) is a bug.
#include <cstddef>
#include <cstdint>

#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const moe::SafetensorsHeader h = moe::parse_safetensors(data, size, "fuzz.safetensors");
    // An accepted header must describe bytes inside the input.
    for (const auto& t : h.tensors)
      if (h.data_start + t.end > size || t.begin > t.end) __builtin_trap();
  } catch (const moe::IoError&) {
  }
  return 0;
}
