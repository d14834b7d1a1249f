// recurrent.cuh — one layer of a recurrent network (RNN tanh / relu, GRU, LSTM; one or two
// directions) as ONE persistent kernel that walks every time step inside a single launch.
//
// launch_recurrent<MODE, T, Tag>(RecurrentParams<T>, stream)
//   MODE  RnnMode::{Lstm, Gru, RnnTanh, RnnRelu};
//   T     the storage type of every tensor (float, __half, __nv_bfloat16);
//   Tag   any type: it only names the kernel after its task (profiles attribute kernels by name).
// Contract
//   - gx[d, t, b, g*H + u] (element strides gx_sd, gx_st, gx_sb; the last dim dense) holds
//     x_t W_ihᵀ + b_ih of direction d for every step, computed beforehand (one GEMM per direction
//     over all T*B rows); w_hh[d] is [G*H, H] dense (G = 4 for LSTM gates i, f, g, o; 3 for GRU
//     r, z, n; 1 for RNN), b_hh[d] is [G*H] or null.
//   - direction 0 walks t = 0 .. steps-1, direction 1 walks t = steps-1 .. 0. Per step, with
//     a = h W_hhᵀ + b_hh and x = gx[d, t, b]:
//       LSTM  i = σ(x_i + a_i), f = σ(x_f + a_f), g = tanh(x_g + a_g), o = σ(x_o + a_o);
//             c = f c + i g; h = o tanh(c)
//       GRU   r = σ(x_r + a_r), z = σ(x_z + a_z), n = tanh(x_n + r a_n); h = (1 - z) n + z h
//             (PyTorch's formula: b_hn sits inside r * (...))
//       RNN   h = tanh(x + a) or relu(x + a)
//     h goes to out[t, b, d*H + u] (strides out_st, out_sb, out_sh); after the last step h and c
//     go to hn[d, b, u] / cn[d, b, u] when those are given. h0 / c0 null: a zero initial state.
//   - fp32 math, accurate expf / tanhf. The state stays fp32 whatever T is: h crosses blocks
//     through `state` (scratch, 2 * D * B * H floats), c never leaves the block that owns it.
//   - needs a device that supports cooperative launch; returns cudaErrorCooperativeLaunchTooLarge
//     if no split of the hidden units lets every block be resident at once.
//
// Why one cooperative grid, not one block per batch row
//   W_hh does not fit one block (an LSTM with H = 256 has 1 MB of it per direction): a block per
//   batch row would stream all of W_hh from L2 at every step, on as few SMs as there are rows.
//   Here the hidden units are split over the whole GPU instead: block j of direction d owns units
//   [j*U, (j+1)*U), keeps their G*U rows of W_hh in shared memory (converted to fp32 once per
//   launch), computes every gate of its units for every batch row — so the cell update is local —
//   and publishes its slice of h. Steps are separated by a grid-wide barrier (cooperative groups'
//   grid.sync(), which needs every block resident: the launcher sizes U with the occupancy
//   calculator and launches with cudaLaunchCooperativeKernel). h alternates between two buffers,
//   so a block writing h_t never races one still reading h_{t-1}, and is read with ld.global.cg
//   (from L2: an SM's L1 is not coherent with other SMs' writes). Both directions run in the same
//   launch, on disjoint blocks. When W_hh's slice and h do not fit in shared memory, the kernel
//   reads both from global memory (L2) instead. Each output (b, u) is a dot product of length H
//   per gate, split over KS lanes of a warp (a power of two up to 32) and summed by shuffles.
#pragma once

#include <cooperative_groups.h>

#include "stitch/common.cuh"
#include "stitch/value.cuh"

