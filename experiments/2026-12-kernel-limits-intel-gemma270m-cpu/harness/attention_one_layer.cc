#include KERNEL_SOURCE
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>
// One layer's attention on one thread: 9 new tokens (or T) at position P over S slots.
int main() {
  for (int T : {1, 5, 9}) {
  for (int local = 0; local < 2; ++local) {
    const int64_t S = 1024, P = 1000, K = 1, G = 4, H = 256, W = 512;
    std::vector<float> q(T * K * G * H), key(S * K * H), value(S * K * H);
    std::mt19937 rng(0); std::normal_distribution<float> nd;
    for (auto& x : q) x = nd(rng) * 0.06f; for (auto& x : key) x = nd(rng); for (auto& x : value) x = nd(rng);
    std::unique_ptr<bool[]> mask(new bool[T * S]);
    for (int t = 0; t < T; ++t) for (int s = 0; s < S; ++s) mask[t * S + s] = s <= P + t && (!local || s > P + t - W);
    Shapes d{1, T, K, G, H, S};
    const int64_t items = d.B * d.K * d.C(), rows = items * d.N();
    std::vector<float> parts(rows * (H + 2)), out(q.size());
    Call call; call.d = d; call.q = q.data(); call.key = key.data(); call.value = value.data();
    call.mask = mask.get(); call.out = out.data(); call.softcap = 0; call.part_max = parts.data();
    call.part_sum = parts.data() + rows; call.part_out = parts.data() + 2 * rows; call.num_items = items;
    double best = 1e9;
    for (int rep = 0; rep < 200; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      if (THREADS == 1) { for (int64_t i = 0; i < items; ++i) call.item(i); }
      else { call.counters.next = 0; call.counters.finished = 0;
        std::thread helper([&] { specjax::claim_items(call); }); specjax::claim_items(call); helper.join(); }
      combine(call);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    double chk = 0; for (float x : out) chk += x;
    printf("%s T=%d %s: %.0f us (check %.4f)\n", NAME, T, local ? "local " : "global", best * 1e6, chk);
  }}
}
