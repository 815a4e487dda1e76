// The error type of the file formats (safetensors, index, npy, checkpoints). what() names the file, the tensor
// or field when there is one, and what was expected. config.json errors are ConfigError (model/config.h).
#pragma once

#include <stdexcept>
#include <string>

namespace moe {

class IoError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace moe
