// engine/cli_support.h.
#include "engine/cli_support.h"

#include <sys/resource.h>
#include <tbb/global_control.h>
#include <tbb/info.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "engine/cpu_fast_backend.h"
#include "engine/cuda_backend.h"
#include "engine/offload_executor.h"
#include "kernels/runtime.h"
#include "storage/error.h"
#include "storage/files.h"

namespace strata::engine {

Precision parse_precision(const std::string& s) {
  if (s == "fp32") return Precision::fp32;
  if (s == "bf16") return Precision::bf16;
  throw Error("--precision: expected fp32 or bf16, got '" + s + "'");
}

const char* precision_name(Precision p) {
  return p == Precision::fp32 ? "fp32" : "bf16";
}

std::vector<int32_t> read_ids_file(const std::filesystem::path& file, int vocab_size) {
  const std::string where = "--ids " + file.string() + ": ";
  const std::string text = read_small_file(file, "--ids " + file.string());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + "not valid JSON (" + std::string(e.what()) +
                "); expected an array of token ids like [1, 2, 3]");
  }
  if (!j.is_array()) throw Error(where + "expected a JSON array of token ids like [1, 2, 3]");
  if (j.empty()) throw Error(where + "empty prompt: the array holds no token ids");
  std::vector<int32_t> ids;
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& e = j[i];
    if (!e.is_number_integer())
      throw Error(where + "element " + std::to_string(i) + " (" + e.dump() +
                  ") is not an integer token id");
    const int64_t v = e.get<int64_t>();
    if (v < 0 || v >= vocab_size)
      throw Error(where + "token id " + std::to_string(v) + " at index " + std::to_string(i) +
                  " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
    ids.push_back(int32_t(v));
  }
  return ids;
}

void check_device(const std::string& d) {
  if (d != "auto" && d != "cpu" && d != "cpu-ref" && d != "gpu")
    throw Error("--device: expected auto, cpu, cpu-ref or gpu, got '" + d + "'");
}

int check_thread_count(const std::string& flag, int n) {
  const int hw = std::max(1, int(std::thread::hardware_concurrency()));
  if (n < 0 || n > hw)
    throw Error(flag + " " + std::to_string(n) + ": expected 0 (all) or 1.." + std::to_string(hw) +
                ", the hardware threads of this machine");
  return n;
}

bool parse_experts_quantize(const std::string& v) {
  if (!v.empty() && v != "mxfp4")
    throw Error("--experts-quantize: expected mxfp4, got '" + v + "'");
  return !v.empty();
}

LoadOptions load_options(const InspectOptions& o) {
  // The GPU flags, whatever device runs (a malformed value is an error on every machine; every
  // command calls this before loading).
  if (!o.gpu_mem.empty()) parse_size(o.gpu_mem, 0, "--gpu-mem");
  if (!o.gpu_experts.empty()) parse_gpu_expert_share(o.gpu_experts);
  if (o.max_context < 1 || o.max_context > (int64_t(1) << 30))
    throw Error("--max-context " + std::to_string(o.max_context) + ": expected 1..2^30 positions");
  if (o.max_step_rows < 1 || o.max_step_rows > (1 << 20))
    throw Error("--max-step-rows " + std::to_string(o.max_step_rows) + ": expected 1..1048576");
  std::error_code ec;
  if (!o.hardware.empty() && !std::filesystem::is_regular_file(o.hardware, ec))
    throw Error("--hardware " + o.hardware + ": not found (a `strata bench hw --save` profile)");
  LoadOptions lo;
  lo.quantize_experts = parse_experts_quantize(o.experts_quantize);
  lo.check_weights = o.check_weights;
  lo.progress = true;
  return lo;
}

