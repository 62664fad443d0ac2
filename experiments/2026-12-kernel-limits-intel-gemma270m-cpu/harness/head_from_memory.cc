// The head (262,144 x 640, float32, from memory) by a skinny-kernel source's panel_rows on two
// threads, for 1 to 16 rows of x: best of 7 (see run_variants.sh). With the argument `huge` the
// head's buffer asks for 2 MiB pages (MADV_HUGEPAGE, for transparent huge pages on 'madvise'),
// else for 4 KiB ones, and the pages the process got are printed; with `one` a single thread
// computes every row of the head.
#include KERNEL_SOURCE
#include <sys/mman.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  bool huge = false, one = false;
  for (int a = 1; a < argc; ++a) {
    huge |= std::strcmp(argv[a], "huge") == 0;
    one |= std::strcmp(argv[a], "one") == 0;
  }
  const int64_t I = 640, O = 262144;
  const size_t bytes = O * I * 4;
  float* w = static_cast<float*>(
      mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  madvise(w, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  for (int64_t i = 0; i < O * I; ++i) w[i] = (i % 7) * 0.01f;
  printf("%-20s%s%s", NAME, huge ? " huge" : "", one ? " one thread" : "");
  for (int N : {1, 5, 8, 9, 10, 12, 16}) {
    float* x = static_cast<float*>(aligned_alloc(64, N * I * 4));
    for (int i = 0; i < N * I; ++i) x[i] = 0.5f;
    std::vector<float> y(N * O);
    double best = 1e9;
    for (int rep = 0; rep < 7; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      if (one) {
        panel_rows(x, w, y.data(), N, O, I, 0, O);
      } else {
        std::thread a([&] { panel_rows(x, w, y.data(), N, O, I, 0, O / 2); });
        std::thread b([&] { panel_rows(x, w, y.data(), N, O, I, O / 2, O); });
        a.join();
        b.join();
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    free(x);
    printf(" N=%d %5.1f", N, best * 1e3);
  }
  char line[256];
  FILE* f = fopen("/proc/self/smaps_rollup", "r");
  while (f && fgets(line, sizeof(line), f)) if (strstr(line, "AnonHuge")) printf("  %s", line);
  if (f) fclose(f);
  printf("\n");
}
