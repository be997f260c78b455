// Fused attention forward, FlashAttention style (project01's flash_attention, on Apple GPUs):
// o = softmax(scale * q k^T [+ causal mask]) v without ever writing the (S_q, S_k) score matrix.
// A threadgroup of BQ threads takes BQ query rows of one (batch, head); each thread keeps its
// query row and its output accumulator in registers. Blocks of BKV keys and values are staged
// in threadgroup memory and folded in with the online softmax: a running max m and running
// sum l, the accumulator rescaled by exp(m_old - m_new) whenever the max grows.
//
// Body for mx.fast.metal_kernel. Inputs q (B, H, S_q, D), k and v (B, H, S_k, D) row-major,
// scale (1,) float32; output o (B, H, S_q, D). Template: T, D (head dim), BQ, BKV, CAUSAL
// (top-left aligned, S_q == S_k). Launch: grid (ceil(S_q/BQ)*BQ, B*H, 1), threadgroup (BQ, 1, 1).

threadgroup float Ks[BKV * D];
threadgroup float Vs[BKV * D];

const int Sq = q_shape[2];
const int Sk = k_shape[2];
const int bh = int(threadgroup_position_in_grid.y);  // batch * H + head
const int t = int(thread_position_in_threadgroup.x);  // 0 .. BQ-1
const int q0 = int(threadgroup_position_in_grid.x) * BQ;
const int qi = q0 + t;
const bool valid = qi < Sq;
const float sm_scale = scale[0];

float qr[D];
float acc[D];
for (int d = 0; d < D; ++d) {
    // Fold the softmax scale into q once, rather than into every score.
    qr[d] = valid ? float(q[(bh * Sq + qi) * D + d]) * sm_scale : 0.0f;
    acc[d] = 0.0f;
}
// A large finite start (not -inf) keeps exp(m - m_new) exact under fast-math exp.
float m = -1.0e30f;
float l = 0.0f;

// Causal: no query of this block looks past key q0 + BQ - 1.
const int kv_end = CAUSAL ? min(Sk, q0 + BQ) : Sk;
for (int k0 = 0; k0 < kv_end; k0 += BKV) {
    for (int e = t; e < BKV * D; e += BQ) {
        const int j = k0 + e / D;
        const int dd = e % D;
        Ks[e] = j < Sk ? float(k[(bh * Sk + j) * D + dd]) : 0.0f;
        Vs[e] = j < Sk ? float(v[(bh * Sk + j) * D + dd]) : 0.0f;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    const int n = min(BKV, Sk - k0);
    for (int r = 0; r < n; ++r) {
        if (CAUSAL && k0 + r > qi) {
            break;  // keys only grow along the loop: every later one is masked too
        }
        float s = 0.0f;
        for (int d = 0; d < D; ++d) {
            s += qr[d] * Ks[r * D + d];
        }
        const float m_new = max(m, s);
        const float corr = exp(m - m_new);
        const float p = exp(s - m_new);
        l = l * corr + p;
        for (int d = 0; d < D; ++d) {
            acc[d] = acc[d] * corr + p * Vs[r * D + d];
        }
        m = m_new;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
}

if (valid) {
    const float inv_l = 1.0f / l;
    for (int d = 0; d < D; ++d) {
        o[(bh * Sq + qi) * D + d] = T(acc[d] * inv_l);
    }
}
