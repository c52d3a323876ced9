// HardwareProfile: JSON form, the static probe, merge and summary (see hardware.h).
#include "offload/hardware.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cpu/expert_kernels.h"
#include "cpu/topology.h"
#include "kernels/runtime.h"
#include "offload/format.h"
#include "storage/error.h"

namespace strata::offload {

using nlohmann::json;

namespace {

constexpr const char* kFormat = "strata-hardware-1";

// One reader per file: every error is one line "FILE: FIELD: what was wrong".
class Reader {
 public:
  explicit Reader(std::string src) : src_(std::move(src)) {}
  [[noreturn]] void fail(const std::string& field, const std::string& why) const {
    throw Error(src_ + ": " + field + ": " + why);
  }
  // Rejects fields not in `allowed` (a typo must not silently read as "not measured").
  void only(const json& obj, const std::string& where,
            std::initializer_list<const char*> allowed) const {
    if (!obj.is_object()) fail(where.empty() ? "(top level)" : where, "expected an object");
    std::set<std::string> ok(allowed.begin(), allowed.end());
    for (auto it = obj.begin(); it != obj.end(); ++it)
      if (!ok.count(it.key())) {
        std::string list;
        for (const char* a : allowed) list += std::string(list.empty() ? "" : ", ") + a;
        fail(join(where, it.key()), "unknown field (expected one of: " + list + ")");
      }
  }
  static std::string join(const std::string& where, const std::string& key) {
    return where.empty() ? key : where + "." + key;
  }
  std::string str(const json& obj, const std::string& where, const char* key) const {
    if (!obj.contains(key)) return {};
    const json& v = obj.at(key);
    if (!v.is_string()) fail(join(where, key), "expected a string");
    return v.get<std::string>();
  }
  int integer(const json& obj, const std::string& where, const char* key, int lo, int dflt) const {
    if (!obj.contains(key)) return dflt;
    const json& v = obj.at(key);
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > (1 << 30))
      fail(join(where, key), "expected an integer ≥ " + std::to_string(lo));
    return int(v.get<int64_t>());
  }
  double positive(const json& v, const std::string& field) const {
    if (!v.is_number()) fail(field, "expected a number");
    const double d = v.get<double>();
    if (!(d > 0) || !std::isfinite(d)) fail(field, "expected a positive number, got " + v.dump());
    return d;
  }
  // A rate: a number or {"value": number, "source": "..."}.
  Rate rate(const json& obj, const std::string& where, const char* key) const {
    if (!obj.contains(key)) return {};
    const json& v = obj.at(key);
    const std::string f = join(where, key);
    if (v.is_object()) {
      only(v, f, {"value", "source"});
      if (!v.contains("value")) fail(f, "expected {\"value\": number, \"source\": text}");
      std::string source;
      if (v.contains("source")) {
        if (!v.at("source").is_string()) fail(f + ".source", "expected a string");
        source = v.at("source").get<std::string>();
      }
      return Rate(positive(v.at("value"), f + ".value"), source);
    }
    return Rate(positive(v, f), "stated in " + src_);
  }
  uint64_t size(const json& obj, const std::string& where, const char* key) const {
    if (!obj.contains(key)) return 0;
    const json& v = obj.at(key);
    const std::string f = join(where, key);
    if (v.is_number()) return uint64_t(positive(v, f));
    if (!v.is_string()) fail(f, "expected bytes (a number) or a size with a unit (\"141GB\")");
    try {
      return parse_size_bytes(v.get<std::string>());
    } catch (const Error& e) {
      fail(f, e.what());
    }
  }
  // A curve: {"points": [{"tokens": M, "<value_key>": x}, ...], "source": "..."} or the bare
  // array. value_key: "gbps" for weight-byte curves, "value" for the others.
  RateCurve curve(const json& obj, const std::string& where, const char* key,
                  const char* value_key = "gbps") const {
    RateCurve c;
    if (!obj.contains(key)) return c;
    const std::string f = join(where, key);
    const std::string shape =
        std::string("{\"tokens\": M, \"") + value_key + "\": x}";  // for the messages
    const json* pts = &obj.at(key);
    if (pts->is_object()) {
      only(*pts, f, {"points", "source"});
      c.source = str(*pts, f, "source");
      if (!pts->contains("points")) fail(f, "expected \"points\": [" + shape + "]");
      pts = &pts->at("points");
    } else {
      c.source = "stated in " + src_;
    }
    if (!pts->is_array() || pts->empty()) fail(f, "expected a non-empty array of " + shape);
    for (size_t i = 0; i < pts->size(); ++i) {
      const std::string fi = f + "[" + std::to_string(i) + "]";
      const json& p = pts->at(i);
      only(p, fi, {"tokens", value_key});
      if (!p.contains("tokens") || !p.contains(value_key))
        fail(fi, std::string("expected tokens and ") + value_key);
      RatePoint rp;
      rp.tokens = integer(p, fi, "tokens", 1, 1);
      rp.gbps = positive(p.at(value_key), fi + "." + value_key);
      if (!c.points.empty() && rp.tokens <= c.points.back().tokens)
        fail(fi + ".tokens", "points must be sorted by increasing tokens");
      c.points.push_back(rp);
    }
    return c;
  }

