// The backward of softmax(q·kᵀ/√d + mask)·v for causal CPU training, with the mask gradient
// summed over the batch (fireviz/attention.py: BiasedAttention; built by fireviz/attention_kernel.py).
//
// Source: FlashAttention's backward (Dao et al. 2022, Alg. 2; Dao 2023, FlashAttention-2 §3.1.2):
// per (batch, head) pair and block of query rows, P = exp(q·kᵀ/√d + mask − lse) is recomputed from
// the forward's log-sum-exp, dS = P ⊙ (dO·vᵀ − rowsum(dO ⊙ O)), dq = dS·k/√d, dk += dSᵀ·q/√d,
// dv += Pᵀ·dO, and dmask = Σ_batch dS. Each block only reads the keys its rows may see (queries are
// the last Tq of Tk positions), so the masked future costs nothing; its [rows, keys] blocks of P
// and dS stay in cache, and the mask gradient is summed into place instead of stored per pair.
// GEMMs: BLAS sgemm_ (the MKL torch links and exports).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);

namespace {

// Row-major C[M, N] = alpha · op(A) · op(B) + beta · C (column-major BLAS on the transposes).
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const char ta = trans_b ? 'T' : 'N', tb = trans_a ? 'T' : 'N';
  const int m = static_cast<int>(N), n = static_cast<int>(M), k = static_cast<int>(K);
  const int la = static_cast<int>(ldb), lb = static_cast<int>(lda), lc = static_cast<int>(ldc);
  sgemm_(&ta, &tb, &m, &n, &k, &alpha, B, &la, A, &lb, &beta, C, &lc);
}

// exp(x) for −87 ≤ x ≤ 88 (clamped outside): Cephes expf (range reduction by ln 2 in two parts, degree-6 polynomial;
// relative error ~1e-7), branch-free so the compiler vectorises the loops that call it.
inline float exp_approx(float x) {
  x = std::max(std::min(x, 88.0f), -87.0f);  // 2ⁿ from exponent bits: no wrap-around (exp(−87) ≈ 1.6e-38)
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n;
}

// A [B, H, T, D] operand BLAS can read in place: unit stride along D and a row stride (its
// leading dimension) of at least D; otherwise a copy with the canonical strides (dout of a sum
// over time, keys expanded along time; also a lone query row, whose stride torch's contiguous()
// leaves as it is and BLAS refuses).
at::Tensor blas_rows(const at::Tensor& t) {
  if (t.stride(3) == 1 && t.stride(2) >= std::max<int64_t>(t.size(3), 1)) return t;
  return at::empty(t.sizes(), t.options()).copy_(t);
}

}  // namespace

