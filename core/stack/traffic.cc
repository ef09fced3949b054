#include "stack/traffic.h"

#include <algorithm>

#include "rdmalab/error.h"

namespace rdmalab::stack {

Traffic::Traffic(Runtime& runtime, CompletionLedger& ledger, History* history, std::string host)
    : runtime_(runtime), ledger_(ledger), history_(history), host_(std::move(host)) {}

uint64_t Traffic::next_wr_id() {
  for (;;) {
    uint64_t id;
    {
      std::lock_guard lock(mu_);
      id = next_wr_id_++;
    }
    if (!ledger_.entry(id)) return id;  // skip ids a caller chose by hand
  }
}

uint64_t Traffic::prepare(uint64_t wr_id) {
  return wr_id != 0 ? wr_id : next_wr_id();
}

void Traffic::check(const Object& obj, const char* verb, const char* kind) const {
  if (host_.empty() && history_ == nullptr) return;
  check_owner(scope(), obj, verb, kind);
}

namespace {

// Runs post; on Error removes the ledger entry (the WR never reached the queue) and rethrows.
template <typename Post>
void post_or_forget(CompletionLedger& ledger, History* history, const std::string& host,
                    const std::string& label, uint64_t wr_id, Post&& post) {
  try {
    post();
  } catch (const Error& e) {
    ledger.forget(wr_id);
    if (history != nullptr) {
      history->record(host, label, "post_refused",
                      {{"wr_id", wr_id}, {"verb", e.verb()}, {"errno", e.err()}});
    }
    throw;
  }
}

}  // namespace

uint64_t Traffic::post_send(Qp& qp, SendWr wr) {
  check(qp, "Traffic::post_send", "qp");
  wr.wr_id = prepare(wr.wr_id);
  ledger_.on_post(qp.label(), qp.qp_num(), WorkQueue::SQ, wr.wr_id, wr.signaled);
  post_or_forget(ledger_, history_, host_, qp.label(), wr.wr_id, [&] { qp.post_send(wr); });
  return wr.wr_id;
}

uint64_t Traffic::post_recv(Qp& qp, RecvWr wr) {
  check(qp, "Traffic::post_recv", "qp");
  wr.wr_id = prepare(wr.wr_id);
  ledger_.on_post(qp.label(), qp.qp_num(), WorkQueue::RQ, wr.wr_id);
  post_or_forget(ledger_, history_, host_, qp.label(), wr.wr_id, [&] { qp.post_recv(wr); });
  return wr.wr_id;
}

uint64_t Traffic::post_srq_recv(Srq& srq, RecvWr wr) {
  check(srq, "Traffic::post_srq_recv", "srq");
  wr.wr_id = prepare(wr.wr_id);
  ledger_.on_post(srq.label(), srq.srq_num(), WorkQueue::SRQ, wr.wr_id);
  post_or_forget(ledger_, history_, host_, srq.label(), wr.wr_id, [&] { srq.post_recv(wr); });
  return wr.wr_id;
}

std::vector<WorkCompletion> Traffic::poll(Cq& cq, int max) {
  check(cq, "Traffic::poll", "cq");
  return poll_one(cq, max);
}

std::vector<WorkCompletion> Traffic::poll_one(Cq& cq, int max) {
  std::vector<WorkCompletion> wcs = cq.poll(max);
  for (const auto& wc : wcs) ledger_.on_completion(wc);
  if (!wcs.empty()) {
    std::lock_guard lock(mu_);
    completions_.insert(completions_.end(), wcs.begin(), wcs.end());
  }
  return wcs;
}

bool Traffic::poll_until(Cq& cq, const std::function<bool()>& pred, TimeNs deadline_ns) {
  return poll_until(std::vector<Cq*>{&cq}, pred, deadline_ns);
}

size_t Traffic::poll_each(const std::vector<Cq*>& cqs) {
  size_t got = 0;
  for (size_t i = 0; i < cqs.size(); ++i) {
    // The same CQ may be named twice (send_cq == recv_cq): poll it once.
    if (std::find(cqs.begin(), cqs.begin() + static_cast<std::ptrdiff_t>(i), cqs[i]) !=
        cqs.begin() + static_cast<std::ptrdiff_t>(i)) {
      continue;
    }
    got += poll_one(*cqs[i], 32).size();
  }
  return got;
}

bool Traffic::pace(TimeNs& gap_ns, bool got, TimeNs deadline_ns) {
  const TimeNs now = runtime_.now_ns();
  if (now >= deadline_ns || runtime_.stopping()) return false;
  gap_ns = got ? poll_min_ns_ : std::min(gap_ns * 2, poll_max_ns_);
  // A CQ is read only by polling, so there is no pred to wait on: let time pass.
  runtime_.wait_until([] { return false; }, std::min(deadline_ns, now + gap_ns));
  return true;
}

bool Traffic::poll_until(const std::vector<Cq*>& cqs, const std::function<bool()>& pred,
                         TimeNs deadline_ns) {
  for (const Cq* cq : cqs) {
    if (cq == nullptr) throw Error("Traffic::poll_until", EINVAL, "no cq");
    check(*cq, "Traffic::poll_until", "cq");
  }
  TimeNs gap = poll_min_ns_;
  for (;;) {
    const bool got = poll_each(cqs) > 0;
    if (pred()) return true;
    if (!pace(gap, got, deadline_ns)) return false;
  }
}

bool Traffic::wait_completions(Cq& cq, size_t n, TimeNs deadline_ns) {
  check(cq, "Traffic::wait_completions", "cq");
  size_t seen = 0;
  TimeNs gap = poll_min_ns_;
  for (;;) {
    const size_t got = poll_each({&cq});
    seen += got;
    if (seen >= n) return true;
    if (!pace(gap, got > 0, deadline_ns)) return false;
  }
}

std::vector<WorkCompletion> Traffic::completions() const {
  std::lock_guard lock(mu_);
  return completions_;
}

size_t Traffic::completion_count() const {
  std::lock_guard lock(mu_);
  return completions_.size();
}

std::vector<WorkCompletion> Traffic::completions_since(size_t index) const {
  std::lock_guard lock(mu_);
  if (index >= completions_.size()) return {};
  return {completions_.begin() + static_cast<std::ptrdiff_t>(index), completions_.end()};
}

void Traffic::set_poll_interval(TimeNs min_ns, TimeNs max_ns) {
  if (min_ns <= 0 || max_ns < min_ns) {
    throw Error("set_poll_interval", EINVAL, "need 0 < min_ns <= max_ns");
  }
  poll_min_ns_ = min_ns;
  poll_max_ns_ = max_ns;
}

}  // namespace rdmalab::stack