 private:
  std::string src_;
};

void put(json& j, const char* key, const Rate& r) {
  if (!r.known()) return;
  if (r.source().empty())
    j[key] = r.value();
  else
    j[key] = {{"value", r.value()}, {"source", r.source()}};
}

void put(json& j, const char* key, const RateCurve& c, const char* value_key = "gbps") {
  if (!c.known()) return;
  json pts = json::array();
  for (auto& p : c.points) pts.push_back({{"tokens", p.tokens}, {value_key, p.gbps}});
  j[key] = {{"source", c.source}, {"points", pts}};
}

int parse_cc(const Reader& rd, const json& g, const std::string& where) {
  if (!g.contains("compute_capability")) return 0;
  const json& v = g.at("compute_capability");
  const std::string f = Reader::join(where, "compute_capability");
  std::string s = v.is_string() ? v.get<std::string>() : v.is_number() ? v.dump() : "";
  int major = 0, minor = 0;
  if (std::sscanf(s.c_str(), "%d.%d", &major, &minor) < 1 || major < 1 || major > 20 || minor < 0 ||
      minor > 9)
    rd.fail(f, "expected \"major.minor\" such as \"9.0\", got " + v.dump());
  return major * 10 + minor;
}

const std::vector<std::pair<const char*, bool HostSpec::*>>& isa_fields() {
  static const std::vector<std::pair<const char*, bool HostSpec::*>> f = {
      {"avx2", &HostSpec::avx2},
      {"avx512", &HostSpec::avx512},
      {"avx512_vnni", &HostSpec::avx512_vnni},
      {"avx512_bf16", &HostSpec::avx512_bf16},
      {"amx", &HostSpec::amx}};
  return f;
}

// The curves of ModelShapeRates with their JSON names and value keys (one list for the reader,
// the writer and the summary): weight-byte curves in "gbps", the others in "value".
struct ShapeCurveField {
  const char* name;
  RateCurve ModelShapeRates::*field;
  const char* value_key;
};
const std::vector<ShapeCurveField>& model_shape_curves() {
  static const std::vector<ShapeCurveField> f = {
      {"trunk", &ModelShapeRates::trunk, "gbps"},
      {"expert", &ModelShapeRates::expert, "gbps"},
      {"expert_decode", &ModelShapeRates::expert_decode, "gbps"},
      {"kda_decode_gbps", &ModelShapeRates::kda_decode_gbps, "value"},
      {"kda_prefill_gflops", &ModelShapeRates::kda_prefill_gflops, "value"},
      {"mla_decode_gflops", &ModelShapeRates::mla_decode_gflops, "value"},
      {"mla_prefill_gflops", &ModelShapeRates::mla_prefill_gflops, "value"},
      {"row_ops_ns", &ModelShapeRates::row_ops_ns, "value"},
      {"step_factor", &ModelShapeRates::step_factor, "value"},
      {"gpu_trunk", &ModelShapeRates::gpu_trunk, "gbps"}};
  return f;
}

}  // namespace

double Rate::value() const {
  STRATA_ASSERT(known_);
  return value_;
}

namespace {
// f of a curve at M tokens: f(first point) at or below the first point, linear in M between the
// two points around it; past the last point f(last), times M / its tokens when `proportional`.
template <typename F>
double along(const std::vector<RatePoint>& pts, double M, const F& f, bool proportional) {
  if (M <= pts.front().tokens) return f(pts.front());
  for (size_t i = 1; i < pts.size(); ++i)
    if (M <= pts[i].tokens) {
      const RatePoint &a = pts[i - 1], &b = pts[i];
      const double t = (M - a.tokens) / double(b.tokens - a.tokens);
      return f(a) + t * (f(b) - f(a));
    }
  return proportional ? f(pts.back()) * M / double(pts.back().tokens) : f(pts.back());
}
}  // namespace

double RateCurve::seconds_per_byte(double M) const {
  STRATA_ASSERT(known() && M >= 1);
  return along(
      points, M, [](const RatePoint& p) { return 1.0 / (p.gbps * 1e9); }, true);
}

double RateCurve::value_at(double M) const {
  STRATA_ASSERT(known());
  return along(
      points, M, [](const RatePoint& p) { return p.gbps; }, false);
}

Rate DiskSpec::total_read_gbps() const {
  if (count <= 0 || !read_gbps.known()) return {};
  return Rate(count * read_gbps.value(), read_gbps.source());
}

