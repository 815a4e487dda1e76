// Graph capture and replay (placeholder until graph mode lands).
#include <stdexcept>

#include "runtime/graph_capture.h"

namespace moe::rt {

void capture_launch(DeviceCore&, const std::shared_ptr<StreamImpl>&, Op&&) {
  throw std::logic_error("graph capture is not implemented yet");
}
void capture_record(DeviceCore&, const std::shared_ptr<StreamImpl>&, EventImpl&) {
  throw std::logic_error("graph capture is not implemented yet");
}
void capture_wait(DeviceCore&, const std::shared_ptr<StreamImpl>&, const EventBinding&) {
  throw std::logic_error("graph capture is not implemented yet");
}

}  // namespace moe::rt
