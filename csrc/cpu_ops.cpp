// CPU reference of the vspec ops (schema and semantics in ops.h), and the
// op registration shared by every backend.
#include "ops.h"

#include <torch/library.h>

namespace vspec {

void check_gamma(int64_t gamma) {
  TORCH_CHECK(gamma >= 0 && 1 + gamma <= kMaxVerifyWidth, "gamma=", gamma,
              " is not allowed: an integer in [0, ", kMaxVerifyWidth - 1, "] (1 + gamma <= ",
              kMaxVerifyWidth, ")");
}

void check_commit_args(const at::Tensor& sampled, const at::Tensor& seq_lens) {
  TORCH_CHECK(sampled.dim() == 2 && sampled.scalar_type() == at::kLong,
              "sampled must be int64 [B, 1 + gamma], got ", sampled.scalar_type(), " ",
              sampled.sizes());
  check_gamma(sampled.size(1) - 1);
  TORCH_CHECK(seq_lens.dim() == 1 && seq_lens.size(0) == sampled.size(0) &&
                  seq_lens.scalar_type() == at::kInt,
              "seq_lens must be int32 [B] with B=", sampled.size(0), ", got ",
              seq_lens.scalar_type(), " ", seq_lens.sizes());
}

std::tuple<at::Tensor, at::Tensor> uniform_spec_metadata_cpu(const at::Tensor& seq_lens,
                                                             int64_t gamma) {
  check_gamma(gamma);
  TORCH_CHECK(seq_lens.dim() == 1 && seq_lens.scalar_type() == at::kInt,
              "seq_lens must be int32 [B], got ", seq_lens.scalar_type(), " ", seq_lens.sizes());
  const int64_t batch = seq_lens.size(0);
  const int64_t width = 1 + gamma;
  auto lens = seq_lens.contiguous();
  auto query_start_loc = at::empty({batch + 1}, lens.options());
  auto positions = at::empty({batch * width}, lens.options());
  const int32_t* in = lens.data_ptr<int32_t>();
  int32_t* qsl = query_start_loc.data_ptr<int32_t>();
  int32_t* pos = positions.data_ptr<int32_t>();
  for (int64_t b = 0; b <= batch; ++b) qsl[b] = static_cast<int32_t>(b * width);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t j = 0; j < width; ++j) pos[b * width + j] = in[b] + static_cast<int32_t>(j);
  return {query_start_loc, positions};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> commit_accepted_cpu(const at::Tensor& sampled,
                                                                   const at::Tensor& seq_lens) {
  check_commit_args(sampled, seq_lens);
  const int64_t batch = sampled.size(0);
  const int64_t width = sampled.size(1);
  auto ids = sampled.contiguous();
  auto lens = seq_lens.contiguous();
  auto num_accepted = at::empty({batch}, lens.options());
  auto next_token = at::empty({batch}, ids.options());
  auto new_seq_lens = at::empty({batch}, lens.options());
  const int64_t* in = ids.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    int64_t n = 0;
    while (n < width && in[b * width + n] >= 0) ++n;
    // The sampler always emits at least one token; a row of -1 is a caller bug.
    TORCH_CHECK(n >= 1, "sampled row ", b, " has no committed token (all -1)");
    num_accepted.data_ptr<int32_t>()[b] = static_cast<int32_t>(n);
    next_token.data_ptr<int64_t>()[b] = in[b * width + n - 1];
    new_seq_lens.data_ptr<int32_t>()[b] = lens.data_ptr<int32_t>()[b] + static_cast<int32_t>(n);
  }
  return {num_accepted, next_token, new_seq_lens};
}

}  // namespace vspec

TORCH_LIBRARY(vspec, m) {
  m.def("uniform_spec_metadata(Tensor seq_lens, int gamma) -> (Tensor, Tensor)");
  m.def("commit_accepted(Tensor sampled, Tensor seq_lens) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(vspec, CPU, m) {
  m.impl("uniform_spec_metadata", &vspec::uniform_spec_metadata_cpu);
  m.impl("commit_accepted", &vspec::commit_accepted_cpu);
}
