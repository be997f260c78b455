// Runs one kernel body of apple_track/metal/ on the CPU (see metal_on_cpu.h), float32.
//   run_kernel matmul <naive|threadgroup_tiled|simdgroup> M K N in.bin out.bin
//        in.bin: a (M, K) then b (K, N); out.bin: c (M, N)
//   run_kernel attention B H Sq Sk D causal scale in.bin out.bin
//        in.bin: q (B, H, Sq, D), k, v (B, H, Sk, D); out.bin: o (B, H, Sq, D); D in {16, 32, 64}
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "metal_on_cpu.h"

#define ATTRS                                                                        \
    [[maybe_unused]] uint3 thread_position_in_grid = at.thread_position_in_grid;     \
    [[maybe_unused]] uint3 thread_position_in_threadgroup =                          \
        at.thread_position_in_threadgroup;                                           \
    [[maybe_unused]] uint3 threadgroup_position_in_grid = at.threadgroup_position_in_grid; \
    [[maybe_unused]] uint thread_index_in_threadgroup = at.thread_index_in_threadgroup;     \
    [[maybe_unused]] uint simdgroup_index_in_threadgroup = at.simdgroup_index_in_threadgroup;

template <typename T>
void naive(const T* a, const int* a_shape, const T* b, const int* b_shape, T* c, const Attrs& at) {
    ATTRS
#include "../../../apple_track/metal/matmul_01_naive.metal"
}
template <typename T>
void tiled(const T* a, const int* a_shape, const T* b, const int* b_shape, T* c, const Attrs& at) {
    ATTRS
#include "../../../apple_track/metal/matmul_02_threadgroup_tiled.metal"
}
template <typename T>
void simd(const T* a, const int* a_shape, const T* b, const int* b_shape, T* c, const Attrs& at) {
    ATTRS
#include "../../../apple_track/metal/matmul_03_simdgroup.metal"
}
template <typename T, int D, int BQ, int BKV, bool CAUSAL>
void flash(const T* q, const int* q_shape, const T* k, const int* k_shape, const T* v,
           const float* scale, T* o, const Attrs& at) {
    ATTRS
#include "../../../apple_track/metal/attention_01_flash.metal"
}

static std::vector<float> read(const char* path, size_t n) {
    std::vector<float> x(n);
    std::ifstream f(path, std::ios::binary);
    f.read(reinterpret_cast<char*>(x.data()), static_cast<std::streamsize>(n * sizeof(float)));
    if (!f) { std::fprintf(stderr, "short read from %s\n", path); std::exit(2); }
    return x;
}
static void write(const char* path, const std::vector<float>& x) {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(x.data()), static_cast<std::streamsize>(x.size() * sizeof(float)));
}
static unsigned ceil_to(unsigned n, unsigned m) { return (n + m - 1) / m * m; }

template <int D, bool CAUSAL>
void run_flash(int B, int H, int Sq, int Sk, float scale, const std::vector<float>& in, std::vector<float>& out) {
    constexpr int BQ = 32, BKV = (2048 / D < 32) ? 2048 / D : 32;  // as apple_track.metal_kernels
    const float* q = in.data();
    const float* k = q + size_t(B) * H * Sq * D;
    const float* v = k + size_t(B) * H * Sk * D;
    int q_shape[4] = {B, H, Sq, D}, k_shape[4] = {B, H, Sk, D};
    dispatch_threads({ceil_to(Sq, BQ), unsigned(B * H), 1}, {BQ, 1, 1}, [&](const Attrs& at) {
        flash<float, D, BQ, BKV, CAUSAL>(q, q_shape, k, k_shape, v, &scale, out.data(), at);
    });
}

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    std::string what = argv[1];
    if (what == "matmul" && argc == 8) {
        std::string kernel = argv[2];
        int M = std::atoi(argv[3]), K = std::atoi(argv[4]), N = std::atoi(argv[5]);
        auto in = read(argv[6], size_t(M) * K + size_t(K) * N);
        const float* a = in.data();
        const float* b = a + size_t(M) * K;
        std::vector<float> c(size_t(M) * N, std::nanf(""));
        int a_shape[2] = {M, K}, b_shape[2] = {K, N};
        // Grids and threadgroups exactly as apple_track.metal_kernels.matmul launches them.
        if (kernel == "naive")
            dispatch_threads({unsigned(N), unsigned(M), 1}, {16, 16, 1},
                             [&](const Attrs& at) { naive<float>(a, a_shape, b, b_shape, c.data(), at); });
        else if (kernel == "threadgroup_tiled")
            dispatch_threads({ceil_to(N, 16), ceil_to(M, 16), 1}, {16, 16, 1},
                             [&](const Attrs& at) { tiled<float>(a, a_shape, b, b_shape, c.data(), at); });
        else if (kernel == "simdgroup")
            dispatch_threads({ceil_to(N, 32) / 32 * 128, ceil_to(M, 32) / 32, 1}, {128, 1, 1},
                             [&](const Attrs& at) { simd<float>(a, a_shape, b, b_shape, c.data(), at); });
        else return 2;
        write(argv[7], c);
        return 0;
    }
    if (what == "attention" && argc == 11) {
        int B = std::atoi(argv[2]), H = std::atoi(argv[3]), Sq = std::atoi(argv[4]);
        int Sk = std::atoi(argv[5]), D = std::atoi(argv[6]);
        bool causal = std::atoi(argv[7]) != 0;
        float scale = std::strtof(argv[8], nullptr);
        auto in = read(argv[9], size_t(B) * H * (Sq + 2 * Sk) * D);
        std::vector<float> o(size_t(B) * H * Sq * D, std::nanf(""));
        if (D == 16) causal ? run_flash<16, true>(B, H, Sq, Sk, scale, in, o) : run_flash<16, false>(B, H, Sq, Sk, scale, in, o);
        else if (D == 32) causal ? run_flash<32, true>(B, H, Sq, Sk, scale, in, o) : run_flash<32, false>(B, H, Sq, Sk, scale, in, o);
        else if (D == 64) causal ? run_flash<64, true>(B, H, Sq, Sk, scale, in, o) : run_flash<64, false>(B, H, Sq, Sk, scale, in, o);
        else return 2;
        write(argv[10], o);
        return 0;
    }
    std::fprintf(stderr, "usage: see the comment at the top of run_kernel.cpp\n");
    return 2;
}
