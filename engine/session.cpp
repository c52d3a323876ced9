// Session (engine/session.h): one slot of a backend driven by the layer schedule.
#include "engine/session.h"

#include <algorithm>
#include <cstring>

#include "storage/error.h"

namespace strata::engine {

BackendOptions SessionOptions::backend() const {
  BackendOptions b;
  b.precision = precision;
  b.experts = experts;
  b.kda_form = kda_form;
  b.mla_form = mla_form;
  b.wrap_executor = wrap_executor;
  b.on_moe_input = on_moe_input;
  return b;
}

namespace {
void check_stop_after(const ModelConfig& c, int stop_after_layer) {
  if (stop_after_layer >= c.num_layers)
    throw Error("--stop-after-layer " + std::to_string(stop_after_layer) +
                ": the model has layers 0.." + std::to_string(c.num_layers - 1));
}
ScheduleOptions schedule_options(const SessionOptions& o) {
  ScheduleOptions s;
  s.stop_after_layer = o.stop_after_layer;
  s.dumper = o.dumper;
  return s;
}
}  // namespace

Session::Session(const Model& model, SessionOptions options)
    : model_(model),
      opt_(std::move(options)),
      owned_((check_stop_after(model.config(), opt_.stop_after_layer),
              std::make_unique<CpuRefBackend>(model, opt_.backend(), 1))),
      backend_(owned_.get()),
      trace_{opt_.dumper, opt_.record_routing, opt_.replay_routing},
      schedule_(*backend_, model.config(), schedule_options(opt_)) {
  backend_->set_trace(&trace_);
}

Session::Session(const Model& model, Backend& backend, int slot, SessionOptions options)
    : model_(model),
      opt_(std::move(options)),
      backend_(&backend),
      slot_(slot),
      trace_{opt_.dumper, opt_.record_routing, opt_.replay_routing},
      schedule_(backend, model.config(), schedule_options(opt_)) {
  check_stop_after(model.config(), opt_.stop_after_layer);
  STRATA_ASSERT(slot >= 0 && slot < backend.slots());
  backend_->set_trace(&trace_);
}

Session::~Session() {
  if (backend_) backend_->set_trace(nullptr);
}

std::vector<float> Session::forward(std::span<const int32_t> ids, bool all_logits) {
  std::vector<float> out;
  run_chunks(ids, all_logits, nullptr, [&](const StepOutput& o) {
    out.insert(out.end(), o.logits[0].begin(), o.logits[0].end());
  });
  return out;
}

int32_t Session::forward_token(std::span<const int32_t> ids, const TokenDraw& draw) {
  int32_t id = -1;
  run_chunks(ids, false, &draw, [&](const StepOutput& o) { id = o.tokens[0]; });
  return id;
}

void Session::run_chunks(std::span<const int32_t> ids, bool all_logits, const TokenDraw* draw,
                         const std::function<void(const StepOutput&)>& take) {
  // A shard truncated, rewritten or replaced since load stops the run here, with its name,
  // before any weight of it is read again (a truncated mapping would raise SIGBUS).
  model_.checkpoint().check_unchanged();
  backend_->set_trace(&trace_);
  // Prompts longer than one step of the backend run in chunks (chunked prefill); only the last
  // chunk's last row gives logits (or the draw) unless all rows are wanted.
  if (ids.empty()) throw Error("forward: empty token list");
  const int64_t R = std::max<int64_t>(1, backend_->max_step_rows());
  for (size_t at = 0; at < ids.size(); at += size_t(R)) {
    SeqChunk ch;
    ch.slot = slot_;
    ch.ids = ids.subspan(at, std::min(ids.size() - at, size_t(R)));
    const bool last = at + ch.ids.size() >= ids.size();
    ch.all_logits = all_logits;
    ch.want_logits = last || all_logits;
    ch.draw = last ? draw : nullptr;
    take(schedule_.step(std::span<const SeqChunk>(&ch, 1)));
  }
}

StepShape Session::shape(int64_t T) const {
  StepShape s;
  SeqSpan q;
  q.slot = slot_;
  q.pos0 = position();
  q.T = T;
  s.seqs.push_back(q);
  s.rows = T;
  return s;
}

ActStream Session::upload(const StepShape& s, const Stream& st) {
  const int64_t D = model_.config().hidden_size;
  schedule_.begin(s);
  ActStream a;
  for (const auto& b : st.blocks) {
    Act x = backend_->alloc(s.rows, D);
    backend_->from_host(b.data(), x);
    a.blocks.push_back(x);
  }
  if (!st.P.empty()) {
    a.P = backend_->alloc(s.rows, D);
    backend_->from_host(st.P.data(), a.P);
  }
  return a;
}

void Session::download(const ActStream& a, Stream& st) {
  const size_t n = size_t(st.T * model_.config().hidden_size);
  st.blocks.resize(a.blocks.size());
  for (size_t i = 0; i < a.blocks.size(); ++i) {
    st.blocks[i].resize(n);
    backend_->to_host(a.blocks[i], st.blocks[i].data());
  }
  if (a.P.data) {
    st.P.resize(n);
    backend_->to_host(a.P, st.P.data());
  } else {
    st.P.clear();
  }
}

Stream Session::embed(std::span<const int32_t> ids) {
  if (ids.empty()) throw Error("forward: empty token list");
  model_.checkpoint().check_unchanged();
  backend_->set_trace(&trace_);
  StepShape s = shape(int64_t(ids.size()));
  ActStream a = schedule_.embed(s, ids);
  Stream st;
  st.T = s.rows;
  download(a, st);
  return st;
}

void Session::run_layer(int l, Stream& st) {
  backend_->set_trace(&trace_);
  StepShape s = shape(st.T);
  ActStream a = upload(s, st);
  schedule_.run_layer(l, s, a);
  download(a, st);
}

std::vector<float> Session::head(const Stream& st, bool all_logits) {
  StepShape s = shape(st.T);
  ActStream a = upload(s, st);
  std::vector<int64_t> rows;
  for (int64_t t = all_logits ? 0 : st.T - 1; t < st.T; ++t) rows.push_back(t);
  std::vector<float> out(rows.size() * size_t(model_.config().vocab_size));
  schedule_.head(a, rows, out.data());
  return out;
}

void Session::advance(int64_t T) {
  backend_->commit_step(shape(T));
}

const KdaState* Session::kda_state(int l) const {
  auto* cpu = dynamic_cast<const CpuRefBackend*>(backend_);
  return cpu ? cpu->kda_state(slot_, l) : nullptr;
}
const MlaCache* Session::mla_cache(int l) const {
  auto* cpu = dynamic_cast<const CpuRefBackend*>(backend_);
  return cpu ? cpu->mla_cache(slot_, l) : nullptr;
}

}  // namespace strata::engine
