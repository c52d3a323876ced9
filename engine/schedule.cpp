// The layer schedule (engine/schedule.h): spec §2.2 step by step, each sublayer a backend call.
#include "engine/schedule.h"

#include <string>

#include "engine/finite_check.h"
#include "storage/error.h"

namespace strata::engine {

StepShape Schedule::shape(std::span<const SeqChunk> chunks) const {
  StepShape s;
  for (const SeqChunk& ch : chunks) {
    if (ch.ids.empty()) throw Error("forward: empty token list");
    if (ch.slot < 0 || ch.slot >= b_.slots())
      throw Error("forward: slot " + std::to_string(ch.slot) + " outside the backend's " +
                  std::to_string(b_.slots()) + " slots");
    for (const SeqSpan& q : s.seqs)
      STRATA_ASSERT(q.slot != ch.slot);  // one chunk per sequence per step
    SeqSpan q;
    q.slot = ch.slot;
    q.pos0 = b_.position(ch.slot);
    q.row0 = s.rows;
    q.T = int64_t(ch.ids.size());
    s.seqs.push_back(q);
    s.rows += q.T;
  }
  return s;
}

void Schedule::dump(const std::string& name, Act a, const std::vector<int64_t>& row_shape) {
  if (!opt_.dumper || !single_ || !opt_.dumper->wants(name)) return;
  host_.resize(size_t(a.size()));
  b_.to_host(a, host_.data());
  opt_.dumper->add(name, host_.data(), a.rows, row_shape);
}
void Schedule::dump(int l, const char* site, Act a, const std::vector<int64_t>& row_shape) {
  if (opt_.dumper) dump(site_name(l, site), a, row_shape);
}

void Schedule::begin(const StepShape& s) {
  const int64_t D = c_.hidden_size;
  single_ = s.single();
  b_.begin_step(s);
  x_ = b_.alloc(s.rows, D);
  h_ = b_.alloc(s.rows, D);
  a_ = b_.alloc(s.rows, D);
}

ActStream Schedule::embed(const StepShape& s, std::span<const int32_t> ids) {
  const int64_t D = c_.hidden_size;
  for (const SeqSpan& q : s.seqs)
    for (int64_t t = 0; t < q.T; ++t) {
      const int32_t id = ids[size_t(q.row0 + t)];
      if (id < 0 || id >= c_.vocab_size)
        throw Error("token id " + std::to_string(id) + " at position " +
                    std::to_string(q.pos0 + t) +
                    (s.single() ? "" : " of slot " + std::to_string(q.slot)) +
                    " is outside the vocabulary [0, " + std::to_string(c_.vocab_size) + ")");
    }
  begin(s);
  ActStream st;
  st.P = b_.alloc(s.rows, D);
  b_.embed(ids, st.P);
  dump("embed", st.P, {D});
  b_.check_finite(st.P, s, -1, "embed");
  return st;
}

void Schedule::run_layer(int l, const StepShape& s, ActStream& st) {
  const int64_t D = c_.hidden_size;
  // (a) input to the token mixer: AttnRes over [B…, P] (layer 0: B empty → x = P), or P itself.
  std::vector<Act> src;
  Act x = st.P;
  if (c_.has_attn_res() && !st.blocks.empty()) {
    src = st.blocks;
    if (st.P.data) src.push_back(st.P);
    b_.mix(l, MixSite::attn, src, x_);
    x = x_;
  }
  dump(l, "mix_attn", x, {D});
  // (b) block boundary: bank the raw stream, restart the partial sum.
  if (c_.opens_block(l)) {
    st.blocks.push_back(st.P);
    st.P = Act{};
  }
  // (c) token mixer on the normed input.
  b_.norm(l, NormSite::input, x, h_);
  dump(l, "attn_norm", h_, {D});
  b_.token_mixer(l, s, h_, a_);
  const char* mixer_site = c_.is_kda(l) ? "kda_out" : "mla_out";
  dump(l, mixer_site, a_, {D});
  // Non-finite values stop the step where they first appear (issue 17: never sample from NaN).
  b_.check_finite(a_, s, l, mixer_site);
  if (!st.P.data) {
    st.P = a_;  // the mixer output starts the new partial sum
    a_ = b_.alloc(s.rows, D);
  } else {
    b_.add(st.P, a_);
  }
  // (d) input to the FFN: AttnRes over [B…, P] (B is never empty here), or P.
  x = st.P;
  if (c_.has_attn_res()) {
    src = st.blocks;
    src.push_back(st.P);
    b_.mix(l, MixSite::mlp, src, x_);
    x = x_;
  }
  dump(l, "mix_mlp", x, {D});
  b_.norm(l, NormSite::post, x, h_);
  dump(l, "ffn_norm", h_, {D});
  b_.ffn(l, s, h_, a_);
  const char* ffn_site = c_.is_moe(l) ? "moe_out" : "mlp_out";
  dump(l, ffn_site, a_, {D});
  b_.check_finite(a_, s, l, ffn_site);
  b_.add(st.P, a_);
  dump(l, "out", st.P, {D});
}

void Schedule::head(const ActStream& st, std::span<const int64_t> rows, float* out,
                    std::span<const int64_t> draw_rows, std::span<const TokenDraw> draws,
                    int32_t* draw_ids) {
  const int64_t D = c_.hidden_size;
  Act h = st.P;
  if (c_.has_attn_res()) {  // final AttnRes mix over [B…, P]
    std::vector<Act> src = st.blocks;
    if (st.P.data) src.push_back(st.P);
    b_.mix(-1, MixSite::output, src, x_);
    h = x_;
  }
  dump("final_mix", h, {D});
  b_.norm(-1, NormSite::final, h, h_);
  dump("final_norm", h_, {D});
  if (!rows.empty()) {
    b_.logits(h_, rows, out);
    // Host logits, every row (named by its index among the rows asked for, and the token id).
    check_finite(out, int64_t(rows.size()), c_.vocab_size, -1, "logits", 0, "logits row ");
    if (opt_.dumper && single_ && opt_.dumper->wants("logits"))
      opt_.dumper->add("logits", out, int64_t(rows.size()), {c_.vocab_size});
  }
  if (!draw_rows.empty()) b_.sample(h_, draw_rows, draws, c_.vocab_size, draw_ids);
}

const StepOutput& Schedule::step(std::span<const SeqChunk> chunks) {
  StepShape s = shape(chunks);
  std::vector<int32_t> ids;
  ids.reserve(size_t(s.rows));
  for (const SeqChunk& ch : chunks) ids.insert(ids.end(), ch.ids.begin(), ch.ids.end());
  ActStream st = embed(s, ids);
  out_.logits.assign(chunks.size(), {});
  out_.tokens.assign(chunks.size(), -1);
  for (int l = 0; l < c_.num_layers; ++l) {
    run_layer(l, s, st);
    if (l == opt_.stop_after_layer) {
      b_.commit_step(s);
      return out_;
    }
  }
  // Rows whose logits are wanted, in chunk order, and rows whose token is drawn; one head call.
  rows_.clear();
  draw_rows_.clear();
  draws_.clear();
  for (size_t i = 0; i < chunks.size(); ++i) {
    const SeqSpan& q = s.seqs[i];
    if (chunks[i].draw) {
      draw_rows_.push_back(q.row0 + q.T - 1);
      draws_.push_back(*chunks[i].draw);
    } else if (chunks[i].all_logits) {
      for (int64_t t = 0; t < q.T; ++t) rows_.push_back(q.row0 + t);
    } else if (chunks[i].want_logits) {
      rows_.push_back(q.row0 + q.T - 1);
    }
  }
  if (!rows_.empty() || !draw_rows_.empty()) {
    const int64_t V = c_.vocab_size;
    if (logits_.size() < rows_.size() * size_t(V)) logits_.resize(rows_.size() * size_t(V));
    draw_ids_.resize(draw_rows_.size());
    head(st, rows_, logits_.data(), draw_rows_, draws_, draw_ids_.data());
    size_t r = 0, k = 0;
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (chunks[i].draw) {
        out_.tokens[i] = draw_ids_[k++];
        continue;
      }
      const int64_t n = chunks[i].all_logits ? s.seqs[i].T : chunks[i].want_logits ? 1 : 0;
      out_.logits[i] = std::span<const float>(logits_.data() + int64_t(r) * V, size_t(n * V));
      r += size_t(n);
    }
  }
  b_.commit_step(s);
  return out_;
}

std::vector<std::vector<float>> Schedule::step_logits(std::span<const SeqChunk> chunks) {
  const StepOutput& o = step(chunks);
  std::vector<std::vector<float>> out;
  out.reserve(o.logits.size());
  for (std::span<const float> l : o.logits) out.emplace_back(l.begin(), l.end());
  return out;
}

}  // namespace strata::engine
