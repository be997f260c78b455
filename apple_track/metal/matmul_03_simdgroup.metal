// Step 3 of the matmul ladder: simdgroup matrices, Apple GPUs' counterpart of CUDA's warp-level
// mma (project01's tensor-core step). A threadgroup of 4 simdgroups (128 threads) computes a
// 32 x 32 tile of c; each simdgroup owns a 16 x 16 quarter as 2 x 2 fragments of 8 x 8, which
// simdgroup_multiply_accumulate updates from 8 x 8 fragments of the a and b tiles staged in
// threadgroup memory. Tiles are staged as float32 whatever T is, so fragments, products and
// accumulators are all float32.
//
// Body for mx.fast.metal_kernel (inputs a, b; output c; template T).
// Launch: grid (ceil(N/32)*128, ceil(M/32), 1) threads, threadgroup (128, 1, 1).

constexpr int BM = 32;
constexpr int BN = 32;
constexpr int BK = 16;
constexpr int NT = 128;  // threads per threadgroup
threadgroup float As[BM * BK];  // (BM, BK) row-major
threadgroup float Bs[BK * BN];  // (BK, BN) row-major
threadgroup float Cs[BM * BN];  // (BM, BN): the tile on its way out, for the edge masking

const int M = a_shape[0];
const int K = a_shape[1];
const int N = b_shape[1];
const int row0 = int(threadgroup_position_in_grid.y) * BM;
const int col0 = int(threadgroup_position_in_grid.x) * BN;
const int tid = int(thread_index_in_threadgroup);
const int sg = int(simdgroup_index_in_threadgroup);  // 0..3
const int sr = (sg / 2) * 16;  // this simdgroup's quarter of the tile
const int sc = (sg % 2) * 16;

simdgroup_float8x8 acc[2][2];
for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
        acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    }
}

for (int k0 = 0; k0 < K; k0 += BK) {
    // Cooperative loads: 128 threads, 512 elements each tile; zero outside the matrices.
    for (int e = tid; e < BM * BK; e += NT) {
        const int r = e / BK;
        const int kc = e % BK;
        const int gr = row0 + r;
        const int gk = k0 + kc;
        As[e] = (gr < M && gk < K) ? float(a[gr * K + gk]) : 0.0f;
    }
    for (int e = tid; e < BK * BN; e += NT) {
        const int kr = e / BN;
        const int cc = e % BN;
        const int gk = k0 + kr;
        const int gc = col0 + cc;
        Bs[e] = (gk < K && gc < N) ? float(b[gk * N + gc]) : 0.0f;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    for (int kk = 0; kk < BK; kk += 8) {
        simdgroup_float8x8 af[2];
        simdgroup_float8x8 bf[2];
        for (int i = 0; i < 2; ++i) {
            simdgroup_load(af[i], As + (sr + 8 * i) * BK + kk, BK);
        }
        for (int j = 0; j < 2; ++j) {
            simdgroup_load(bf[j], Bs + kk * BN + sc + 8 * j, BN);
        }
        for (int i = 0; i < 2; ++i) {
            for (int j = 0; j < 2; ++j) {
                simdgroup_multiply_accumulate(acc[i][j], af[i], bf[j], acc[i][j]);
            }
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
}

for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
        simdgroup_store(acc[i][j], Cs + (sr + 8 * i) * BN + sc + 8 * j, BN);
    }
}
threadgroup_barrier(mem_flags::mem_threadgroup);
for (int e = tid; e < BM * BN; e += NT) {
    const int gr = row0 + e / BN;
    const int gc = col0 + e % BN;
    if (gr < M && gc < N) {
        c[gr * N + gc] = T(Cs[e]);
    }
}
