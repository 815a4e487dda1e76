// libFuzzer target: any byte string as config.json. Parsing must either give a valid config or throw
// ConfigError; an accepted config must also survive being written back and re-parsed.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "io/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moe::MoeConfig c;
  try {
    c = moe::parse_hf_config(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz/config.json");
  } catch (const moe::ConfigError&) {
    return 0;
  }
  for (int64_t l = 0; l < c.num_layers && l < 256; ++l) (void)c.is_moe_layer(l);
  try {
    const moe::MoeConfig back = moe::parse_hf_config(moe::hf_config_json(c), "round-trip");
    if (back.num_experts != c.num_experts || back.top_k != c.top_k || back.hidden != c.hidden) __builtin_trap();
  } catch (const moe::ConfigError&) {
    // Some accepted configs have no config.json spelling (e.g. a shared width not a multiple of I).
  }
  return 0;
}
