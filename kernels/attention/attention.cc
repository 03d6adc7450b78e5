#include "kernels/attention/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/matmul/bf16.h"

namespace loom::kernels {
namespace {

// In place: row i of the (L, L) matrix p becomes softmax over its columns
// [0, L) (full) or [0, i] (causal; later columns become 0).
void SoftmaxRows(float* p, int L, bool causal) {
  for (int i = 0; i < L; ++i) {
    float* row = p + static_cast<int64_t>(i) * L;
    const int n = causal ? i + 1 : L;
    float mx = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < n; ++j) mx = row[j] > mx ? row[j] : mx;
    double sum = 0;
    for (int j = 0; j < n; ++j) {
      row[j] = std::exp(row[j] - mx);
      sum += row[j];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int j = 0; j < n; ++j) row[j] *= inv;
    for (int j = n; j < L; ++j) row[j] = 0.0f;
  }
}

// Where query head h and its key/value group sit in a row of qkv.
struct Layout {
  Layout(int NH, int NKV, int HD)
      : ld(static_cast<int64_t>(NH + 2 * NKV) * HD),
        hd(HD),
        group(NH / NKV),
        kv_off(NH * HD),
        v_off((NH + NKV) * HD) {}
  int64_t q(int h) const { return static_cast<int64_t>(h) * hd; }
  int64_t k(int h) const { return kv_off + static_cast<int64_t>(h / group) * hd; }
  int64_t v(int h) const { return v_off + static_cast<int64_t>(h / group) * hd; }
  int64_t ld;
  int hd, group, kv_off, v_off;
};

}  // namespace

int64_t attention_att_size(const int32_t* cu_seqlens, int S, int NH) {
  int64_t n = 0;
  for (int s = 0; s < S; ++s) {
    const int64_t L = cu_seqlens[s + 1] - cu_seqlens[s];
    n += NH * L * L;
  }
  return n;
}

void attention_forward_reference(float* out, float* att, const float* qkv,
                                 const int32_t* cu_seqlens, int S, int NH, int NKV, int HD,
                                 bool causal) {
  const Layout y(NH, NKV, HD);
  const int C = NH * HD;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  for (int s = 0; s < S; ++s) {
    const int start = cu_seqlens[s], L = cu_seqlens[s + 1] - cu_seqlens[s];
    for (int h = 0; h < NH; ++h) {
      float* a = att + static_cast<int64_t>(h) * L * L;
      for (int i = 0; i < L; ++i) {
        const float* q = qkv + (start + i) * y.ld + y.q(h);
        for (int j = 0; j < L; ++j) {
          const float* k = qkv + (start + j) * y.ld + y.k(h);
          float dot = 0;
          for (int d = 0; d < HD; ++d) dot += q[d] * k[d];
          a[static_cast<int64_t>(i) * L + j] = dot * scale;
        }
      }
      SoftmaxRows(a, L, causal);
      for (int i = 0; i < L; ++i) {
        float* o = out + static_cast<int64_t>(start + i) * C + h * HD;
        for (int d = 0; d < HD; ++d) o[d] = 0;
        for (int j = 0; j < L; ++j) {
          const float p = a[static_cast<int64_t>(i) * L + j];
          const float* v = qkv + (start + j) * y.ld + y.v(h);
          for (int d = 0; d < HD; ++d) o[d] += p * v[d];
        }
      }
    }
    att += static_cast<int64_t>(NH) * L * L;
  }
}

