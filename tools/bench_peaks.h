// The CPU peak lines of `strata bench` (STYLE.md §14), measured in the same run: the multi-threaded
// streaming memory read (offload/hw_measure.h's loop) and oneDNN's bf16 matmul at a given shape;
// plus one read pass and interleaved timing, for bandwidth lines on a shared machine.
// Not here: the measurement loops of the hardware profile (offload/hw_measure.h), the GPU peaks
// (kernels/peaks.h), the reporting protocol (tools/bench.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

#include "cpu/topology.h"
#include "offload/hw_measure.h"
#include "tools/bench.h"

namespace strata::tools {

using offload::BoundBuffer;

// One streaming read of `bytes` of buf over the arena's threads (AVX-512 loads where present).
void stream_read(cpu::PinnedArena& arena, const uint8_t* buf, size_t bytes);

// The "memory read (peak)" line: a `bytes` buffer streamed by the arena's threads; returns GB/s
// (median).
double measure_read_gbps(cpu::PinnedArena& arena, const cpu::Topology& topo, size_t bytes,
                         int repeats, BenchReport& rep);

// The "oneDNN bf16 matmul (peak)" line: src [M, K] bf16 × weights [K, N] pre-packed into oneDNN's
// preferred layout (format_tag::any + one reorder), fp32 out, oneDNN's own OpenMP threading with
// `threads` threads. Returns the best repeat in TFLOP/s (the line's own %peak is its median against
// that best). `what` names the shape in the line ("4096^3", "K3 dense gate/up").
double measure_bf16_tflops(int64_t M, int64_t N, int64_t K, int threads, int repeats,
                           BenchReport& rep, const std::string& what = "");

// Runs a() and b() alternately (warm-up once each, then `repeats` pairs), so both see the same
// load on a shared machine; their stats in order.
std::pair<BenchStats, BenchStats> measure_interleaved(const std::function<void()>& a,
                                                      const std::function<void()>& b, int repeats);

}  // namespace strata::tools
