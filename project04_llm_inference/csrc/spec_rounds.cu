// One round's inputs of the fused speculative program in rounds, formed on the device in one
// launch (spec/fused.py, `FusedGreedySpec._program_rounds`).
//
// A program of R rounds runs, per round, the draft's catch-up forward, its k - 1 steps, the
// target's verification and the greedy acceptance. Between two rounds the state moves on by what
// the last round accepted, and the next round's token ids, positions, cache slots (through the
// block tables) and context lengths follow from it. Written as torch operations that was about 50
// launches of tiny kernels a round, a large share of the round's device time next to its
// forwards: more than the host time the rounds were meant to save. Here it is one launch,
// one thread per batch row; integer arithmetic only, so it equals the torch version bit for bit
// (`kernels/spec_rounds.py` keeps that version as the reference and the CPU path).
//
// Per row i (module doc of spec/fused.py): with `prev` (the last round's (w, 2 + k) result:
// accepted drafts a, the token after them b, the k drafts), the state advances first:
//   L += a + 1; last = b; cd += dn + min(a, k - 1); dn = 1 + (a == k);
//   catch-up tokens = (a == k) ? (draft k - 1, b) : (b, 0)
// (padding rows, real == 0, keep theirs). Then the inputs: the draft's catch-up at positions
// cd, cd + 1 (slots for the first dn of them), its steps at cd + dn + j, the verification at
// L .. L + k (slots for the first 1 + nd), each verified token a decode row of context L + j + 1
// (causal, as the chunk aligned bottom-right).
#include <cuda_runtime.h>

#include <cstdint>

#include "pdl.cuh"

