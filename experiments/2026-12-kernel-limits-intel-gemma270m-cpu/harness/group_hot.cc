// One thread, w in cache: the skinny kernel's group_rows<G, R> for G = 1..8 rows of x,
// the arithmetic alone. -DMATRIX_O=48 (123 KB of w) or 480 (1.2 MB); -DSTAGE=kNoPrefetch (a
// prefetch past the end of a small w costs page walks) or kLevel2.
//   c++ -O3 -std=gnu++17 -ffp-contract=off -march=native -I $(python -c "import jax; print(jax.ffi.include_dir())") \
//     -I specjax/cpu_kernels -DKERNEL_SOURCE='"/abs/skinny_matmul.cc"' -DNAME='"shipped"' -DMATRIX_O=480 \
//     -DSTAGE=kNoPrefetch group_hot.cc
#include KERNEL_SOURCE
#include <chrono>
#include <cstdio>
#include <vector>
template <int G>
void bench(const char* name) {
  const int64_t I = 640, O = MATRIX_O;
  std::vector<float> x(G * I, 0.5f), w(O * I, 0.25f), y(G * O);
  GroupFn fn = group_fn<STAGE>(G);
  double best = 1e9;
  for (int rep = 0; rep < 30; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < 20 * (480 / MATRIX_O); ++k) fn(x.data(), w.data(), y.data(), O, I, 0, O);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / (20 * (480 / MATRIX_O));
    if (s < best) best = s;
  }
  printf("%s G=%d: %.1f GFLOP/s\n", name, G, 2.0 * G * O * I / best / 1e9);
}
int main() { bench<1>(NAME); bench<2>(NAME); bench<4>(NAME); bench<5>(NAME); bench<6>(NAME); bench<7>(NAME); bench<8>(NAME); }
