// The process's memory mappings, which Linux bounds (vm.max_map_count, 65530
// by default). Every executable the CPU plugin loads maps its generated code
// in several pieces (an op with a 7x7x7 window: ~2,000 mappings), and at the
// bound the next mmap fails: the plugin then aborts when it cannot start a
// thread. The program cache evicts by this pressure (program_cache.cpp).
#pragma once

#include <cstdint>

namespace torch_pjrt::runtime {

// Mappings of this process now (lines of /proc/self/maps; -1 if unreadable).
// Costs ~0.4 us per mapping.
int64_t process_mappings();
// vm.max_map_count (65530 when unreadable).
int64_t mapping_limit();

}  // namespace torch_pjrt::runtime