uint64_t parse_size_bytes(const std::string& text) {
  auto bad = [&]() {
    return Error("'" + text + "': expected a size such as 141GB, 1.5TB, 512GiB or 80e9 (bytes)");
  };
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (...) {
    throw bad();
  }
  std::string unit = text.substr(used);
  unit.erase(
      std::remove_if(unit.begin(), unit.end(), [](unsigned char c) { return std::isspace(c); }),
      unit.end());
  if (!(v > 0) || !std::isfinite(v)) throw bad();
  static const std::map<std::string, double> units = {
      {"", 1},      {"B", 1},        {"KB", 1e3},      {"MB", 1e6},      {"GB", 1e9},
      {"TB", 1e12}, {"KiB", 1024.0}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1099511627776.0}};
  auto it = units.find(unit);
  if (it == units.end()) throw bad();
  return uint64_t(std::llround(v * it->second));
}

std::string format_bytes(double b) {
  if (b >= 1e12) return fmt("%.2f TB", b / 1e12);
  if (b >= 1e9) return fmt("%.1f GB", b / 1e9);
  if (b >= 1e6) return fmt("%.1f MB", b / 1e6);
  return fmt("%.0f B", b);
}

json to_json(const HardwareProfile& hw) {
  json j;
  j["format"] = kFormat;
  if (!hw.description.empty()) j["description"] = hw.description;
  j["nodes"] = hw.nodes;
  put(j, "network_gbps", hw.network_gbps);
  put(j, "network_latency_us", hw.network_latency_us);
  json g = json::object();
  g["count"] = hw.gpu.count;
  if (!hw.gpu.name.empty()) g["name"] = hw.gpu.name;
  if (hw.gpu.compute_capability > 0)
    g["compute_capability"] = std::to_string(hw.gpu.compute_capability / 10) + "." +
                              std::to_string(hw.gpu.compute_capability % 10);
  if (hw.gpu.memory_bytes) g["memory"] = hw.gpu.memory_bytes;
  put(g, "hbm_copy_gbps", hw.gpu.hbm_copy_gbps);
  put(g, "bf16_gemm_tflops", hw.gpu.bf16_gemm_tflops);
  put(g, "h2d_gbps", hw.gpu.h2d_gbps);
  put(g, "d2h_gbps", hw.gpu.d2h_gbps);
  put(g, "peer_gbps", hw.gpu.peer_gbps);
  j["gpu"] = g;
  json h = json::object();
  if (!hw.host.cpu_name.empty()) h["cpu"] = hw.host.cpu_name;
  if (hw.host.cores) h["cores"] = hw.host.cores;
  if (hw.host.numa_nodes) h["numa_nodes"] = hw.host.numa_nodes;
  json isa = json::array();
  for (auto& [name, field] : isa_fields())
    if (hw.host.*field) isa.push_back(name);
  h["isa"] = isa;
  if (hw.host.dram_bytes) h["dram"] = hw.host.dram_bytes;
  put(h, "mem_read_gbps", hw.host.mem_read_gbps);
  put(h, "bf16_tflops", hw.host.bf16_tflops);
  j["host"] = h;
  json d = json::object();
  d["count"] = hw.disk.count;
  if (!hw.disk.what.empty()) d["what"] = hw.disk.what;
  put(d, "read_gbps", hw.disk.read_gbps);
  j["disk"] = d;
  json k = json::object();
  put(k, "cpu_expert", hw.kernels.cpu_expert);
  put(k, "cpu_expert_small", hw.kernels.cpu_expert_small);
  put(k, "gpu_expert", hw.kernels.gpu_expert);
  put(k, "gpu_trunk", hw.kernels.gpu_trunk);
  put(k, "cpu_trunk_ref", hw.kernels.cpu_trunk_ref);
  put(k, "cpu_trunk_bf16", hw.kernels.cpu_trunk_bf16);
  put(k, "gpu_kda_prefill_tflops", hw.kernels.gpu_kda_prefill_tflops);
  put(k, "gpu_mla_prefill_tflops", hw.kernels.gpu_mla_prefill_tflops);
  put(k, "gpu_mla_decode_tflops", hw.kernels.gpu_mla_decode_tflops);
  put(k, "cpu_kda_ref_state_gbps", hw.kernels.cpu_kda_ref_state_gbps);
  put(k, "cpu_mla_ref_gflops", hw.kernels.cpu_mla_ref_gflops);
  put(k, "cpu_kda_ref_prefill_gflops", hw.kernels.cpu_kda_ref_prefill_gflops);
  put(k, "cpu_mla_ref_prefill_gflops", hw.kernels.cpu_mla_ref_prefill_gflops);
  put(k, "cpu_linear_call_us", hw.kernels.cpu_linear_call_us);
  put(k, "cpu_kda_fast_state_gbps", hw.kernels.cpu_kda_fast_state_gbps);
  put(k, "cpu_mla_fast_gflops", hw.kernels.cpu_mla_fast_gflops);
  put(k, "cpu_kda_fast_prefill_gflops", hw.kernels.cpu_kda_fast_prefill_gflops);
  put(k, "cpu_mla_fast_prefill_gflops", hw.kernels.cpu_mla_fast_prefill_gflops);
  put(k, "cpu_row_ops_ns", hw.kernels.cpu_row_ops_ns);
  put(k, "gpu_kernel_us", hw.kernels.gpu_kernel_us);
  put(k, "gpu_sync_us", hw.kernels.gpu_sync_us);
  put(k, "stage_copy_gbps", hw.kernels.stage_copy_gbps);
  j["kernels"] = k;
  if (hw.model_shapes.known()) {
    const ModelShapeRates& ms = hw.model_shapes;
    json m = {{"signature", ms.signature}, {"model", ms.model}, {"threads", ms.threads}};
    if (ms.context > 0) m["context"] = ms.context;
    for (const ShapeCurveField& f : model_shape_curves()) put(m, f.name, ms.*f.field, f.value_key);
    put(m, "linear_call_us", ms.linear_call_us);
    j["model_shapes"] = m;
  }
  if (!hw.not_measured.empty()) j["not_measured"] = hw.not_measured;
  return j;
}