void check_before_load(const InspectOptions& o, const OffloadOptions* offload,
                       const std::string& model_dir, const std::vector<std::string>& inputs,
                       std::vector<std::pair<std::string, std::string>> outputs) {
  parse_precision(o.precision);
  load_options(o);  // --experts-quantize
  if (!o.experts_quantize.empty() && offload && offload->enabled())
    throw Error(
        "--host-mem with --experts-quantize: the disk tier reads the checkpoint's bf16 experts; "
        "quantized experts all stay in host memory (drop --host-mem)");
  if (o.experts_numerics != "auto") parse_expert_numerics(o.experts_numerics);
  check_device(o.device);
  gpu_promote_interval(o.gpu_promote);
  check_thread_count("--threads", o.threads);
  if (o.stop_after_layer < -1)
    throw Error("--stop-after-layer " + std::to_string(o.stop_after_layer) +
                ": expected a layer number >= 0");
  if (!o.dump_sites.empty()) Dumper check(o.dump_sites);  // a bad regex fails now
  std::vector<std::filesystem::path> in(inputs.begin(), inputs.end());
  if (!o.replay_routing.empty()) in.push_back(o.replay_routing);
  const std::vector<FileId> ids = input_file_ids(model_dir, in);
  if (!o.record_routing.empty()) outputs.emplace_back("--record-routing", o.record_routing);
  if (!o.dump_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.dump_dir, ec);
    if (ec || !std::filesystem::is_directory(o.dump_dir))
      throw Error("--dump " + o.dump_dir + ": cannot create the directory" +
                  (ec ? ": " + ec.message() : ""));
    outputs.emplace_back("--dump",
                         (std::filesystem::path(o.dump_dir) / "dump.safetensors").string());
  }
  if (offload) {
    // The config alone (a few KB) is enough to check the budget; a model directory that is not
    // there is reported by the loader with its usual message.
    const std::filesystem::path dir(model_dir);
    const std::filesystem::path cfg =
        std::filesystem::is_directory(dir) ? dir / "config.json" : dir;
    if (std::filesystem::exists(cfg)) check_offload_options(*offload, load_config(cfg));
  }
  check_outputs(outputs, ids);
}

void check_outputs(const std::vector<std::pair<std::string, std::string>>& outputs,
                   const std::vector<FileId>& inputs) {
  std::vector<std::filesystem::path> seen;
  for (const auto& [flag, path] : outputs) {
    if (path.empty()) continue;
    OutputPath out(flag, path, inputs);
    const std::filesystem::path abs = std::filesystem::weakly_canonical(path);
    for (const auto& s : seen)
      if (s == abs) throw Error(flag + " " + path + ": another output option writes the same file");
    seen.push_back(abs);
  }
}

double parse_gpu_expert_share(const std::string& v) {
  char* end = nullptr;
  double share = std::strtod(v.c_str(), &end);
  if (end && *end == '%') share /= 100.0, ++end;
  if (v.empty() || !end || *end || !(share >= 0.0 && share <= 1.0))
    throw Error("--gpu-experts: expected a share of the routed experts like 10% or 0.1, got '" + v +
                "'");
  return share;
}

int gpu_promote_interval(const std::string& v) {
  if (v == "off") return 0;
  if (v == "on") return CudaBackendOptions{}.promote_interval;
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || !end || *end || n < 1 || n > 1000000)
    throw Error("--gpu-promote: expected on, off or a step interval 1..1000000, got '" + v + "'");
  return int(n);
}

