// Step 2 of the matmul ladder: 16 x 16 tiles of a and b staged in threadgroup memory (Metal's
// shared memory), so each element is read from device memory once per tile instead of once per
// multiply-add. One thread per output element; float32 accumulation.
//
// Body for mx.fast.metal_kernel (inputs a, b; output c; template T).
// Launch: grid (ceil(N/16)*16, ceil(M/16)*16, 1) threads, threadgroup (16, 16, 1): the grid is
// rounded up so every threadgroup is full and all its threads reach the barriers.

constexpr int TILE = 16;
threadgroup float As[TILE][TILE];  // (rows of c, k)
threadgroup float Bs[TILE][TILE];  // (k, cols of c)

const int M = a_shape[0];
const int K = a_shape[1];
const int N = b_shape[1];
const int tx = int(thread_position_in_threadgroup.x);
const int ty = int(thread_position_in_threadgroup.y);
const int col = int(threadgroup_position_in_grid.x) * TILE + tx;
const int row = int(threadgroup_position_in_grid.y) * TILE + ty;

float acc = 0.0f;
for (int k0 = 0; k0 < K; k0 += TILE) {
    // Out-of-range elements load as zero, so edge tiles need no special case below.
    As[ty][tx] = (row < M && k0 + tx < K) ? float(a[row * K + k0 + tx]) : 0.0f;
    Bs[ty][tx] = (k0 + ty < K && col < N) ? float(b[(k0 + ty) * N + col]) : 0.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int k = 0; k < TILE; ++k) {
        acc += As[ty][k] * Bs[k][tx];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
}
if (row < M && col < N) {
    c[row * N + col] = T(acc);
}