HardwareProfile hardware_from_json(const json& j, const std::string& source_name) {
  Reader rd(source_name);
  rd.only(j, "",
          {"format", "description", "nodes", "network_gbps", "network_latency_us", "gpu", "host",
           "disk", "kernels", "model_shapes", "not_measured", "comment"});
  if (!j.contains("format"))
    rd.fail("format", std::string("missing; expected \"") + kFormat + "\"");
  if (rd.str(j, "", "format") != kFormat)
    rd.fail("format", std::string("expected \"") + kFormat + "\", got " + j.at("format").dump());
  HardwareProfile hw;
  hw.source = source_name;
  hw.description = rd.str(j, "", "description");
  hw.nodes = rd.integer(j, "", "nodes", 1, 1);
  hw.network_gbps = rd.rate(j, "", "network_gbps");
  hw.network_latency_us = rd.rate(j, "", "network_latency_us");
  if (j.contains("gpu")) {
    const json& g = j.at("gpu");
    rd.only(g, "gpu",
            {"count", "name", "compute_capability", "memory", "hbm_copy_gbps", "bf16_gemm_tflops",
             "h2d_gbps", "d2h_gbps", "peer_gbps", "comment"});
    hw.gpu.count = rd.integer(g, "gpu", "count", 0, 0);
    hw.gpu.name = rd.str(g, "gpu", "name");
    hw.gpu.compute_capability = parse_cc(rd, g, "gpu");
    hw.gpu.memory_bytes = rd.size(g, "gpu", "memory");
    hw.gpu.hbm_copy_gbps = rd.rate(g, "gpu", "hbm_copy_gbps");
    hw.gpu.bf16_gemm_tflops = rd.rate(g, "gpu", "bf16_gemm_tflops");
    hw.gpu.h2d_gbps = rd.rate(g, "gpu", "h2d_gbps");
    hw.gpu.d2h_gbps = rd.rate(g, "gpu", "d2h_gbps");
    hw.gpu.peer_gbps = rd.rate(g, "gpu", "peer_gbps");
    if (hw.gpu.count > 0 && hw.gpu.compute_capability == 0)
      hw.gpu.compute_capability = compute_capability_of(hw.gpu.name);
  }
  if (j.contains("host")) {
    const json& h = j.at("host");
    rd.only(
        h, "host",
        {"cpu", "cores", "numa_nodes", "isa", "dram", "mem_read_gbps", "bf16_tflops", "comment"});
    hw.host.cpu_name = rd.str(h, "host", "cpu");
    hw.host.cores = rd.integer(h, "host", "cores", 1, 0);
    hw.host.numa_nodes = rd.integer(h, "host", "numa_nodes", 1, 0);
    hw.host.dram_bytes = rd.size(h, "host", "dram");
    hw.host.mem_read_gbps = rd.rate(h, "host", "mem_read_gbps");
    hw.host.bf16_tflops = rd.rate(h, "host", "bf16_tflops");
    if (h.contains("isa")) {
      const json& isa = h.at("isa");
      if (!isa.is_array()) rd.fail("host.isa", "expected an array such as [\"avx512\", \"amx\"]");
      for (const json& e : isa) {
        bool found = false;
        for (auto& [name, field] : isa_fields())
          if (e.is_string() && e.get<std::string>() == name) hw.host.*field = found = true;
        if (!found)
          rd.fail("host.isa", "unknown ISA " + e.dump() +
                                  " (expected avx2, avx512, avx512_vnni, "
                                  "avx512_bf16, amx)");
      }
      // AVX-512 implies AVX2 on every CPU that has it.
      if (hw.host.avx512) hw.host.avx2 = true;
    }
  }
  if (j.contains("disk")) {
    const json& d = j.at("disk");
    rd.only(d, "disk", {"count", "read_gbps", "what", "comment"});
    hw.disk.count = rd.integer(d, "disk", "count", 0, 0);
    hw.disk.read_gbps = rd.rate(d, "disk", "read_gbps");
    hw.disk.what = rd.str(d, "disk", "what");
    if (hw.disk.read_gbps.known() && hw.disk.count == 0) hw.disk.count = 1;
  }
  if (j.contains("kernels")) {
    const json& k = j.at("kernels");
    rd.only(k, "kernels",
            {"cpu_expert",
             "cpu_expert_small",
             "gpu_expert",
             "gpu_trunk",
             "cpu_trunk_ref",
             "cpu_trunk_bf16",
             "gpu_kda_prefill_tflops",
             "gpu_mla_prefill_tflops",
             "gpu_mla_decode_tflops",
             "cpu_kda_ref_state_gbps",
             "cpu_mla_ref_gflops",
             "cpu_kda_ref_prefill_gflops",
             "cpu_mla_ref_prefill_gflops",
             "gpu_kernel_us",
             "gpu_sync_us",
             "stage_copy_gbps",
             "cpu_linear_call_us",
             "cpu_kda_fast_state_gbps",
             "cpu_mla_fast_gflops",
             "cpu_kda_fast_prefill_gflops",
             "cpu_mla_fast_prefill_gflops",
             "cpu_row_ops_ns",
             "comment"});
    hw.kernels.cpu_expert = rd.curve(k, "kernels", "cpu_expert");
    hw.kernels.cpu_expert_small = rd.curve(k, "kernels", "cpu_expert_small");
    hw.kernels.gpu_expert = rd.curve(k, "kernels", "gpu_expert");
    hw.kernels.gpu_trunk = rd.curve(k, "kernels", "gpu_trunk");
    hw.kernels.cpu_trunk_ref = rd.curve(k, "kernels", "cpu_trunk_ref");
    hw.kernels.cpu_trunk_bf16 = rd.curve(k, "kernels", "cpu_trunk_bf16");
    hw.kernels.gpu_kda_prefill_tflops = rd.rate(k, "kernels", "gpu_kda_prefill_tflops");
    hw.kernels.gpu_mla_prefill_tflops = rd.rate(k, "kernels", "gpu_mla_prefill_tflops");
    hw.kernels.gpu_mla_decode_tflops = rd.rate(k, "kernels", "gpu_mla_decode_tflops");
    hw.kernels.cpu_kda_ref_state_gbps = rd.rate(k, "kernels", "cpu_kda_ref_state_gbps");
    hw.kernels.cpu_mla_ref_gflops = rd.rate(k, "kernels", "cpu_mla_ref_gflops");
    hw.kernels.cpu_kda_ref_prefill_gflops = rd.rate(k, "kernels", "cpu_kda_ref_prefill_gflops");
    hw.kernels.cpu_mla_ref_prefill_gflops = rd.rate(k, "kernels", "cpu_mla_ref_prefill_gflops");
    hw.kernels.cpu_linear_call_us = rd.rate(k, "kernels", "cpu_linear_call_us");
    hw.kernels.cpu_kda_fast_state_gbps = rd.rate(k, "kernels", "cpu_kda_fast_state_gbps");
    hw.kernels.cpu_mla_fast_gflops = rd.rate(k, "kernels", "cpu_mla_fast_gflops");
    hw.kernels.cpu_kda_fast_prefill_gflops = rd.rate(k, "kernels", "cpu_kda_fast_prefill_gflops");
    hw.kernels.cpu_mla_fast_prefill_gflops = rd.rate(k, "kernels", "cpu_mla_fast_prefill_gflops");
    hw.kernels.cpu_row_ops_ns = rd.rate(k, "kernels", "cpu_row_ops_ns");
    hw.kernels.gpu_kernel_us = rd.rate(k, "kernels", "gpu_kernel_us");
    hw.kernels.gpu_sync_us = rd.rate(k, "kernels", "gpu_sync_us");
    hw.kernels.stage_copy_gbps = rd.rate(k, "kernels", "stage_copy_gbps");
  }
  if (j.contains("model_shapes")) {
    const json& m = j.at("model_shapes");
    const std::string w = "model_shapes";
    rd.only(m, w,
            {"signature", "model", "threads", "context", "trunk", "linear_call_us", "expert",
             "expert_decode", "kda_decode_gbps", "kda_prefill_gflops", "mla_decode_gflops",
             "mla_prefill_gflops", "row_ops_ns", "step_factor", "gpu_trunk", "comment"});
    ModelShapeRates& ms = hw.model_shapes;
    ms.signature = rd.str(m, w, "signature");
    if (ms.signature.empty())
      rd.fail("model_shapes.signature", "missing: the model's shape signature (bench hw -m)");
    ms.model = rd.str(m, w, "model");
    ms.threads = rd.integer(m, w, "threads", 1, 0);
    ms.context = rd.integer(m, w, "context", 1, 0);
    for (const ShapeCurveField& f : model_shape_curves())
      ms.*f.field = rd.curve(m, w, f.name, f.value_key);
    ms.linear_call_us = rd.rate(m, w, "linear_call_us");
  }
  if (j.contains("not_measured")) {
    const json& n = j.at("not_measured");
    if (!n.is_array()) rd.fail("not_measured", "expected an array of strings");
    for (const json& e : n) {
      if (!e.is_string()) rd.fail("not_measured", "expected an array of strings");
      hw.not_measured.push_back(e.get<std::string>());
    }
  }
  return hw;
}

