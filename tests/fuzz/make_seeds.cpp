// fuzz_seeds OUT [SHARED]: writes the seed corpora of the fuzz targets into OUT/<target>/, made
// from real files so the fuzzers start from inputs that parse: the released configs and the
// golden ones (SHARED = ../shared), safetensors files cut down from the golden tensors (real
// names, dtypes and metadata; a few KB each), the index and tokenizer of a synthetic k3-tiny, the
// golden Kimi tokenizer with sample text, routing recordings in k3-tiny's shape, and batch
// request lines of both endpoints.
// Not a test: scripts/ci-fuzz.sh runs it before the fuzzers.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/trace.h"
#include "storage/checkpoint.h"
#include "storage/error.h"
#include "storage/safetensors.h"
#include "storage/synth.h"
#include "storage/tiktoken_files.h"

namespace fs = std::filesystem;
using namespace strata;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void put(const fs::path& p, const std::string& s) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << s;
}

// A small file with the first tensors of `src`, each cut to its first rows (at most ~2 KB).
void cut_safetensors(const fs::path& src, const fs::path& dst) {
  SafetensorsFile f(src);
  std::vector<TensorDecl> decls;
  std::vector<std::pair<const uint8_t*, uint64_t>> parts;
  for (const TensorInfo& t : f.tensors()) {
    if (decls.size() == 6) break;
    TensorDecl d{t.name, t.dtype, t.shape};
    if (!d.shape.empty()) {
      uint64_t row = dtype_size(t.dtype);
      for (size_t i = 1; i < d.shape.size(); ++i) row *= uint64_t(d.shape[i]);
      d.shape[0] = std::min<int64_t>(d.shape[0], int64_t(std::max<uint64_t>(1, 2048 / row)));
      if (row > 2048) continue;  // rows too wide to cut: skip the tensor
    }
    decls.push_back(d);
    parts.push_back({f.bytes(t).data(), d.nbytes()});
  }
  SafetensorsWriter w(
      dst, decls,
      f.metadata().empty() ? std::map<std::string, std::string>{{"format", "pt"}} : f.metadata());
  for (size_t i = 0; i < decls.size(); ++i)
    w.write_tensor(decls[i].name, parts[i].first, parts[i].second);
  w.finish();
}

// The first `n` entries of an index's weight_map.
std::string cut_index(const std::string& text, size_t n) {
  nlohmann::json j = nlohmann::json::parse(text), out;
  out["metadata"] = j.value("metadata", nlohmann::json::object());
  out["weight_map"] = nlohmann::json::object();
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end() && n > 0; ++it, --n)
    out["weight_map"][it.key()] = it.value();
  return out.dump(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: fuzz_seeds OUT [SHARED]\n");
    return 2;
  }
  const fs::path out = argv[1];
  const fs::path shared = argc > 2 ? fs::path(argv[2]) : fs::path();
  try {
    int n = 0;
    // config: the released and golden configs, and every synth preset.
    if (!shared.empty()) {
      for (const char* c :
           {"configs/kimi-k3.config.json", "configs/kimi-linear-48b-a3b.config.json",
            "golden/k3-tiny/config.json", "golden/kimi-linear-tiny/config.json"})
        if (fs::exists(shared / c))
          put(out / "config" / fs::path(c).filename().concat("." + std::to_string(n++)),
              slurp(shared / c));
    }
    for (const std::string& p : synth_presets()) {
      SynthOptions o;
      o.preset = p;
      put(out / "config" / (p + ".json"), synth_config_json(o));
    }
    // A synthetic k3-tiny on disk: its shards, index and tokenizer.
    const fs::path tiny = out / ".k3-tiny";
    fs::remove_all(tiny);
    SynthOptions o;
    o.preset = "k3-tiny";
    o.threads = 1;
    synth_checkpoint(o, tiny);
    // safetensors: cut from the golden files and the synthetic shards.
    std::vector<fs::path> st;
    if (!shared.empty())
      for (const char* g :
           {"golden/k3-tiny/expected.safetensors", "golden/kda-ops/inputs.safetensors",
            "golden/kimi-linear-tiny/expected.safetensors", "golden/k3-tiny/model.safetensors"})
        if (fs::exists(shared / g)) st.push_back(shared / g);
    for (const auto& e : fs::directory_iterator(tiny))
      if (e.path().extension() == ".safetensors") st.push_back(e.path());
    n = 0;
    fs::create_directories(out / "safetensors");
    for (const fs::path& p : st)
      cut_safetensors(p, out / "safetensors" / ("seed" + std::to_string(n++) + ".safetensors"));
    {
      SafetensorsWriter w(out / "safetensors" / "empty.safetensors", {});
      w.finish();
    }
    // index: the synthetic index, cut to a few entries, and one naming every shard.
    const std::string idx = slurp(tiny / "model.safetensors.index.json");
    put(out / "index" / "k3-tiny-8.json", cut_index(idx, 8));
    put(out / "index" / "k3-tiny-64.json", cut_index(idx, 64));
    // tokenizer: model \0 config \0 text.
    const std::string text =
        "The quick brown fox jumps over the lazy dog. 你好，世界！ <|im_end|>\n  x = 42;";
    put(out / "tokenizer" / "standin", slurp(tiny / "tiktoken.model") + '\0' +
                                           slurp(tiny / "tokenizer_config.json") + '\0' + text);
    const fs::path gt = shared / "golden" / "tokenizer";
    if (!shared.empty() && fs::exists(gt / "tiktoken.model"))
      put(out / "tokenizer" / "kimi",
          slurp(gt / "tiktoken.model") + '\0' + slurp(gt / "tokenizer_config.json") + '\0' + text);
    // routing: recordings in k3-tiny's shape (MoE layers 1..8, top-4 of 16), 1 and 5 positions.
    const ModelConfig c = parse_config(slurp(tiny / "config.json"), "k3-tiny");
    for (int rows : {1, 5}) {
      engine::RoutingLog log;
      log.top_k = c.moe.top_k;
      for (int l = 0; l < c.num_layers; ++l)
        if (c.is_moe(l))
          for (int p = 0; p < rows; ++p) {
            std::vector<int> ids;
            for (int j = 0; j < c.moe.top_k; ++j)
              ids.push_back((p * 5 + l + j * 3) % c.moe.num_experts);
            std::sort(ids.begin(), ids.end());
            ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
            for (int e = 0; int(ids.size()) < c.moe.top_k; ++e)
              if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
            log.record(l, p, ids);
          }
      fs::create_directories(out / "routing");
      log.save(out / "routing" / ("rows" + std::to_string(rows) + ".json"));
    }
    // batch: request lines of both endpoints (the format of tests/tools/cmd_batch_test.cpp).
    const char* lines[] = {
        R"({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"model": "k3", "prompt": "The quick brown fox", "max_tokens": 8, "temperature": 0, "stop": ["."]}})",
        R"({"custom_id": "b", "method": "POST", "url": "/v1/completions", "body": {"prompt": [1, 2, 3], "max_tokens": 4, "seed": 7, "top_p": 0.9}})",
        R"({"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], "max_tokens": 16}})",
        R"({"custom_id": "d", "method": "GET", "url": "/v1/embeddings", "body": {}})"};
    n = 0;
    for (const char* l : lines) put(out / "batch" / ("line" + std::to_string(n++) + ".jsonl"), l);
    fs::remove_all(tiny);
    std::printf("fuzz_seeds: wrote %s\n", out.c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "fuzz_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
