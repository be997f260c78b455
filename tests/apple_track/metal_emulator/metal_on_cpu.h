// A CPU stand-in for the parts of the Metal Shading Language the kernels in apple_track/metal/
// use, so their bodies compile as C++ and run: every thread of a threadgroup is a std::thread,
// threadgroup_barrier is a std::barrier, threadgroup variables are function statics (one
// threadgroup runs at a time), and a simdgroup matrix is a full 8 x 8 array that each thread of
// the simdgroup computes redundantly (same values as the hardware's distributed fragment).
// It checks the kernels' index arithmetic, tiling, masking and online softmax; it says nothing
// about Metal compilation, occupancy or speed.
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

#define threadgroup static
#define device
#define constant
using std::exp;
using std::max;
using std::min;

struct uint3 {
    unsigned x, y, z;
};
typedef unsigned uint;
enum class mem_flags { mem_threadgroup };

inline thread_local std::barrier<>* current_barrier = nullptr;
inline void threadgroup_barrier(mem_flags) { current_barrier->arrive_and_wait(); }

template <typename T, int C, int R>
struct simdgroup_matrix {
    T v[R][C];
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;

template <typename T, int C, int R>
simdgroup_matrix<T, C, R> make_filled_simdgroup_matrix(T x) {
    simdgroup_matrix<T, C, R> m;
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) m.v[r][c] = x;
    return m;
}
template <typename T, int C, int R>
void simdgroup_load(simdgroup_matrix<T, C, R>& m, const T* src, unsigned long row_stride) {
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) m.v[r][c] = src[r * row_stride + c];
}
template <typename T, int C, int R>
void simdgroup_store(const simdgroup_matrix<T, C, R>& m, T* dst, unsigned long row_stride) {
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) dst[r * row_stride + c] = m.v[r][c];
}
template <typename T, int N>
void simdgroup_multiply_accumulate(simdgroup_matrix<T, N, N>& d, const simdgroup_matrix<T, N, N>& a,
                                   const simdgroup_matrix<T, N, N>& b,
                                   const simdgroup_matrix<T, N, N>& c) {
    simdgroup_matrix<T, N, N> out;  // d may alias c
    for (int i = 0; i < N; ++i)
        for (int j = 0; j < N; ++j) {
            T s = c.v[i][j];
            for (int k = 0; k < N; ++k) s += a.v[i][k] * b.v[k][j];
            out.v[i][j] = s;
        }
    d = out;
}

struct Attrs {
    uint3 thread_position_in_grid, thread_position_in_threadgroup, threadgroup_position_in_grid;
    uint thread_index_in_threadgroup, simdgroup_index_in_threadgroup;
};

// dispatchThreads(grid, group): groups run one after another, the threads of a group together;
// threads past the grid's edge do not exist (Metal's non-uniform threadgroups).
inline void dispatch_threads(uint3 grid, uint3 group, const std::function<void(const Attrs&)>& body) {
    for (uint gz = 0; gz * group.z < grid.z; ++gz)
        for (uint gy = 0; gy * group.y < grid.y; ++gy)
            for (uint gx = 0; gx * group.x < grid.x; ++gx) {
                std::vector<Attrs> threads;
                for (uint lz = 0; lz < group.z; ++lz)
                    for (uint ly = 0; ly < group.y; ++ly)
                        for (uint lx = 0; lx < group.x; ++lx) {
                            uint3 pos{gx * group.x + lx, gy * group.y + ly, gz * group.z + lz};
                            if (pos.x >= grid.x || pos.y >= grid.y || pos.z >= grid.z) continue;
                            uint linear = (lz * group.y + ly) * group.x + lx;
                            threads.push_back({pos, {lx, ly, lz}, {gx, gy, gz}, linear, linear / 32});
                        }
                std::barrier<> bar(static_cast<std::ptrdiff_t>(threads.size()));
                std::vector<std::thread> workers;
                for (const Attrs& a : threads)
                    workers.emplace_back([&bar, &body, a] {
                        current_barrier = &bar;
                        body(a);
                    });
                for (auto& w : workers) w.join();
            }
}
