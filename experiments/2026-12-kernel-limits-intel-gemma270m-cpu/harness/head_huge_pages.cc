// The head from memory on two threads, its buffer on 4 KiB pages (MADV_NOHUGEPAGE) and on
// 2 MiB pages (MADV_HUGEPAGE, with transparent huge pages on 'madvise'), in turns.
// Built as head_from_memory.cc is (run_variants.sh), plus nothing else.
// panel_rows of a kernel source over a head-sized w, 2 threads, with and without huge pages.
#include KERNEL_SOURCE
#include <sys/mman.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
int main() {
  const int64_t I = 640, O = 262144;
  const size_t bytes = O * I * 4;
  for (int turn = 0; turn < 4; ++turn) { int huge = turn % 2;
    float* w = static_cast<float*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (huge) madvise(w, bytes, MADV_HUGEPAGE); else madvise(w, bytes, MADV_NOHUGEPAGE);
    for (int64_t i = 0; i < O * I; ++i) w[i] = (i % 7) * 0.01f;
    for (int N : {1, 2, 5, 9, 12}) {
      std::vector<float> x(N * I, 0.5f), y(N * O);
      double best = 1e9;
      for (int rep = 0; rep < 7; ++rep) {
        auto t0 = std::chrono::steady_clock::now();
        std::thread a([&] { panel_rows(x.data(), w, y.data(), N, O, I, 0, O / 2); });
        std::thread b([&] { panel_rows(x.data(), w, y.data(), N, O, I, O / 2, O); });
        a.join(); b.join();
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (s < best) best = s;
      }
      printf("huge=%d N=%d: %.1f ms\n", huge, N, best * 1e3);
    }
    { FILE* f = fopen("/proc/self/smaps_rollup", "r"); char line[256]; while (fgets(line, 256, f)) if (strstr(line, "AnonHuge")) fputs(line, stdout); fclose(f); }
    munmap(w, bytes);
  }
  FILE* f = fopen("/proc/self/smaps_rollup", "r"); char line[256]; while (fgets(line, 256, f)) if (strstr(line, "AnonHuge")) fputs(line, stdout);
}