void attention_backward_reference(float* dqkv, const float* dout, const float* qkv,
                                  const float* att, const int32_t* cu_seqlens, int S, int NH,
                                  int NKV, int HD, bool causal) {
  const Layout y(NH, NKV, HD);
  const int C = NH * HD;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  std::vector<float> datt;
  for (int s = 0; s < S; ++s) {
    const int start = cu_seqlens[s], L = cu_seqlens[s + 1] - cu_seqlens[s];
    datt.assign(L, 0.0f);
    for (int h = 0; h < NH; ++h) {
      const float* a = att + static_cast<int64_t>(h) * L * L;
      for (int i = 0; i < L; ++i) {
        const float* g = dout + static_cast<int64_t>(start + i) * C + h * HD;
        const float* p = a + static_cast<int64_t>(i) * L;
        const int n = causal ? i + 1 : L;
        // dP[j] = g · v_j ; dV_j += p_j g
        double dot_pd = 0;
        for (int j = 0; j < n; ++j) {
          const float* v = qkv + (start + j) * y.ld + y.v(h);
          float* dv = dqkv + (start + j) * y.ld + y.v(h);
          float d = 0;
          for (int e = 0; e < HD; ++e) {
            d += g[e] * v[e];
            dv[e] += p[j] * g[e];
          }
          datt[j] = d;
          dot_pd += static_cast<double>(p[j]) * d;
        }
        // dS_j = p_j (dP_j - sum p dP) ; dq_i += scale dS_j k_j ; dk_j += scale dS_j q_i
        const float* q = qkv + (start + i) * y.ld + y.q(h);
        float* dq = dqkv + (start + i) * y.ld + y.q(h);
        for (int j = 0; j < n; ++j) {
          const float ds = p[j] * (datt[j] - static_cast<float>(dot_pd)) * scale;
          const float* k = qkv + (start + j) * y.ld + y.k(h);
          float* dk = dqkv + (start + j) * y.ld + y.k(h);
          for (int e = 0; e < HD; ++e) {
            dq[e] += ds * k[e];
            dk[e] += ds * q[e];
          }
        }
      }
    }
    att += static_cast<int64_t>(NH) * L * L;
  }
}

void attention_forward(float* out, float* att, const float* qkv, const int32_t* cu_seqlens, int S,
                       int NH, int NKV, int HD, bool causal) {
  const Layout y(NH, NKV, HD);
  const int C = NH * HD, ld = static_cast<int>(y.ld);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  for (int s = 0; s < S; ++s) {
    const int start = cu_seqlens[s], L = cu_seqlens[s + 1] - cu_seqlens[s];
    if (L == 0) continue;
    const float* base = qkv + static_cast<int64_t>(start) * ld;
    for (int h = 0; h < NH; ++h) {
      float* a = att + static_cast<int64_t>(h) * L * L;
      // a (L,L) = scale · Q (L,HD) · Kᵀ
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, L, L, HD, scale, base + y.q(h), ld,
                  base + y.k(h), ld, 0.0f, a, L);
      SoftmaxRows(a, L, causal);
      // O (L,HD) = a · V
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, L, HD, L, 1.0f, a, L, base + y.v(h),
                  ld, 0.0f, out + static_cast<int64_t>(start) * C + h * HD, C);
    }
    att += static_cast<int64_t>(NH) * L * L;
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                        const int32_t* cu_seqlens, int S, int NH, int NKV, int HD, bool causal) {
  const Layout y(NH, NKV, HD);
  const int C = NH * HD, ld = static_cast<int>(y.ld);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  std::vector<float> ds;
  for (int s = 0; s < S; ++s) {
    const int start = cu_seqlens[s], L = cu_seqlens[s + 1] - cu_seqlens[s];
    if (L == 0) continue;
    const float* base = qkv + static_cast<int64_t>(start) * ld;
    float* dbase = dqkv + static_cast<int64_t>(start) * ld;
    const float* g = dout + static_cast<int64_t>(start) * C;
    ds.resize(static_cast<size_t>(L) * L);
    for (int h = 0; h < NH; ++h) {
      const float* a = att + static_cast<int64_t>(h) * L * L;
      // dV (L,HD) += aᵀ · dO
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, L, HD, L, 1.0f, a, L, g + h * HD, C,
                  1.0f, dbase + y.v(h), ld);
      // dP (L,L) = dO · Vᵀ
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, L, L, HD, 1.0f, g + h * HD, C,
                  base + y.v(h), ld, 0.0f, ds.data(), L);
      // dS = a ⊙ (dP − rowsum(a ⊙ dP)); masked entries have a = 0.
      for (int i = 0; i < L; ++i) {
        const float* p = a + static_cast<int64_t>(i) * L;
        float* d = ds.data() + static_cast<int64_t>(i) * L;
        const int n = causal ? i + 1 : L;
        double dot = 0;
        for (int j = 0; j < n; ++j) dot += static_cast<double>(p[j]) * d[j];
        for (int j = 0; j < n; ++j) d[j] = p[j] * (d[j] - static_cast<float>(dot));
        for (int j = n; j < L; ++j) d[j] = 0.0f;
      }
      // dQ += scale · dS · K ; dK += scale · dSᵀ · Q
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, L, HD, L, scale, ds.data(), L,
                  base + y.k(h), ld, 1.0f, dbase + y.q(h), ld);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, L, HD, L, scale, ds.data(), L,
                  base + y.q(h), ld, 1.0f, dbase + y.k(h), ld);
    }
    att += static_cast<int64_t>(NH) * L * L;
  }
}