namespace {

constexpr int kCatchUp = 2;  // spec/fused.py CATCH_UP
constexpr int kThreads = 128;

struct RoundParams {
  // state (int64, advanced in place)
  int64_t* L;
  int64_t* last;
  int64_t* cd;
  int64_t* dn;
  int64_t* dtok;  // (w, kCatchUp)
  const int64_t* real;
  const int64_t* nd;
  const int64_t* prev;  // (w, 2 + k) of the last round, or nullptr: no advance
  // inputs written (int64)
  int64_t* d_ids;    // (w * kCatchUp)
  int64_t* d_pos;    // (w * kCatchUp)
  int64_t* d_slots;  // (w * kCatchUp)
  int64_t* d_rows;   // (w)
  int64_t* s_pos;    // (k - 1, w)
  int64_t* s_slots;  // (k - 1, w)
  int64_t* t_ids;    // (w * q): column 0 written, the drafts are written by the round
  int64_t* t_pos;    // (w * q)
  int64_t* t_slots;  // (w * q)
  // int32
  const int32_t* d_tables;  // (w, mbd)
  const int32_t* t_tables;  // (w, mbt)
  int32_t* d_ctx;           // (w)
  int32_t* s_lens;          // (k - 1, w)
  int32_t* t_lens;          // (w * q): row j of a verification is a decode at context L + j + 1
  int w, k, mbd, mbt, dbs, tbs;
};

// The cache slot of position pos through a row of block tables (the block index clamped to the
// table, as the torch version does; positions are never negative).
__device__ __forceinline__ int64_t slot_of(const int32_t* table, int max_blocks, int64_t pos,
                                           int block_size) {
  int64_t idx = pos / block_size;
  if (idx > max_blocks - 1) idx = max_blocks - 1;
  return static_cast<int64_t>(table[idx]) * block_size + pos % block_size;
}

__global__ void __launch_bounds__(kThreads) spec_round_inputs_kernel(RoundParams p) {
  p04::wait_previous_kernel();  // the state and the last round's result come from earlier kernels
  p04::allow_next_kernel();     // the next kernel waits for this grid before it reads anything
  const int k = p.k, q = k + 1, w = p.w;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < w; i += gridDim.x * blockDim.x) {
    const bool real = p.real[i] != 0;
    int64_t L = p.L[i], last = p.last[i], cd = p.cd[i], dn = p.dn[i];
    int64_t t0 = p.dtok[i * kCatchUp], t1 = p.dtok[i * kCatchUp + 1];
    if (p.prev != nullptr && real) {
      const int64_t* r = p.prev + static_cast<int64_t>(i) * (2 + k);
      const int64_t a = r[0], bonus = r[1];
      const bool every = a == k;
      L += a + 1;
      last = bonus;
      cd += dn + (a < k - 1 ? a : k - 1);
      dn = every ? 2 : 1;
      t0 = every ? r[2 + k - 1] : bonus;
      t1 = every ? bonus : 0;
      p.L[i] = L;
      p.last[i] = last;
      p.cd[i] = cd;
      p.dn[i] = dn;
      p.dtok[i * kCatchUp] = t0;
      p.dtok[i * kCatchUp + 1] = t1;
    }
    const int32_t* dtab = p.d_tables + static_cast<int64_t>(i) * p.mbd;
    const int32_t* ttab = p.t_tables + static_cast<int64_t>(i) * p.mbt;
    // the draft's catch-up: padded to kCatchUp tokens, slots for the first dn
    for (int c = 0; c < kCatchUp; ++c) {
      const int64_t pos = cd + c;
      const int64_t j = static_cast<int64_t>(i) * kCatchUp + c;
      p.d_ids[j] = c == 0 ? t0 : t1;
      p.d_pos[j] = pos;
      p.d_slots[j] = (real && c < dn) ? slot_of(dtab, p.mbd, pos, p.dbs) : -1;
    }
    p.d_rows[i] = static_cast<int64_t>(i) * kCatchUp + dn - 1;
    p.d_ctx[i] = static_cast<int32_t>(cd + kCatchUp);  // bottom-right causal: padding unseen
    // the draft's k - 1 steps: step j feeds draft j + 1 at position cd + dn + j
    for (int j = 0; j < k - 1; ++j) {
      const int64_t spos = real ? cd + dn + j : 0;
      const int64_t o = static_cast<int64_t>(j) * w + i;
      p.s_pos[o] = spos;
      p.s_slots[o] = real ? slot_of(dtab, p.mbd, spos, p.dbs) : -1;
      p.s_lens[o] = static_cast<int32_t>(spos + 1);
    }
    // the target's verification: the last token and k drafts at L .. L + k
    const int64_t live = real ? 1 + p.nd[i] : 0;
    for (int c = 0; c < q; ++c) {
      const int64_t pos = L + c;
      const int64_t o = static_cast<int64_t>(i) * q + c;
      p.t_pos[o] = pos;
      p.t_slots[o] = c < live ? slot_of(ttab, p.mbt, pos, p.tbs) : -1;
      p.t_lens[o] = static_cast<int32_t>(pos + 1);
    }
    p.t_ids[static_cast<int64_t>(i) * q] = last;
  }
}

// The round's greedy acceptance, one thread per row: the leading drafts equal to the target's
// argmax at their position (at most nd of them), then the argmax after them. out is the round's
// (w, 2 + k) result, its drafts (columns 2..) already written; columns 0 and 1 are written here.
// As torch operations (compare, mask, cumulative product, sum, gather, two copies) it was about
// nine launches a round; the comparison is exact, so the two agree bit for bit.
__global__ void __launch_bounds__(kThreads)
    spec_accept_kernel(const int64_t* __restrict__ am, const int64_t* __restrict__ nd,
                       int64_t* __restrict__ out, int w, int k) {
  p04::wait_previous_kernel();  // the argmax comes from the kernel before
  p04::allow_next_kernel();
  const int q = k + 1;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < w; i += gridDim.x * blockDim.x) {
    int64_t* row = out + static_cast<int64_t>(i) * (2 + k);
    const int64_t* want = am + static_cast<int64_t>(i) * q;
    const int64_t limit = nd[i] < k ? nd[i] : k;
    int64_t n = 0;
    while (n < limit && row[2 + n] == want[n]) ++n;
    row[0] = n;
    row[1] = want[n];
  }
}

}  // namespace

// The torch binding (compiled only as part of the extension build, which defines
// TORCH_EXTENSION_NAME); without it this file is plain CUDA, so a compile check needs no torch.
#ifdef TORCH_EXTENSION_NAME
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

