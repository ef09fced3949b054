// Posting and polling through the ledger: every WR gets a unique wr_id and a ledger entry
// before it reaches the provider, and every completion polled is fed to the ledger and kept.
// Waits go through Runtime::wait_until, so in the model virtual time advances while polling.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "rdmalab/history.h"
#include "rdmalab/runtime.h"
#include "rdmalab/verbs.h"
#include "stack/ledger.h"

namespace rdmalab::stack {

class Traffic {
 public:
  Traffic(Runtime& runtime, CompletionLedger& ledger, History* history = nullptr,
          std::string host = "");

  // A Traffic with a host takes only that host's objects (check_owner's EINVAL, before the
  // ledger sees the WR): its history records go under that host.
  //
  // Each assigns a fresh wr_id when wr.wr_id == 0, records the post, posts, and returns the
  // wr_id. If the provider throws, the ledger entry is removed and the Error rethrown.
  uint64_t post_send(Qp& qp, SendWr wr);
  uint64_t post_recv(Qp& qp, RecvWr wr);
  uint64_t post_srq_recv(Srq& srq, RecvWr wr);

  // One ibv_poll_cq; the completions go to the ledger and to completions().
  std::vector<WorkCompletion> poll(Cq& cq, int max = 32);

  // Polls the CQs (with a backoff between polls) until pred() holds or the deadline passes.
  // pred is checked after each poll; returns pred().
  bool poll_until(Cq& cq, const std::function<bool()>& pred, TimeNs deadline_ns);
  bool poll_until(const std::vector<Cq*>& cqs, const std::function<bool()>& pred,
                  TimeNs deadline_ns);
  // Polls until n more completions came from cq (counted from this call) or the deadline.
  bool wait_completions(Cq& cq, size_t n, TimeNs deadline_ns);

  // Every completion polled through this Traffic, in polling order.
  std::vector<WorkCompletion> completions() const;
  size_t completion_count() const;
  std::vector<WorkCompletion> completions_since(size_t index) const;

  // Poll pacing: the gap between empty polls starts at min and doubles up to max.
  void set_poll_interval(TimeNs min_ns, TimeNs max_ns);

  uint64_t next_wr_id();
  CompletionLedger& ledger() { return ledger_; }
  History* history() const { return history_; }
  const std::string& host() const { return host_; }
  // Where its objects must be from: host() as a whole ("" = any host) of its lab.
  Owner scope() const { return {history_, 0, "", host_}; }
  Runtime& runtime() { return runtime_; }

 private:
  uint64_t prepare(uint64_t wr_id);
  void check(const Object& obj, const char* verb, const char* kind) const;
  std::vector<WorkCompletion> poll_one(Cq& cq, int max);  // poll() without the check
  size_t poll_each(const std::vector<Cq*>& cqs);          // one poll of each distinct CQ
  // Waits before the next poll, the gap doubling while polls come back empty; false at the
  // deadline (or when the runtime stops).
  bool pace(TimeNs& gap_ns, bool got, TimeNs deadline_ns);

  Runtime& runtime_;
  CompletionLedger& ledger_;
  History* history_;
  std::string host_;
  TimeNs poll_min_ns_ = 1 * kNsPerUs;
  TimeNs poll_max_ns_ = 100 * kNsPerUs;
  mutable std::mutex mu_;  // guards next_wr_id_ and completions_; never held across a wait
  uint64_t next_wr_id_ = 1;
  std::vector<WorkCompletion> completions_;
};

}  // namespace rdmalab::stack
