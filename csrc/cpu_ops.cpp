// CPU reference of the vspec ops (schema and semantics in ops.h), the shared
// argument checks, and the op registration every backend shares.
#include "ops.h"

#include <torch/library.h>

namespace vspec {
namespace {

void check_int32_vector(const at::Tensor& t, const char* name, int64_t batch) {
  TORCH_CHECK(t.dim() == 1 && t.size(0) == batch && t.scalar_type() == at::kInt, name,
              " must be int32 [B] with B=", batch, ", got ", t.scalar_type(), " ", t.sizes());
}

void check_width(int64_t width, const char* what) {
  TORCH_CHECK(width >= 1 && width <= kMaxCommitWidth, what, "=", width,
              " is not allowed: an integer in [1, ", kMaxCommitWidth, "]");
}

}  // namespace

void check_commit_accepted_args(const at::Tensor& sampled, const at::Tensor& discard,
                                const at::Tensor& backup, int64_t vocab_size) {
  TORCH_CHECK(sampled.dim() == 2 && sampled.scalar_type() == at::kInt,
              "sampled must be int32 [B, W], got ", sampled.scalar_type(), " ", sampled.sizes());
  check_width(sampled.size(1), "sampled width W");
  const int64_t batch = sampled.size(0);
  TORCH_CHECK(discard.dim() == 1 && discard.size(0) == batch && discard.scalar_type() == at::kBool,
              "discard must be bool [B] with B=", batch, ", got ", discard.scalar_type(), " ",
              discard.sizes());
  check_int32_vector(backup, "backup", batch);
  TORCH_CHECK(vocab_size >= 1 && vocab_size <= INT32_MAX, "vocab_size=", vocab_size,
              " is not allowed: an integer in [1, ", INT32_MAX, "]");
}

void check_tree_commit_args(const at::Tensor& path, const at::Tensor& target_tokens,
                            const at::Tensor& slots, const at::Tensor& seq_lens) {
  TORCH_CHECK(path.dim() == 2 && path.scalar_type() == at::kInt,
              "path must be int32 [B, D], got ", path.scalar_type(), " ", path.sizes());
  check_width(path.size(1), "path depth D");
  const int64_t batch = path.size(0);
  TORCH_CHECK(target_tokens.dim() == 2 && target_tokens.size(0) == batch &&
                  target_tokens.size(1) >= 1 && target_tokens.size(1) <= kMaxTreeNodes &&
                  target_tokens.scalar_type() == at::kInt,
              "target_tokens must be int32 [B, N] with B=", batch, " and N in [1, ",
              kMaxTreeNodes, "], got ",
              target_tokens.scalar_type(), " ", target_tokens.sizes());
  TORCH_CHECK(slots.dim() == 2 && slots.sizes() == target_tokens.sizes() &&
                  slots.scalar_type() == at::kLong,
              "slots must be int64 [B, N] like target_tokens ", target_tokens.sizes(), ", got ",
              slots.scalar_type(), " ", slots.sizes());
  check_int32_vector(seq_lens, "seq_lens", batch);
}

std::tuple<at::Tensor, at::Tensor> commit_accepted_cpu(const at::Tensor& sampled,
                                                       const at::Tensor& discard,
                                                       const at::Tensor& backup,
                                                       int64_t vocab_size) {
  check_commit_accepted_args(sampled, discard, backup, vocab_size);
  const int64_t batch = sampled.size(0);
  const int64_t width = sampled.size(1);
  auto ids = sampled.contiguous();
  auto skip = discard.contiguous();
  auto fallback = backup.contiguous();
  auto num_valid = at::empty({batch}, ids.options());
  auto next_token = at::empty({batch}, ids.options());
  const int32_t* in = ids.data_ptr<int32_t>();
  const bool* skip_row = skip.data_ptr<bool>();
  const int32_t* back = fallback.data_ptr<int32_t>();
  int32_t* count = num_valid.data_ptr<int32_t>();
  int32_t* next = next_token.data_ptr<int32_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t* row = in + b * width;
    int32_t n = 0;
    if (!skip_row[b]) {
      while (n < width && row[n] >= 0 && row[n] < vocab_size) ++n;
    }
    count[b] = n;
    next[b] = n > 0 ? row[n - 1] : back[b];
  }
  return {num_valid, next_token};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> tree_commit_cpu(
    const at::Tensor& path, const at::Tensor& target_tokens, const at::Tensor& slots,
    const at::Tensor& seq_lens) {
  check_tree_commit_args(path, target_tokens, slots, seq_lens);
  const int64_t batch = path.size(0);
  const int64_t depth = path.size(1);
  const int64_t nodes = target_tokens.size(1);
  auto p = path.contiguous();
  auto tok = target_tokens.contiguous();
  auto slot = slots.contiguous();
  auto lens = seq_lens.contiguous();
  auto new_seq_lens = at::empty({batch}, lens.options());
  auto next_token = at::empty({batch}, tok.options());
  auto src_slots = at::full({batch, depth}, -1, slot.options());
  auto dst_slots = at::full({batch, depth}, -1, slot.options());
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t* row = p.data_ptr<int32_t>() + b * depth;
    const int64_t* node_slot = slot.data_ptr<int64_t>() + b * nodes;
    int64_t* src = src_slots.data_ptr<int64_t>() + b * depth;
    int64_t* dst = dst_slots.data_ptr<int64_t>() + b * depth;
    int64_t n = 0;
    for (int32_t prev = -1; n < depth; ++n) {
      const int32_t node = row[n];
      const bool extends = n == 0 ? node == 0 : (node > prev && node < nodes);
      if (!extends) break;
      if (node != n) {
        src[n] = node_slot[node];
        dst[n] = node_slot[n];
      }
      prev = node;
    }
    new_seq_lens.data_ptr<int32_t>()[b] = lens.data_ptr<int32_t>()[b] + static_cast<int32_t>(n);
    const int32_t* node_token = tok.data_ptr<int32_t>() + b * nodes;
    next_token.data_ptr<int32_t>()[b] = n > 0 ? node_token[row[n - 1]] : -1;
  }
  return {new_seq_lens, next_token, src_slots, dst_slots};
}