// Every tensor is a contiguous view of the slab's buffers, checked by the Python wrapper
// (kernels/spec_rounds.py), which also checks the shapes: only pointers are taken here.
void spec_round_inputs(torch::Tensor L, torch::Tensor last, torch::Tensor cd, torch::Tensor dn,
                       torch::Tensor dtok, torch::Tensor real, torch::Tensor nd,
                       c10::optional<torch::Tensor> prev, torch::Tensor d_ids,
                       torch::Tensor d_pos, torch::Tensor d_slots, torch::Tensor d_rows,
                       torch::Tensor s_pos, torch::Tensor s_slots, torch::Tensor t_ids,
                       torch::Tensor t_pos, torch::Tensor t_slots, torch::Tensor d_tables,
                       torch::Tensor t_tables, torch::Tensor d_ctx, torch::Tensor s_lens,
                       torch::Tensor t_lens, int64_t k, int64_t dbs, int64_t tbs, bool pdl) {
  const c10::cuda::CUDAGuard guard(L.device());
  RoundParams p;
  p.L = L.data_ptr<int64_t>();
  p.last = last.data_ptr<int64_t>();
  p.cd = cd.data_ptr<int64_t>();
  p.dn = dn.data_ptr<int64_t>();
  p.dtok = dtok.data_ptr<int64_t>();
  p.real = real.data_ptr<int64_t>();
  p.nd = nd.data_ptr<int64_t>();
  p.prev = prev.has_value() ? prev->data_ptr<int64_t>() : nullptr;
  p.d_ids = d_ids.data_ptr<int64_t>();
  p.d_pos = d_pos.data_ptr<int64_t>();
  p.d_slots = d_slots.data_ptr<int64_t>();
  p.d_rows = d_rows.data_ptr<int64_t>();
  p.s_pos = s_pos.data_ptr<int64_t>();
  p.s_slots = s_slots.data_ptr<int64_t>();
  p.t_ids = t_ids.data_ptr<int64_t>();
  p.t_pos = t_pos.data_ptr<int64_t>();
  p.t_slots = t_slots.data_ptr<int64_t>();
  p.d_tables = d_tables.data_ptr<int32_t>();
  p.t_tables = t_tables.data_ptr<int32_t>();
  p.d_ctx = d_ctx.data_ptr<int32_t>();
  p.s_lens = s_lens.data_ptr<int32_t>();
  p.t_lens = t_lens.data_ptr<int32_t>();
  p.w = static_cast<int>(L.size(0));
  p.k = static_cast<int>(k);
  p.mbd = static_cast<int>(d_tables.size(1));
  p.mbt = static_cast<int>(t_tables.size(1));
  p.dbs = static_cast<int>(dbs);
  p.tbs = static_cast<int>(tbs);
  const unsigned blocks = static_cast<unsigned>((p.w + kThreads - 1) / kThreads);
  C10_CUDA_CHECK(p04::launch(spec_round_inputs_kernel, dim3(blocks), dim3(kThreads), 0,
                             c10::cuda::getCurrentCUDAStream(), pdl, p));
}

// am (w * (k + 1)) int64, nd (w) int64, out (w, 2 + k) int64: contiguous, checked by the wrapper.
void spec_accept(torch::Tensor am, torch::Tensor nd, torch::Tensor out, int64_t k, bool pdl) {
  const c10::cuda::CUDAGuard guard(out.device());
  const int w = static_cast<int>(out.size(0));
  const unsigned blocks = static_cast<unsigned>((w + kThreads - 1) / kThreads);
  C10_CUDA_CHECK(p04::launch(spec_accept_kernel, dim3(blocks), dim3(kThreads), 0,
                             c10::cuda::getCurrentCUDAStream(), pdl,
                             static_cast<const int64_t*>(am.data_ptr<int64_t>()),
                             static_cast<const int64_t*>(nd.data_ptr<int64_t>()),
                             out.data_ptr<int64_t>(), w, static_cast<int>(k)));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("spec_accept", &spec_accept,
        "the round's greedy acceptance: accepted drafts and the token after them, into columns "
        "0 and 1 of the round's result");
  m.def("spec_round_inputs", &spec_round_inputs,
        "advance the fused rounds' state by the last round's result (when given) and form the "
        "next round's inputs, in place");
}
#endif  // TORCH_EXTENSION_NAME
