// Schedules of the MoE layer: traces, ordering edges, policies, validation (being written).
#include <gtest/gtest.h>