namespace stitch {

enum class RnnMode { Lstm, Gru, RnnTanh, RnnRelu };

template <class T>
struct RecurrentParams {
  int steps, batch, hidden, directions;
  const T* gx;
  int64_t gx_sd, gx_st, gx_sb;
  const T* w_hh[2];
  const T* b_hh[2];
  const T* h0;
  int64_t h0_sd, h0_sb, h0_sh;
  const T* c0;
  int64_t c0_sd, c0_sb, c0_sh;
  T* out;
  int64_t out_st, out_sb, out_sh;
  T* hn;
  int64_t hn_sd, hn_sb, hn_sh;
  T* cn;
  int64_t cn_sd, cn_sb, cn_sh;
  float* state;
};

template <RnnMode M>
__host__ __device__ constexpr int rnn_gates() {
  return M == RnnMode::Lstm ? 4 : M == RnnMode::Gru ? 3 : 1;
}

namespace detail {

constexpr int kRecurrentThreads = 256;

__device__ __forceinline__ float rnn_sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

// The shared-memory words of one block: W_hh's slice (G*U rows of H + KS floats: the padding
// spreads the KS lanes of different rows over different banks), h (B*H), c (B*U).
template <int G>
__host__ __device__ inline size_t recurrent_smem_floats(bool on_chip, int U, int KS, int H, int B) {
  return (on_chip ? size_t(G) * U * (H + KS) + size_t(B) * H : 0) + size_t(B) * U;
}

template <RnnMode M, class T, class Tag, bool kOnChip>
__global__ void __launch_bounds__(kRecurrentThreads) recurrent_kernel(RecurrentParams<T> p, int U, int KS) {
  constexpr int G = rnn_gates<M>();
  namespace cg = cooperative_groups;
  cg::grid_group grid = cg::this_grid();
  extern __shared__ float smem[];
  const int H = p.hidden, B = p.batch, D = p.directions;
  const int per_dir = gridDim.x / D;
  const int d = blockIdx.x / per_dir, u0 = (blockIdx.x % per_dir) * U;
  const int units = H - u0 < U ? H - u0 : U;
  const int ldw = H + KS;
  const T* W = p.w_hh[d];
  const T* bh = p.b_hh[d];
  float* w_s = smem;
  float* h_s = smem + (kOnChip ? size_t(G) * U * ldw : 0);
  float* c_s = h_s + (kOnChip ? size_t(B) * H : 0);
  const int tid = threadIdx.x;
  if (kOnChip) {
    for (int i = tid; i < G * U * H; i += blockDim.x) {
      const int r = i / H, k = i - r * H, g = r / U, ul = r - g * U;
      w_s[size_t(r) * ldw + k] = ul < units ? any_to_float(W[size_t(g * H + u0 + ul) * H + k]) : 0.f;
    }
  }
  for (int o = tid; o < B * U; o += blockDim.x) {
    const int b = o / U, ul = o - b * U;
    c_s[o] = (M == RnnMode::Lstm && p.c0 && ul < units)
                 ? any_to_float(p.c0[d * p.c0_sd + b * p.c0_sb + (u0 + ul) * p.c0_sh]) : 0.f;
  }
  __syncthreads();  // W_hh's slice and c in place before the first step reads them
  auto h_init = [&](int b, int k) {
    return p.h0 ? any_to_float(p.h0[d * p.h0_sd + b * p.h0_sb + k * p.h0_sh]) : 0.f;
  };
  const size_t plane = size_t(D) * B * H;
  const int outs = B * U, groups = blockDim.x / KS;
  const int ks = tid % KS;
  for (int s = 0; s < p.steps; ++s) {
    const int t = d == 1 ? p.steps - 1 - s : s;
    const float* h_prev = p.state + ((s + 1) & 1) * plane + size_t(d) * B * H;  // h_{s-1} (s > 0)
    float* h_next = p.state + (s & 1) * plane + size_t(d) * B * H;
    auto h_at = [&](int b, int k) {
      if (kOnChip) return h_s[b * H + k];
      return s == 0 ? h_init(b, k) : __ldcg(h_prev + b * H + k);
    };
    if (kOnChip) {
      __syncthreads();  // the last step's readers of h_s are done
      for (int i = tid; i < B * H; i += blockDim.x) {
        const int b = i / H;
        h_s[i] = s == 0 ? h_init(b, i - b * H) : __ldcg(h_prev + i);
      }
      __syncthreads();
    }
    for (int base = 0; base < outs; base += groups) {
      // Every lane runs the same iterations (the shuffles below need the whole warp).
      const int o = base + tid / KS;
      const int b = o < outs ? o / U : 0, ul = o < outs ? o - b * U : 0;
      const bool live = o < outs && ul < units;
      const int u = u0 + ul;
      // This step's input projection does not depend on h: its loads are in flight during the
      // dot products instead of after them.
      float x[G] = {};
      if (live && ks == 0) {
        const T* xg = p.gx + d * p.gx_sd + int64_t(t) * p.gx_st + b * p.gx_sb;
#pragma unroll
        for (int g = 0; g < G; ++g) x[g] = any_to_float(xg[g * H + u]);
      }
      float acc[G];
#pragma unroll
      for (int g = 0; g < G; ++g) acc[g] = 0.f;
      if (live) {
        for (int k = ks; k < H; k += KS) {
          const float hk = h_at(b, k);
#pragma unroll
          for (int g = 0; g < G; ++g) {
            const float w = kOnChip ? w_s[size_t(g * U + ul) * ldw + k] : any_to_float(W[size_t(g * H + u) * H + k]);
            acc[g] = fmaf(w, hk, acc[g]);
          }
        }
      }
      for (int off = KS >> 1; off > 0; off >>= 1) {
#pragma unroll
        for (int g = 0; g < G; ++g) acc[g] += __shfl_xor_sync(0xffffffffu, acc[g], off);
      }
      if (!live || ks != 0) continue;
      float a[G];
#pragma unroll
      for (int g = 0; g < G; ++g) a[g] = acc[g] + (bh ? any_to_float(bh[g * H + u]) : 0.f);
      float h, c = 0.f;
      if constexpr (M == RnnMode::Lstm) {
        const float ig = rnn_sigmoid(x[0] + a[0]), fg = rnn_sigmoid(x[1] + a[1]);
        const float gg = tanhf(x[2] + a[2]), og = rnn_sigmoid(x[3] + a[3]);
        c = fg * c_s[o] + ig * gg;
        c_s[o] = c;
        h = og * tanhf(c);
      } else if constexpr (M == RnnMode::Gru) {
        const float r = rnn_sigmoid(x[0] + a[0]), z = rnn_sigmoid(x[1] + a[1]);
        const float n = tanhf(x[2] + r * a[2]);
        h = (1.f - z) * n + z * h_at(b, u);
      } else if constexpr (M == RnnMode::RnnTanh) {
        h = tanhf(x[0] + a[0]);
      } else {
        h = fmaxf(x[0] + a[0], 0.f);
      }
      h_next[b * H + u] = h;
      p.out[int64_t(t) * p.out_st + b * p.out_sb + int64_t(d * H + u) * p.out_sh] = any_from_float<T>(h);
      if (s == p.steps - 1) {
        if (p.hn) p.hn[d * p.hn_sd + b * p.hn_sb + u * p.hn_sh] = any_from_float<T>(h);
        if (M == RnnMode::Lstm && p.cn) p.cn[d * p.cn_sd + b * p.cn_sb + u * p.cn_sh] = any_from_float<T>(c);
      }
    }
    grid.sync();  // h_t complete (and visible) before any block starts step s + 1
  }
}

// KS: the largest power of two up to 32 that keeps every output of a block in one pass.
inline int recurrent_split(int outs) {
  int ks = 32;
  while (ks > 1 && outs * ks > kRecurrentThreads) ks >>= 1;
  return ks;
}

}  // namespace detail

template <RnnMode M, class T, class Tag>
cudaError_t launch_recurrent(const RecurrentParams<T>& p, cudaStream_t stream) {
  constexpr int G = rnn_gates<M>();
  if (p.steps <= 0 || p.batch <= 0 || p.hidden <= 0) return cudaSuccess;
  if (!p.gx || !p.w_hh[0] || !p.out || !p.state || p.directions < 1 || p.directions > 2 ||
      (p.directions == 2 && !p.w_hh[1]))
    return cudaErrorInvalidValue;
  // The split is a function of the shape and the device: worked out on the first call, kept.
  struct Config {
    int device = -1, hidden = 0, batch = 0, directions = 0, units = 0, ks = 0, blocks = 0;
    bool on_chip = false;
    size_t bytes = 0;
  };
  static Config cfg;
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (cfg.device != dev || cfg.hidden != p.hidden || cfg.batch != p.batch || cfg.directions != p.directions) {
    int sms = 0, coop = 0, optin = 0;
    if ((e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess) return e;
    if ((e = cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev)) != cudaSuccess) return e;
    if ((e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)) != cudaSuccess) return e;
    if (!coop) return cudaErrorNotSupported;
    const int D = p.directions, H = p.hidden, B = p.batch;
    Config found;
    for (int pass = 0; pass < 2 && found.device < 0; ++pass) {
      const bool on_chip = pass == 0;
      auto kernel = on_chip ? detail::recurrent_kernel<M, T, Tag, true> : detail::recurrent_kernel<M, T, Tag, false>;
      // Fewest units per block first (most blocks, most parallel), at least one block per SM's worth.
      for (int per_dir = (sms / D > 0 ? (sms / D < H ? sms / D : H) : 1); per_dir >= 1;) {
        const int U = ceil_div(H, per_dir);
        const int blocks = ceil_div(H, U);
        const int ks = detail::recurrent_split(B * U);
        const size_t bytes = detail::recurrent_smem_floats<G>(on_chip, U, ks, H, B) * sizeof(float);
        if (bytes > size_t(optin)) break;  // larger U needs more: try the global-memory kernel
        if ((e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes))) != cudaSuccess)
          return e;
        int resident = 0;
        if ((e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, detail::kRecurrentThreads, bytes)) !=
            cudaSuccess)
          return e;
        if (resident * sms >= D * blocks) {
          found = Config{dev, H, B, D, U, ks, D * blocks, on_chip, bytes};
          break;
        }
        per_dir = blocks - 1 < per_dir - 1 ? blocks - 1 : per_dir - 1;
      }
    }
    if (found.device < 0) return cudaErrorCooperativeLaunchTooLarge;
    cfg = found;
  }
  RecurrentParams<T> args = p;
  int U = cfg.units, KS = cfg.ks;
  void* argv[] = {&args, &U, &KS};
  auto kernel = cfg.on_chip ? detail::recurrent_kernel<M, T, Tag, true> : detail::recurrent_kernel<M, T, Tag, false>;
  return cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(cfg.blocks),
                                     dim3(detail::kRecurrentThreads), argv, cfg.bytes, stream);
}

}  // namespace stitch