// q [B, H, Tq, D], k, v [B, H, Tk, D], out [B, H, Tq, D], lse [B, H, Tq], dout [B, H, Tq, D],
// mask [H, Tq, Tk] (−inf above the causal diagonal), all float32 on CPU (any strides).
// Returns dq, dk, dv (contiguous) and dmask [H, Tq, Tk] (undefined unless mask_grad).
// chunk: query rows per block; underflow: log-probabilities ≤ it give P = 0 (see attention.py).
std::vector<at::Tensor> biased_attention_backward(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor mask,
                                                  at::Tensor out, at::Tensor lse, at::Tensor dout, bool mask_grad,
                                                  int64_t chunk, double underflow) {
  for (const auto* t : {&q, &k, &v, &mask, &out, &lse, &dout}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat, "biased_attention_backward: float32 CPU only");
  }
  TORCH_CHECK(q.dim() == 4 && k.sizes() == v.sizes() && q.sizes() == out.sizes() && q.sizes() == dout.sizes(),
              "biased_attention_backward: bad q/k/v/out/dout shapes");
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3), Tk = k.size(2);
  TORCH_CHECK(k.size(0) == B && k.size(1) == H && k.size(3) == D && 0 < Tq && Tq <= Tk && chunk > 0,
              "biased_attention_backward: bad key shape or chunk");
  TORCH_CHECK(mask.dim() == 3 && mask.size(0) == H && mask.size(1) == Tq && mask.size(2) == Tk,
              "biased_attention_backward: mask must be [heads, Tq, Tk]");
  TORCH_CHECK(lse.dim() == 3 && lse.size(0) == B && lse.size(1) == H && lse.size(2) == Tq,
              "biased_attention_backward: lse must be [B, H, Tq]");
  q = blas_rows(q), k = blas_rows(k), v = blas_rows(v), out = blas_rows(out), dout = blas_rows(dout);
  mask = mask.stride(2) == 1 ? mask : mask.contiguous();  // read row by row, not through BLAS
  lse = lse.contiguous();

  const int64_t offset = Tk - Tq;  // queries are the last Tq positions
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const float floor_logp = static_cast<float>(underflow);
  auto dq = at::empty({B, H, Tq, D}, q.options()), dk = at::empty({B, H, Tk, D}, q.options());
  auto dv = at::empty({B, H, Tk, D}, q.options());
  // Units of work: (head, batch group). A head's mask gradient has one writer per group: group 0
  // writes dmask, groups 1… their own buffer, summed after. Without a mask gradient every pair
  // is its own unit.
  const int64_t threads = at::get_num_threads();
  const int64_t groups = mask_grad ? std::min(B, std::max<int64_t>(1, (threads + H - 1) / H)) : B;
  at::Tensor dmask = mask_grad ? at::empty({H, Tq, Tk}, q.options()) : at::Tensor();
  at::Tensor extra = mask_grad && groups > 1 ? at::empty({groups - 1, H, Tq, Tk}, q.options()) : at::Tensor();

  const float *Q = q.data_ptr<float>(), *K = k.data_ptr<float>(), *V = v.data_ptr<float>();
  const float *M = mask.data_ptr<float>(), *O = out.data_ptr<float>(), *L = lse.data_ptr<float>();
  const float* DO = dout.data_ptr<float>();
  float *DQ = dq.data_ptr<float>(), *DK = dk.data_ptr<float>(), *DV = dv.data_ptr<float>();
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1), ldq = q.stride(2);
  const int64_t ks0 = k.stride(0), ks1 = k.stride(1), ldk = k.stride(2);
  const int64_t vs0 = v.stride(0), vs1 = v.stride(1), ldv = v.stride(2);
  const int64_t os0 = out.stride(0), os1 = out.stride(1), ldo = out.stride(2);
  const int64_t gs0 = dout.stride(0), gs1 = dout.stride(1), ldg = dout.stride(2);
  const int64_t ms0 = mask.stride(0), ldm = mask.stride(1);
  chunk = std::min(chunk, Tq);  // buffers of the rows a block really has
  const int64_t blocks = (Tq + chunk - 1) / chunk;
  if (mask_grad && B == 0) dmask.zero_();  // no pair writes it

  at::parallel_for(0, H * groups, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> P_buf(chunk * Tk), dS_buf(chunk * Tk), delta(Tq);
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t h = unit % H, g = unit / H;
      float* dm = !mask_grad ? nullptr
                  : g == 0   ? dmask.data_ptr<float>() + h * Tq * Tk
                             : extra.data_ptr<float>() + ((g - 1) * H + h) * Tq * Tk;
      for (int64_t b = g; b < B; b += groups) {
        const bool first = b == g;  // this unit's first pair writes its dmask rows, later ones add
        const float *q_ = Q + b * qs0 + h * qs1, *k_ = K + b * ks0 + h * ks1, *v_ = V + b * vs0 + h * vs1;
        const float *o_ = O + b * os0 + h * os1, *do_ = DO + b * gs0 + h * gs1, *l_ = L + (b * H + h) * Tq;
        const int64_t pair = b * H + h;
        float *dq_ = DQ + pair * Tq * D, *dk_ = DK + pair * Tk * D, *dv_ = DV + pair * Tk * D;
        for (int64_t i = 0; i < Tq; ++i) {
          float s = 0.0f;
          for (int64_t d = 0; d < D; ++d) s += do_[i * ldg + d] * o_[i * ldo + d];
          delta[i] = s;
        }
        // last block first: it sees every key, so it initialises dk and dv (beta = 0)
        for (int64_t blk = blocks - 1; blk >= 0; --blk) {
          const int64_t s = blk * chunk, e = std::min(s + chunk, Tq), rows = e - s, keys = offset + e;
          const float beta = blk == blocks - 1 ? 0.0f : 1.0f;
          float *P = P_buf.data(), *dS = dS_buf.data();
          gemm(false, true, rows, keys, D, scale, q_ + s * ldq, ldq, k_, ldk, 0.0f, P, keys);
          gemm(false, true, rows, keys, D, 1.0f, do_ + s * ldg, ldg, v_, ldv, 0.0f, dS, keys);
          for (int64_t i = 0; i < rows; ++i) {
            const float* m_row = M + h * ms0 + (s + i) * ldm;
            float *p_row = P + i * keys, *ds_row = dS + i * keys;
            const float lse_i = l_[s + i], delta_i = delta[s + i];
            for (int64_t j = 0; j < keys; ++j) {
              const float x = p_row[j] + m_row[j] - lse_i;
              const float p = x <= floor_logp ? 0.0f : exp_approx(x);
              p_row[j] = p;
              ds_row[j] = p * (ds_row[j] - delta_i);
            }
            if (dm != nullptr) {
              float* dm_row = dm + (s + i) * Tk;
              if (first) {
                std::memcpy(dm_row, ds_row, keys * sizeof(float));
                std::fill(dm_row + keys, dm_row + Tk, 0.0f);
              } else {
                for (int64_t j = 0; j < keys; ++j) dm_row[j] += ds_row[j];
              }
            }
          }
          gemm(false, false, rows, D, keys, scale, dS, keys, k_, ldk, 0.0f, dq_ + s * D, D);
          gemm(true, false, keys, D, rows, scale, dS, keys, q_ + s * ldq, ldq, beta, dk_, D);
          gemm(true, false, keys, D, rows, 1.0f, P, keys, do_ + s * ldg, ldg, beta, dv_, D);
        }
      }
    }
  });
  if (extra.defined()) dmask.add_(extra.sum(0));
  return {dq, dk, dv, dmask};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("biased_attention_backward", &biased_attention_backward,
        "BiasedAttention's backward: (dq, dk, dv, dmask summed over the batch)");
}
