// CPU peaks for the benchmarks (tools/bench_peaks.h).
#include "tools/bench_peaks.h"

#include <dlfcn.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <sstream>
#include <vector>

#include "cpu/expert_kernels.h"
#include "cpu/expert_kernels_impl.h"
#include "storage/error.h"

namespace strata::tools {

void stream_read(cpu::PinnedArena& arena, const uint8_t* buf, size_t bytes) {
  static const bool avx512 = cpu::isa_supported(cpu::ExpertIsa::avx512);
  const size_t chunk = size_t(4) << 20;  // 4 MiB per task
  static volatile uint64_t sink = 0;
  arena.arena().execute([&] {
    tbb::parallel_for(size_t(0), bytes / chunk, [&](size_t c) {
      const uint8_t* q = buf + c * chunk;
      uint64_t v = 0;
      if (avx512) {
        v = cpu::detail::stream_read_avx512(q, chunk);
      } else {
        const uint64_t* w = reinterpret_cast<const uint64_t*>(q);
        for (size_t i = 0; i < chunk / 8; i += 4) v += w[i] ^ w[i + 1] ^ w[i + 2] ^ w[i + 3];
      }
      sink = sink + v;
    });
  });
}

double measure_read_gbps(cpu::PinnedArena& arena, const cpu::Topology& topo, size_t bytes,
                         int repeats, BenchReport& rep) {
  std::string note;
  const offload::RateSample s =
      offload::measure_host_read(arena.arena(), topo, bytes, repeats, &note);
  BenchLine l;
  l.name = "memory read (peak)";
  l.shape =
      std::to_string(bytes >> 20) + " MiB stream, " + std::to_string(arena.threads()) + " thr";
  l.time = {s.median_s, s.min_s, s.max_s, s.repeats};
  l.bytes = s.bytes;
  l.peak_name = "itself";
  l.peak = l.gbps();
  l.note = note;
  rep.add(l);
  return l.gbps();
}

namespace {
// oneDNN (OpenMP inside) gets as many threads as the benchmark; libgomp is already loaded with
// libdnnl, so its setter is found at run time (no -fopenmp needed here).
void set_omp_threads(int n) {
  using Fn = void (*)(int);
  if (auto f = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"))) f(n);
}
}  // namespace

double measure_bf16_tflops(int64_t M, int64_t N, int64_t K, int threads, int repeats,
                           BenchReport& rep, const std::string& what) {
  using namespace dnnl;
  using dt = memory::data_type;
  using tag = memory::format_tag;
  set_omp_threads(threads);
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  const memory::dims ad{M, K}, bd{K, N}, cd{M, N};
  auto pd = matmul::primitive_desc(
      matmul::desc(memory::desc(ad, dt::bf16, tag::ab), memory::desc(bd, dt::bf16, tag::any),
                   memory::desc(cd, dt::f32, tag::ab)),
      eng);
  memory a(pd.src_desc(), eng), b_user({bd, dt::bf16, tag::ab}, eng), b(pd.weights_desc(), eng),
      c(pd.dst_desc(), eng);
  // bf16 0x3F80 = 1.0 with small random low bits: finite values, no denormals.
  auto* pa = static_cast<uint16_t*>(a.get_data_handle());
  for (size_t i = 0; i < size_t(M) * size_t(K); ++i)
    pa[i] = uint16_t(0x3F80 | (i * 2654435761u >> 28));
  auto* pb = static_cast<uint16_t*>(b_user.get_data_handle());
  for (size_t i = 0; i < size_t(K) * size_t(N); ++i)
    pb[i] = uint16_t(0x3F80 | (i * 2654435761u >> 28));
  reorder(b_user, b).execute(s, b_user, b);  // pack once (format_tag::any)
  s.wait();
  matmul mm(pd);
  auto run = [&] {
    mm.execute(s, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    s.wait();
  };
  BenchLine l;
  l.name = "oneDNN bf16 matmul (peak)";
  const std::string dims =
      M == N && N == K ? std::to_string(N) + "^3"
                       : std::to_string(M) + "x" + std::to_string(K) + "x" + std::to_string(N);
  l.shape =
      (what.empty() ? dims : what + " " + dims) + " bf16->f32, " + std::to_string(threads) + " thr";
  l.time = measure(run, repeats, 1);
  l.flops = 2.0 * double(M) * double(N) * double(K);
  l.peak_is_bandwidth = false;
  // The peak is the best repeat (not the median shown in the line), so that the "% of peak" of
  // the lines compared with it is conservative: this line's own %peak is its median against its
  // best.
  const double best = l.flops / l.time.min_s / 1e12;
  l.peak_name = "best repeat";
  l.peak = best;
  std::ostringstream ss;
  ss.precision(3);
  ss << "peak = best of " << l.time.repeats << " repeats, " << best
     << " TFLOP/s; packed weights; impl " << pd.impl_info_str();
  l.note = ss.str();
  rep.add(l);
  return best;
}

std::pair<BenchStats, BenchStats> measure_interleaved(const std::function<void()>& a,
                                                      const std::function<void()>& b, int repeats) {
  STRATA_ASSERT(repeats > 0);
  a();
  b();
  std::vector<double> ta, tb;
  auto timed = [](const std::function<void()>& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int i = 0; i < repeats; ++i) {
    ta.push_back(timed(a));
    tb.push_back(timed(b));
  }
  auto stats = [&](std::vector<double>& t) {
    std::sort(t.begin(), t.end());
    BenchStats s;
    s.repeats = repeats;
    s.min_s = t.front();
    s.max_s = t.back();
    s.median_s = t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
    return s;
  };
  return {stats(ta), stats(tb)};
}

}  // namespace strata::tools
