// Step 1 of the matmul ladder: one thread per output element, every operand read from device
// memory. c (M, N) = a (M, K) @ b (K, N), row-major; accumulation in float32.
//
// The body of a kernel for mx.fast.metal_kernel: MLX writes the signature from the names used
// here (inputs a, b and their a_shape / b_shape; output c; the thread-position attributes).
// Template: T (the element type). Launch: grid (N, M, 1) threads, threadgroup (16, 16, 1).

const int M = a_shape[0];
const int K = a_shape[1];
const int N = b_shape[1];
const int col = int(thread_position_in_grid.x);
const int row = int(thread_position_in_grid.y);
if (row >= M || col >= N) {
    return;
}
float acc = 0.0f;
for (int k = 0; k < K; ++k) {
    acc += float(a[row * K + k]) * float(b[k * N + col]);
}
c[row * N + col] = T(acc);