namespace {

// sc (br, bc) = scale · Q[i0, i0 + br) · K[j0, j0 + bc)ᵀ of head h (its
// key/value group's keys), rows of `base` one sequence's qkv.
void BlockScores(float* sc, const float* base, const Layout& y, int h, int i0, int br, int j0,
                 int bc, float scale) {
  const int ld = static_cast<int>(y.ld);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, br, bc, static_cast<int>(y.hd), scale,
              base + static_cast<int64_t>(i0) * ld + y.q(h), ld,
              base + static_cast<int64_t>(j0) * ld + y.k(h), ld, 0.0f, sc, bc);
}

}  // namespace

void flash_attention_forward(float* out, float* lse, const float* qkv, const int32_t* cu_seqlens,
                             int S, int NH, int NKV, int HD, bool causal, bool bf16) {
  const Layout y(NH, NKV, HD);
  const int C = NH * HD, ld = static_cast<int>(y.ld), B = kFlashBlock;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  std::vector<float> sc(static_cast<size_t>(B) * B), m(B), l(B);
  for (int s = 0; s < S; ++s) {
    const int start = cu_seqlens[s], L = cu_seqlens[s + 1] - cu_seqlens[s];
    const float* base = qkv + static_cast<int64_t>(start) * ld;
    for (int h = 0; h < NH; ++h) {
      for (int i0 = 0; i0 < L; i0 += B) {
        const int br = std::min(B, L - i0);
        float* o = out + static_cast<int64_t>(start + i0) * C + h * HD;
        for (int i = 0; i < br; ++i)
          std::fill(o + static_cast<int64_t>(i) * C, o + i * C + HD, 0.f);
        std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
        std::fill(l.begin(), l.end(), 0.0f);
        const int j_end = causal ? i0 + br : L;
        for (int j0 = 0; j0 < j_end; j0 += B) {
          const int bc = std::min(B, j_end - j0);
          BlockScores(sc.data(), base, y, h, i0, br, j0, bc, scale);
          for (int i = 0; i < br; ++i) {
            float* row = sc.data() + static_cast<int64_t>(i) * bc;
            const int n = causal ? std::min(bc, i0 + i - j0 + 1) : bc;  // keys this row sees
            float mx = m[i];
            for (int j = 0; j < n; ++j) mx = std::max(mx, row[j]);
            const float corr = std::exp(m[i] - mx);  // 0 on the first block (m = -inf)
            float sum = 0;
            for (int j = 0; j < n; ++j) sum += row[j] = std::exp(row[j] - mx);
            if (bf16) {  // P·V takes P in bf16; the sum is the fp32 P's
              for (int j = 0; j < n; ++j) row[j] = RoundToBf16(row[j]);
            }
            for (int j = n; j < bc; ++j) row[j] = 0.0f;
            l[i] = l[i] * corr + sum;
            m[i] = mx;
            float* orow = o + static_cast<int64_t>(i) * C;
            for (int d = 0; d < HD; ++d) orow[d] *= corr;
          }
          // O_i += P · V_j
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, br, HD, bc, 1.0f, sc.data(), bc,
                      base + static_cast<int64_t>(j0) * ld + y.v(h), ld, 1.0f, o, C);
        }
        for (int i = 0; i < br; ++i) {
          const float inv = 1.0f / l[i];
          float* orow = o + static_cast<int64_t>(i) * C;
          for (int d = 0; d < HD; ++d) orow[d] *= inv;
          lse[static_cast<int64_t>(start + i0 + i) * NH + h] = m[i] + std::log(l[i]);
        }
      }
    }
  }
}