// ATen composites of the ops: what a backend without its own kernel
// runs (CUDA: registered below; not run on a GPU). Same checks, same
// definitions as the loops above, written as tensor ops so they stay on the
// device and never sync with the host.
namespace {

at::Tensor leading_run(const at::Tensor& ok) {
  // ok: bool [B, W] -> int32 [B], the number of leading true entries.
  return ok.to(at::kInt).cumprod(1).sum(1, /*keepdim=*/false, at::kInt);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> commit_accepted_composite(const at::Tensor& sampled,
                                                             const at::Tensor& discard,
                                                             const at::Tensor& backup,
                                                             int64_t vocab_size) {
  check_commit_accepted_args(sampled, discard, backup, vocab_size);
  auto valid = sampled.ge(0).logical_and_(sampled.lt(vocab_size))
                   .logical_and_(discard.logical_not().unsqueeze(1));
  auto num_valid = leading_run(valid);
  auto last = (num_valid - 1).clamp_min(0).to(at::kLong).unsqueeze(1);
  auto next_token = at::where(num_valid.gt(0), sampled.gather(1, last).squeeze(1), backup);
  return {num_valid, next_token};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> tree_commit_composite(
    const at::Tensor& path, const at::Tensor& target_tokens, const at::Tensor& slots,
    const at::Tensor& seq_lens) {
  check_tree_commit_args(path, target_tokens, slots, seq_lens);
  const int64_t depth = path.size(1);
  const int64_t nodes = target_tokens.size(1);
  auto prev = at::cat({at::full({path.size(0), 1}, -1, path.options()),
                       path.slice(1, 0, depth - 1)}, 1);
  auto ok = path.gt(prev).logical_and_(path.lt(nodes));
  ok.select(1, 0).copy_(path.select(1, 0).eq(0));
  auto len = leading_run(ok);
  auto node = path.clamp(0, nodes - 1).to(at::kLong);
  auto last = node.gather(1, (len - 1).clamp_min(0).to(at::kLong).unsqueeze(1));
  auto next_token = at::where(len.gt(0), target_tokens.gather(1, last).squeeze(1),
                              at::full_like(len, -1));
  auto j = at::arange(depth, path.options().dtype(at::kLong)).unsqueeze(0);
  auto moves = j.lt(len.unsqueeze(1)).logical_and_(node.ne(j));
  auto none = at::full({path.size(0), depth}, -1, slots.options());
  auto src_slots = at::where(moves, slots.gather(1, node), none);
  auto dst_slots = at::where(moves, slots.gather(1, j.clamp_max(nodes - 1).expand_as(node)), none);
  return {seq_lens + len, next_token, src_slots, dst_slots};
}

}  // namespace vspec

TORCH_LIBRARY(vspec, m) {
  m.def("commit_accepted(Tensor sampled, Tensor discard, Tensor backup, int vocab_size)"
        " -> (Tensor, Tensor)");
  m.def("tree_commit(Tensor path, Tensor target_tokens, Tensor slots, Tensor seq_lens)"
        " -> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(vspec, CPU, m) {
  m.impl("commit_accepted", &vspec::commit_accepted_cpu);
  m.impl("tree_commit", &vspec::tree_commit_cpu);
}

TORCH_LIBRARY_IMPL(vspec, CUDA, m) {
  m.impl("commit_accepted", &vspec::commit_accepted_composite);
  m.impl("tree_commit", &vspec::tree_commit_composite);
}
