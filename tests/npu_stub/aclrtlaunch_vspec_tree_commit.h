// Stand-in of the launch header CANN's ascendc_library generates for a kernel.
#pragma once
#include <cstdint>
#include "acl/acl.h"
#ifndef ACLRT_LAUNCH_KERNEL
#define ACLRT_LAUNCH_KERNEL(kernel) aclrtlaunch_##kernel
#endif
uint32_t aclrtlaunch_vspec_tree_commit(uint32_t blockDim, aclrtStream stream, void* path,
                                       void* target_tokens, void* slots, void* seq_lens,
                                       void* new_seq_lens, void* next_token, void* src_slots,
                                       void* dst_slots, int32_t batch, int32_t depth,
                                       int32_t nodes, int32_t rows_per_core, int32_t tile_rows);