HardwareProfile load_hardware(const std::filesystem::path& file) {
  std::ifstream f(file);
  if (!f) throw Error(file.string() + ": cannot open the hardware description");
  std::stringstream ss;
  ss << f.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::parse_error& e) {
    throw Error(file.string() + ": not valid JSON: " + e.what());
  }
  return hardware_from_json(j, file.string());
}

void save_hardware(const HardwareProfile& hw, const std::filesystem::path& file, bool overwrite) {
  std::error_code ec;
  if (!overwrite && std::filesystem::exists(file, ec))
    throw Error(file.string() + ": exists; not replacing it (remove it or pass --force)");
  const std::filesystem::path tmp = file.string() + ".tmp";
  {
    std::ofstream f(tmp);
    if (!f) throw Error(file.string() + ": cannot write");
    f << to_json(hw).dump(2) << "\n";
    if (!f) throw Error(file.string() + ": write failed (disk full?)");
  }
  std::filesystem::rename(tmp, file, ec);
  if (ec) throw Error(file.string() + ": cannot write: " + ec.message());
}

int compute_capability_of(const std::string& gpu_name) {
  std::string n;
  for (char c : gpu_name) n += char(std::toupper(static_cast<unsigned char>(c)));
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  // Order matters: "GH200" before "H200"; "B200" before "A100" etc. do not collide.
  if (has("GB200") || has("B200") || has("B100")) return 100;
  if (has("B300") || has("GB300")) return 103;
  if (has("RTX 50") || has("RTX PRO 6000")) return 120;
  if (has("H100") || has("H200") || has("H800") || has("H20") || has("GH200")) return 90;
  if (has("L40") || has("L4") || has("RTX 40") || has("4090") || has("ADA")) return 89;
  if (has("A100") || has("A800") || has("A30")) return 80;
  if (has("A10") || has("A40") || has("RTX 30") || has("A6000")) return 86;
  if (has("V100")) return 70;
  return 0;
}

