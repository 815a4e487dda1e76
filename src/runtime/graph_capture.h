// Internal: the hooks through which the public Stream calls reach graph capture (graph.cpp). A stream that
// is being captured appends nodes instead of enqueueing work.
#pragma once

#include <memory>

#include "runtime/stream_impl.h"

namespace moe::rt {

void capture_launch(DeviceCore& core, const std::shared_ptr<StreamImpl>& s, Op&& op);
void capture_record(DeviceCore& core, const std::shared_ptr<StreamImpl>& s, EventImpl& event);
// A wait where the stream is capturing or the event was recorded inside a capture (or both).
void capture_wait(DeviceCore& core, const std::shared_ptr<StreamImpl>& s, const EventBinding& binding);

}  // namespace moe::rt