void flash_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, const int32_t* cu_seqlens, int S, int NH, int NKV,
                              int HD, bool causal, bool bf16) {
  const Layout y(NH, NKV, HD);
  const int C = NH * HD, ld = static_cast<int>(y.ld), B = kFlashBlock;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  std::vector<float> p(static_cast<size_t>(B) * B), dp(static_cast<size_t>(B) * B), dsum(B);
  // Under bf16: the block's dO rounded (ld HD), P rounded (B x B).
  std::vector<float> g16(bf16 ? static_cast<size_t>(B) * HD : 0), p16(bf16 ? p.size() : 0);
  for (int s = 0; s < S; ++s) {
    const int start = cu_seqlens[s], L = cu_seqlens[s + 1] - cu_seqlens[s];
    const float* base = qkv + static_cast<int64_t>(start) * ld;
    float* dbase = dqkv + static_cast<int64_t>(start) * ld;
    const float* g = dout + static_cast<int64_t>(start) * C;
    const float* ob = out + static_cast<int64_t>(start) * C;
    for (int h = 0; h < NH; ++h) {
      for (int i0 = 0; i0 < L; i0 += B) {
        const int br = std::min(B, L - i0);
        // D_i = rowsum(dO_i ⊙ O_i), of the dO that dP = dO · Vᵀ takes (so
        // that rowsum(dS) stays 0 to rounding)
        for (int i = 0; i < br; ++i) {
          const float* gi = g + static_cast<int64_t>(i0 + i) * C + h * HD;
          const float* oi = ob + static_cast<int64_t>(i0 + i) * C + h * HD;
          double d = 0;
          for (int e = 0; e < HD; ++e) {
            const float ge = bf16 ? RoundToBf16(gi[e]) : gi[e];
            if (bf16) g16[static_cast<size_t>(i) * HD + e] = ge;
            d += static_cast<double>(ge) * oi[e];
          }
          dsum[i] = static_cast<float>(d);
        }
        // dO_i as the GEMMs take it.
        const float* gb = bf16 ? g16.data() : g + static_cast<int64_t>(i0) * C + h * HD;
        const int gld = bf16 ? HD : C;
        const int j_end = causal ? i0 + br : L;
        for (int j0 = 0; j0 < j_end; j0 += B) {
          const int bc = std::min(B, j_end - j0);
          // P = exp(scale · Q_i · K_jᵀ − lse_i), 0 where masked
          BlockScores(p.data(), base, y, h, i0, br, j0, bc, scale);
          for (int i = 0; i < br; ++i) {
            float* row = p.data() + static_cast<int64_t>(i) * bc;
            const int n = causal ? std::min(bc, i0 + i - j0 + 1) : bc;
            const float li = lse[static_cast<int64_t>(start + i0 + i) * NH + h];
            for (int j = 0; j < n; ++j) row[j] = std::exp(row[j] - li);
            for (int j = std::max(n, 0); j < bc; ++j) row[j] = 0.0f;
          }
          if (bf16) {
            for (int64_t k = 0; k < static_cast<int64_t>(br) * bc; ++k) p16[k] = RoundToBf16(p[k]);
          }
          // dV_j += Pᵀ · dO_i
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, bc, HD, br, 1.0f,
                      bf16 ? p16.data() : p.data(), bc, gb, gld, 1.0f,
                      dbase + static_cast<int64_t>(j0) * ld + y.v(h), ld);
          // dP = dO_i · V_jᵀ ; dS = P ⊙ (dP − D_i)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, br, bc, HD, 1.0f, gb, gld,
                      base + static_cast<int64_t>(j0) * ld + y.v(h), ld, 0.0f, dp.data(), bc);
          for (int i = 0; i < br; ++i) {
            for (int j = 0; j < bc; ++j) {
              const int64_t k = static_cast<int64_t>(i) * bc + j;
              dp[k] = p[k] * (dp[k] - dsum[i]);
              if (bf16) dp[k] = RoundToBf16(dp[k]);
            }
          }
          // dQ_i += scale · dS · K_j ; dK_j += scale · dSᵀ · Q_i
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, br, HD, bc, scale, dp.data(), bc,
                      base + static_cast<int64_t>(j0) * ld + y.k(h), ld, 1.0f,
                      dbase + static_cast<int64_t>(i0) * ld + y.q(h), ld);
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, bc, HD, br, scale, dp.data(), bc,
                      base + static_cast<int64_t>(i0) * ld + y.q(h), ld, 1.0f,
                      dbase + static_cast<int64_t>(j0) * ld + y.k(h), ld);
        }
      }
    }
  }
}

}  // namespace loom::kernels