std::string gpu_unsupported_reason(const GpuSpec& g) {
  if (g.count <= 0) return {};
  if (g.compute_capability == 0)
    return "GPU '" + g.name +
           "': compute capability unknown (state gpu.compute_capability); this build targets "
           "sm_90 (H100/H200/GH200) only";
  if (g.compute_capability != 90)
    return "GPU '" + g.name + "' is sm_" + std::to_string(g.compute_capability) +
           "; this build targets sm_90 (H100/H200/GH200) only (sm_90a kernels: wgmma, TMA)";
  return {};
}

HardwareProfile probe_static() {
  HardwareProfile hw;
  hw.description = "this machine";
  try {
    cpu::Topology topo;
    hw.host.cores = topo.cores();
    hw.host.numa_nodes = topo.numa_nodes();
  } catch (const Error& e) {
    hw.not_measured.push_back(std::string("cores: hwloc failed: ") + e.what());
  }
  hw.host.avx2 = cpu::isa_supported(cpu::ExpertIsa::avx2);
  hw.host.avx512 = cpu::isa_supported(cpu::ExpertIsa::avx512);
  hw.host.avx512_vnni = hw.host.avx512;  // our avx512 kernel requires VNNI (expert_kernels.h)
  __builtin_cpu_init();
  hw.host.avx512_bf16 = hw.host.avx512 && __builtin_cpu_supports("avx512bf16");
  hw.host.amx = cpu::isa_supported(cpu::ExpertIsa::amx);
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) hw.host.dram_bytes = uint64_t(pages) * uint64_t(page);
  std::ifstream ci("/proc/cpuinfo");
  for (std::string line; std::getline(ci, line);)
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos)
        hw.host.cpu_name = line.substr(line.find_first_not_of(' ', p + 1));
      break;
    }
  const int n = kernels::cuda_device_count();
  hw.gpu.count = n;
  if (n > 0) {
    kernels::DeviceProperties p;
    if (kernels::cuda_device_properties(0, &p)) {
      hw.gpu.name = p.name;
      hw.gpu.compute_capability = p.major * 10 + p.minor;
      hw.gpu.memory_bytes = p.memory_bytes;
    }
  }
  return hw;
}

