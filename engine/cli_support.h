// Input parsing shared by the `strata run` and `strata logits` commands: token-id files, precision
// and numerics names, the thread limit, and the inspection options (dump, stop-after-layer,
// routing record/replay) turned into SessionOptions. One place, so both commands name bad input
// the same way.
// Not here: the commands themselves (tools/cmd_run.cpp, tools/cmd_logits.cpp).
#pragma once
#include <tbb/global_control.h>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/session.h"
#include "storage/files.h"

namespace strata::engine {

Precision parse_precision(const std::string& s);  // "fp32" | "bf16", throws strata::Error
const char* precision_name(Precision p);

// A JSON array of token ids, e.g. [746, 428, 831]. Throws strata::Error naming the file and the
// problem: unreadable, not JSON, not an array, an element that is not an integer, an id outside
// [0, vocab_size), an empty list.
std::vector<int32_t> read_ids_file(const std::filesystem::path& file, int vocab_size);

// --threads N: 0 (all) or 1..the hardware threads of this machine; more workers than hardware
// threads only adds switching. Throws strata::Error naming `flag` and the limit. Returns N.
int check_thread_count(const std::string& flag, int n);
// --device: auto, cpu, cpu-ref or gpu (throws strata::Error naming the flag otherwise).
void check_device(const std::string& d);
// --gpu-promote: on (the default interval), off (0) or a step interval N ≥ 1; the interval in
// steps, 0 for off. Throws strata::Error naming the flag otherwise.
int gpu_promote_interval(const std::string& v);
// --gpu-experts: a share of the routed experts, "10%" or "0.1", in [0, 1]. Throws strata::Error
// naming the flag otherwise.
double parse_gpu_expert_share(const std::string& v);

// The options every forward-running command accepts, as parsed by CLI11.
struct InspectOptions {
  std::string precision = "bf16";
  std::string experts_numerics = "auto";  // contract for MXFP4 experts; bf16 experts: bf16 (exact
                                          // with --precision fp32)
  // Device table (README "Devices, precisions, experts"): auto = the GPU when present and the
  // numerics are bf16 + contract, else the CPU reference.
  std::string device = "auto";
  std::string gpu_mem;      // GPU budget (SIZE); empty: free memory − 1 GiB
  std::string gpu_experts;  // share of routed experts in the GPU cache ("10%", "0.1"); empty: fit
  int64_t max_context = 8192;
  int64_t max_step_rows = 512;
  std::string hardware;         // a `strata bench hw --save` profile for the cost model's decisions
  bool no_cuda_graphs = false;  // decode steps with eager launches (for comparisons)
  bool profile = false;         // GPU time per sublayer kind (CudaBackendOptions::profile)
  // Promotions into the GPU expert cache: on (every 16 steps), off, or a step interval N ≥ 1.
  std::string gpu_promote = "on";
  int threads = 0;  // 0: all cores
  std::string dump_dir, dump_sites = ".*";
  int stop_after_layer = -1;
  std::string record_routing, replay_routing;
  bool check_weights = false;    // scan every weight for NaN/Inf at load (LoadOptions)
  std::string experts_quantize;  // "mxfp4": bf16 routed experts quantized at load; empty: no
};

// The LoadOptions those options ask for (--check-weights, --experts-quantize; progress lines on).
// Throws strata::Error for an --experts-quantize other than mxfp4, and for a malformed --gpu-mem,
// --gpu-experts, --max-context, --max-step-rows or a missing --hardware file (checked here, on
// every machine, since every command calls this before loading).
LoadOptions load_options(const InspectOptions& o);
// --experts-quantize's value: "" (off) or mxfp4 (true); anything else throws strata::Error.
bool parse_experts_quantize(const std::string& v);

struct OffloadOptions;  // engine/offload_executor.h

// Checks a forward-running command's options before anything is loaded (issue 17: bad input
// fails at once, not after the run): numbers in range, and every output path (`outputs`: flag →
// path, plus --dump DIR, --record-routing) writable and none of the files it reads (the model
// directory's files, `inputs`, --replay-routing). Creates the --dump directory.
// With `offload`, its options are checked against the model's config.json (read, not the
// weights): see check_offload_options.
void check_before_load(const InspectOptions& o, const OffloadOptions* offload,
                       const std::string& model_dir, const std::vector<std::string>& inputs,
                       std::vector<std::pair<std::string, std::string>> outputs);

// Output files (flag → path; empty paths skipped), checked before any work: each writable and not
// one of `inputs` (storage/files.h OutputPath), and no two the same file. Throws strata::Error
// naming the flag.
void check_outputs(const std::vector<std::pair<std::string, std::string>>& outputs,
                   const std::vector<FileId>& inputs);

// How many positions a command runs through the model: a replayed routing must cover exactly
// these (logits: min == max == T; run: the prompt, up to prompt + n − 1 decode positions).
struct PositionRange {
  int64_t min = 0, max = 0;
};

// Everything a command needs to run a session with those options (owns the dumper, routing logs
// and the TBB thread limit). finish() writes the dump and the recorded routing.
class SessionSetup {
 public:
  // `positions`: checked against a replayed routing (rows per MoE layer); {0, 0} skips the check.
  SessionSetup(const InspectOptions& o, const ModelConfig& c, PositionRange positions = {});
  ~SessionSetup();
  SessionOptions options() const { return opt_; }
  void finish() const;
  std::string describe() const;  // "precision fp32, experts exact, 2 threads"
  // The backend of the device table for `so` (which carries the offload hooks), with `slots`
  // sequence slots. Prints one line when auto chose the CPU for a reason the user should know.
  std::unique_ptr<Backend> make_backend(const Model& m, const SessionOptions& so, int slots = 1);
  const std::string& device_line() const { return device_line_; }

 private:
  InspectOptions in_;
  SessionOptions opt_;
  std::unique_ptr<Dumper> dumper_;
  std::unique_ptr<RoutingLog> record_, replay_;
  std::unique_ptr<tbb::global_control> threads_;
  int num_threads_ = 0;
  std::string device_line_;
};

// Peak resident set size of this process (getrusage), bytes.
uint64_t peak_rss_bytes();
// CPU time (user + system, all threads) this process has used so far, seconds. With wall time it
// tells a slow run from a starved one on a shared machine.
double process_cpu_seconds();

// /proc/meminfo's MemAvailable, bytes (0 when unreadable).
uint64_t available_memory_bytes();

}  // namespace strata::engine