SessionSetup::SessionSetup(const InspectOptions& o, const ModelConfig& c, PositionRange positions)
    : in_(o) {
  opt_.precision = parse_precision(o.precision);
  // auto: the contract for MXFP4 experts; bf16 experts (Kimi-Linear) on the fast bf16 GEMMs in
  // the bf16 model, the exact oracle in fp32.
  if (o.experts_numerics == "auto")
    opt_.experts = c.moe.mxfp4 || c.num_moe_layers() == 0 ? ExpertNumerics::contract
                   : opt_.precision == Precision::bf16    ? ExpertNumerics::bf16
                                                          : ExpertNumerics::exact;
  else
    opt_.experts = parse_expert_numerics(o.experts_numerics);
  check_device(o.device);
  check_thread_count("--threads", o.threads);
  num_threads_ = o.threads > 0 ? o.threads : int(tbb::info::default_concurrency());
  if (o.threads > 0)
    threads_ = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                                     size_t(o.threads));
  if (o.stop_after_layer >= c.num_layers)
    throw Error("--stop-after-layer " + std::to_string(o.stop_after_layer) +
                ": the model has layers 0.." + std::to_string(c.num_layers - 1));
  opt_.stop_after_layer = o.stop_after_layer;
  if (!o.dump_dir.empty()) {
    dumper_ = std::make_unique<Dumper>(o.dump_sites);
    opt_.dumper = dumper_.get();
  }
  if (!o.record_routing.empty()) {
    record_ = std::make_unique<RoutingLog>();
    opt_.record_routing = record_.get();
  }
  if (!o.replay_routing.empty()) {
    replay_ = std::make_unique<RoutingLog>(RoutingLog::load(o.replay_routing));
    replay_->check_against(c, o.replay_routing, positions.min, positions.max);
    opt_.replay_routing = replay_.get();
  }
}

SessionSetup::~SessionSetup() = default;

void SessionSetup::finish() const {
  if (dumper_) dumper_->write(in_.dump_dir);
  if (record_) record_->save(in_.record_routing);
}

std::string SessionSetup::describe() const {
  return std::string("precision ") + precision_name(opt_.precision) + ", experts " +
         expert_numerics_name(opt_.experts) + ", " + std::to_string(num_threads_) + " threads";
}

std::unique_ptr<Backend> SessionSetup::make_backend(const Model& m, const SessionOptions& so,
                                                    int slots) {
  const bool reference = so.precision == Precision::fp32 || so.experts == ExpertNumerics::exact;
  const bool gpu_present = kernels::cuda_device_count() > 0;
  bool want_gpu = in_.device == "gpu" || (in_.device == "auto" && gpu_present && !reference);
  if (in_.device == "auto" && gpu_present && reference)
    device_line_ = std::string("--precision ") + precision_name(so.precision) +
                   " --experts-numerics " + expert_numerics_name(so.experts) +
                   ": running on the CPU reference (the oracle), not the GPU";
  if (want_gpu) {
    CudaBackendOptions co;
    co.slots = slots;
    co.max_context = in_.max_context;
    co.max_step_rows = in_.max_step_rows;
    co.hardware_file = in_.hardware;
    co.cuda_graphs = !in_.no_cuda_graphs;
    co.profile = in_.profile;
    const int promote = gpu_promote_interval(in_.gpu_promote);
    co.promote = promote > 0;
    if (promote > 0) co.promote_interval = promote;
    if (!in_.gpu_mem.empty()) co.gpu_mem_bytes = parse_size(in_.gpu_mem, 0, "--gpu-mem");
    if (!in_.gpu_experts.empty()) co.gpu_expert_share = parse_gpu_expert_share(in_.gpu_experts);
    try {
      auto b = std::make_unique<CudaBackend>(m, so.backend(), co);
      device_line_ = b->name();
      for (const auto& line : b->budget_lines()) device_line_ += "\nstrata:   " + line;
      return b;
    } catch (const Error& e) {
      if (in_.device == "gpu") throw;
      device_line_ = std::string("GPU not used (") + e.what() + "); running on the CPU";
    }
  }
  // cpu-ref: the reference backend in any precision (every row computed alone in a fixed order, so
  // a sequence's bits do not depend on the others in its step). cpu: the fast backend for bf16 +
  // contract or bf16 experts (its GEMV/oneDNN choice follows the rows of a step), the reference
  // for fp32 or exact.
  if (in_.device == "cpu-ref") return std::make_unique<CpuRefBackend>(m, so.backend(), slots);
  return make_cpu_backend(m, so.backend(), slots);
}

uint64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return uint64_t(u.ru_maxrss) * 1024;  // Linux: kilobytes
}

}  // namespace strata::engine

namespace strata::engine {
double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}
uint64_t available_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (f >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

}  // namespace strata::engine