HardwareProfile merge(const HardwareProfile& base, const HardwareProfile& extra) {
  HardwareProfile m = base;
  auto r = [](Rate& a, const Rate& b) {
    if (!a.known()) a = b;
  };
  auto c = [](RateCurve& a, const RateCurve& b) {
    if (!a.known()) a = b;
  };
  auto s = [](auto& a, const auto& b) {
    if (a == std::remove_reference_t<decltype(a)>{}) a = b;
  };
  s(m.description, extra.description);
  r(m.network_gbps, extra.network_gbps);
  r(m.network_latency_us, extra.network_latency_us);
  s(m.gpu.count, extra.gpu.count);
  s(m.gpu.name, extra.gpu.name);
  s(m.gpu.compute_capability, extra.gpu.compute_capability);
  s(m.gpu.memory_bytes, extra.gpu.memory_bytes);
  r(m.gpu.hbm_copy_gbps, extra.gpu.hbm_copy_gbps);
  r(m.gpu.bf16_gemm_tflops, extra.gpu.bf16_gemm_tflops);
  r(m.gpu.h2d_gbps, extra.gpu.h2d_gbps);
  r(m.gpu.d2h_gbps, extra.gpu.d2h_gbps);
  r(m.gpu.peer_gbps, extra.gpu.peer_gbps);
  s(m.host.cpu_name, extra.host.cpu_name);
  s(m.host.cores, extra.host.cores);
  s(m.host.numa_nodes, extra.host.numa_nodes);
  for (auto& [name, field] : isa_fields()) m.host.*field = m.host.*field || extra.host.*field;
  s(m.host.dram_bytes, extra.host.dram_bytes);
  r(m.host.mem_read_gbps, extra.host.mem_read_gbps);
  r(m.host.bf16_tflops, extra.host.bf16_tflops);
  s(m.disk.count, extra.disk.count);
  r(m.disk.read_gbps, extra.disk.read_gbps);
  s(m.disk.what, extra.disk.what);
  c(m.kernels.cpu_expert, extra.kernels.cpu_expert);
  c(m.kernels.cpu_expert_small, extra.kernels.cpu_expert_small);
  c(m.kernels.gpu_expert, extra.kernels.gpu_expert);
  c(m.kernels.gpu_trunk, extra.kernels.gpu_trunk);
  c(m.kernels.cpu_trunk_ref, extra.kernels.cpu_trunk_ref);
  c(m.kernels.cpu_trunk_bf16, extra.kernels.cpu_trunk_bf16);
  r(m.kernels.gpu_kda_prefill_tflops, extra.kernels.gpu_kda_prefill_tflops);
  r(m.kernels.gpu_mla_prefill_tflops, extra.kernels.gpu_mla_prefill_tflops);
  r(m.kernels.gpu_mla_decode_tflops, extra.kernels.gpu_mla_decode_tflops);
  r(m.kernels.cpu_kda_ref_state_gbps, extra.kernels.cpu_kda_ref_state_gbps);
  r(m.kernels.cpu_mla_ref_gflops, extra.kernels.cpu_mla_ref_gflops);
  r(m.kernels.cpu_kda_ref_prefill_gflops, extra.kernels.cpu_kda_ref_prefill_gflops);
  r(m.kernels.cpu_mla_ref_prefill_gflops, extra.kernels.cpu_mla_ref_prefill_gflops);
  r(m.kernels.cpu_linear_call_us, extra.kernels.cpu_linear_call_us);
  r(m.kernels.cpu_kda_fast_state_gbps, extra.kernels.cpu_kda_fast_state_gbps);
  r(m.kernels.cpu_mla_fast_gflops, extra.kernels.cpu_mla_fast_gflops);
  r(m.kernels.cpu_kda_fast_prefill_gflops, extra.kernels.cpu_kda_fast_prefill_gflops);
  r(m.kernels.cpu_mla_fast_prefill_gflops, extra.kernels.cpu_mla_fast_prefill_gflops);
  r(m.kernels.cpu_row_ops_ns, extra.kernels.cpu_row_ops_ns);
  r(m.kernels.gpu_kernel_us, extra.kernels.gpu_kernel_us);
  r(m.kernels.gpu_sync_us, extra.kernels.gpu_sync_us);
  r(m.kernels.stage_copy_gbps, extra.kernels.stage_copy_gbps);
  if (!m.model_shapes.known()) m.model_shapes = extra.model_shapes;  // one model's, whole
  return m;
}

namespace {
std::string rate_text(const Rate& r, const char* unit) {
  if (!r.known()) return std::string("not measured");
  std::string s = fmt("%.4g ", r.value()) + unit;
  if (!r.source().empty()) s += " (" + r.source() + ")";
  return s;
}
std::string curve_text(const RateCurve& c) {
  if (!c.known()) return "not measured";
  std::string s;
  for (auto& p : c.points)
    s += (s.empty() ? "" : ", ") + fmt("M=%.0f: ", p.tokens) + fmt("%.3g GB/s", p.gbps);
  if (!c.source.empty()) s += " (" + c.source + ")";
  return s;
}
}  // namespace

