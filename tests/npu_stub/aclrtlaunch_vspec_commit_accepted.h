// Stand-in of the launch header CANN's ascendc_library generates for a kernel.
#pragma once
#include <cstdint>
#include "acl/acl.h"
#define ACLRT_LAUNCH_KERNEL(kernel) aclrtlaunch_##kernel
uint32_t aclrtlaunch_vspec_commit_accepted(uint32_t blockDim, aclrtStream stream, void* sampled,
                                           void* discard, void* backup, void* num_valid,
                                           void* next_token, int32_t batch, int32_t width,
                                           int32_t vocab_size, int32_t rows_per_core,
                                           int32_t tile_rows);