std::string describe(const HardwareProfile& hw) {
  std::ostringstream o;
  o << "hardware: " << (hw.description.empty() ? "(unnamed)" : hw.description);
  if (!hw.source.empty()) o << " [" << hw.source << "]";
  o << "\n";
  if (hw.nodes > 1)
    o << "  nodes: " << hw.nodes << ", network " << rate_text(hw.network_gbps, "GB/s") << "\n";
  if (hw.gpu.count > 0) {
    o << "  gpu: " << hw.gpu.count << "× " << hw.gpu.name;
    if (hw.gpu.compute_capability) o << " (sm_" << hw.gpu.compute_capability << ")";
    if (hw.gpu.memory_bytes) o << ", " << format_bytes(double(hw.gpu.memory_bytes)) << " each";
    o << "\n    HBM copy " << rate_text(hw.gpu.hbm_copy_gbps, "GB/s") << "\n    bf16 GEMM "
      << rate_text(hw.gpu.bf16_gemm_tflops, "TFLOP/s") << "\n    host→device "
      << rate_text(hw.gpu.h2d_gbps, "GB/s") << "\n    device→host "
      << rate_text(hw.gpu.d2h_gbps, "GB/s") << "\n";
  } else {
    o << "  gpu: none\n";
  }
  o << "  host: " << (hw.host.cpu_name.empty() ? "CPU" : hw.host.cpu_name) << ", " << hw.host.cores
    << " cores";
  std::string isa;
  for (auto& [name, field] : isa_fields())
    if (hw.host.*field) isa += std::string(isa.empty() ? "" : " ") + name;
  o << ", ISA " << (isa.empty() ? "baseline" : isa);
  if (hw.host.dram_bytes) o << ", DRAM " << format_bytes(double(hw.host.dram_bytes));
  o << "\n    memory read " << rate_text(hw.host.mem_read_gbps, "GB/s") << "\n    bf16 matmul "
    << rate_text(hw.host.bf16_tflops, "TFLOP/s") << "\n";
  o << "  disk: " << hw.disk.count << " × " << rate_text(hw.disk.read_gbps, "GB/s O_DIRECT read");
  if (!hw.disk.what.empty()) o << " — " << hw.disk.what;
  o << "\n  kernels:\n    cpu expert (MXFP4 contract) " << curve_text(hw.kernels.cpu_expert)
    << "\n    cpu expert, small experts " << curve_text(hw.kernels.cpu_expert_small)
    << "\n    gpu expert " << curve_text(hw.kernels.gpu_expert) << "\n    gpu trunk "
    << curve_text(hw.kernels.gpu_trunk) << "\n    cpu trunk (fp32 reference) "
    << curve_text(hw.kernels.cpu_trunk_ref) << "\n    cpu trunk (bf16 backend) "
    << curve_text(hw.kernels.cpu_trunk_bf16) << "\n    cpu KDA reference "
    << rate_text(hw.kernels.cpu_kda_ref_state_gbps, "GB/s of state") << "\n    cpu MLA reference "
    << rate_text(hw.kernels.cpu_mla_ref_gflops, "GFLOP/s") << "\n    cpu fast backend: linear call "
    << rate_text(hw.kernels.cpu_linear_call_us, "us") << ", KDA decode "
    << rate_text(hw.kernels.cpu_kda_fast_state_gbps, "GB/s of state") << ", MLA decode "
    << rate_text(hw.kernels.cpu_mla_fast_gflops, "GFLOP/s") << ", KDA prefill "
    << rate_text(hw.kernels.cpu_kda_fast_prefill_gflops, "GFLOP/s") << ", MLA prefill "
    << rate_text(hw.kernels.cpu_mla_fast_prefill_gflops, "GFLOP/s") << ", row ops "
    << rate_text(hw.kernels.cpu_row_ops_ns, "ns per token, layer and 1024 wide")
    << "\n    gpu engine: small kernel " << rate_text(hw.kernels.gpu_kernel_us, "us")
    << ", host sync " << rate_text(hw.kernels.gpu_sync_us, "us") << ", staging host copy "
    << rate_text(hw.kernels.stage_copy_gbps, "GB/s") << "\n";
  if (hw.model_shapes.known()) {
    const ModelShapeRates& ms = hw.model_shapes;
    o << "  model-shape probes (" << ms.model << ", " << ms.threads << " threads):\n"
      << "    linear call " << rate_text(ms.linear_call_us, "us") << "\n";
    for (const ShapeCurveField& f : model_shape_curves()) {
      const RateCurve& c = ms.*f.field;
      o << "    " << f.name << " ";
      if (!c.known()) o << "not measured";
      for (size_t i = 0; i < c.points.size(); ++i)
        o << (i ? ", " : "") << "M=" << c.points[i].tokens << ": " << fmt("%.4g", c.points[i].gbps);
      o << "\n";
    }
  }
  for (auto& n : hw.not_measured) o << "  not measured: " << n << "\n";
  return o.str();
}

}  // namespace strata::offload
