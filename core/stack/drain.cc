#include "stack/drain.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "rdmalab/error.h"

namespace rdmalab::stack {

namespace {

struct QueueDrain {
  WorkQueue queue;
  bool used = true;                // false: the QP has no such queue (XRC_RECV SQ, SRQ RQ)
  std::optional<uint64_t> marker;  // its wr_id; none: counting
};

// Posts a marker via post; nullopt (and a note) when the provider refuses it.
std::optional<uint64_t> try_marker(const std::function<uint64_t()>& post, const char* queue,
                                   std::vector<std::string>& notes) {
  try {
    return post();
  } catch (const Error& e) {
    notes.emplace_back(std::string(queue) + " marker refused by " + e.verb() + " (errno " +
                       std::to_string(e.err()) + "): counting");
    return std::nullopt;
  }
}

bool queue_done(const CompletionLedger& ledger, const std::string& label, const QueueDrain& q) {
  if (!q.used) return true;
  if (q.marker) {
    auto e = ledger.entry(*q.marker);
    if (!e || e->outcome == WrOutcome::PENDING) return false;
  }
  return ledger.outstanding(label, q.queue) == 0;
}

std::string outstanding_text(const CompletionLedger& ledger, const std::string& label,
                             const QueueDrain& q) {
  if (!q.used) return "";
  std::string text;
  const auto ids = ledger.outstanding_ids(label, q.queue);
  if (!ids.empty()) {
    text +=
        std::string(to_string(q.queue)) + " " + std::to_string(ids.size()) + " outstanding (wr_id";
    for (size_t i = 0; i < ids.size() && i < 8; ++i) text += " " + std::to_string(ids[i]);
    text += ids.size() > 8 ? " ...)" : ")";
  }
  if (q.marker) {
    auto e = ledger.entry(*q.marker);
    if (e && e->outcome == WrOutcome::PENDING) {
      text += (text.empty() ? "" : ", ") + std::string(to_string(q.queue)) + " marker pending";
    }
  }
  return text;
}

// Waits (polling, so the CQs do not overflow meanwhile) for QP_LAST_WQE_REACHED after the
// move to ERR. Uses half the time left so that the counting fallback keeps the other half.
bool await_last_wqe(Runtime& rt, Qp& qp, Traffic& traffic, const std::vector<Cq*>& cqs,
                    AsyncDispatcher* dispatcher, size_t baseline, TimeNs deadline_ns,
                    const std::function<bool()>& overflowed, std::vector<std::string>& notes) {
  if (dispatcher == nullptr) {
    notes.emplace_back("no dispatcher to deliver QP_LAST_WQE_REACHED: counting");
    return false;
  }
  const DeviceCaps& caps = dispatcher->context().caps();
  if (!caps.raises.empty() && !caps.raises_event(AsyncEventType::QP_LAST_WQE_REACHED)) {
    notes.emplace_back(caps.name + " does not raise QP_LAST_WQE_REACHED: counting");
    return false;
  }
  const TimeNs now = rt.now_ns();
  const TimeNs event_deadline = now + (deadline_ns - now) / 2;
  const uint64_t id = qp.id();
  const bool got = traffic.poll_until(
      cqs,
      [&] {
        return overflowed() ||
               dispatcher->count_events(id, AsyncEventType::QP_LAST_WQE_REACHED) > baseline;
      },
      event_deadline);
  if (overflowed()) return false;
  if (!got) notes.emplace_back("no QP_LAST_WQE_REACHED before the wait ended: counting");
  return got;
}

// Counts this drain's completions for qp and checks posting order per work queue.
void tally(const CompletionLedger& ledger, const Qp& qp, const std::vector<WorkCompletion>& wcs,
           const std::vector<uint64_t>& markers, DrainReport& r) {
  std::map<WorkQueue, uint64_t> last_seq;
  for (const auto& wc : wcs) {
    if (std::find(markers.begin(), markers.end(), wc.wr_id) != markers.end()) continue;
    auto e = ledger.entry(wc.wr_id);
    if (!e || wc.qp_num != qp.qp_num()) continue;
    if (e->queue != WorkQueue::SRQ && e->label != qp.label()) continue;
    if (wc.status == WcStatus::SUCCESS)
      ++r.succeeded;
    else if (wc.status == WcStatus::WR_FLUSH_ERR)
      ++r.flushed;
    else
      ++r.errored;
    if (e->queue == WorkQueue::SRQ) continue;  // shared by several QPs: no order to keep
    if (e->post_seq < last_seq[e->queue]) r.order_kept = false;
    last_seq[e->queue] = e->post_seq;
  }
}

void record(Traffic& traffic, const Qp& qp, const std::string& kind, nlohmann::json data) {
  if (traffic.history() != nullptr) {
    traffic.history()->record(traffic.host(), qp.label(), kind, std::move(data));
  }
}

// ERR on every transport: SQD is iWARP's CLOSING and needs an empty SQ (seed 000). A failed
// modify (a dead device) is noted; the drain still counts what the provider flushes.
void modify_to_err(Qp& qp, std::vector<std::string>& notes) {
  try {
    QpAttr attr;
    attr.qp_state = QpState::ERR;
    qp.modify(attr, QP_STATE);
  } catch (const Error& e) {
    notes.emplace_back("modify to ERR failed (errno " + std::to_string(e.err()) + ")");
  }
}

// The markers of __ib_drain_sq / __ib_drain_rq: a zero-length RDMA WRITE and an empty recv.
// UD has no RDMA WRITE and XRC has one-sided queues: those queues count instead.
void post_markers(Qp& qp, Traffic& traffic, QueueDrain& sq, QueueDrain& rq,
                  std::vector<std::string>& notes) {
  if (sq.used && qp.qp_type() != QpType::UD) {
    sq.marker = try_marker(
        [&] {
          SendWr wr;
          wr.opcode = WrOpcode::RDMA_WRITE;
          wr.signaled = true;
          return traffic.post_send(qp, wr);
        },
        "SQ", notes);
  }
  if (rq.used) {
    rq.marker = try_marker([&] { return traffic.post_recv(qp, RecvWr{}); }, "RQ", notes);
  }
}

void record_end(Traffic& traffic, const Qp& qp, const DrainReport& r) {
  record(traffic, qp, "drain_end",
         {{"method", r.method},
          {"complete", r.complete},
          {"flushed", r.flushed},
          {"succeeded", r.succeeded},
          {"errored", r.errored},
          {"order_kept", r.order_kept},
          {"last_wqe_reached", r.last_wqe_reached},
          {"elapsed_ns", r.elapsed_ns},
          {"cq_overflow", r.cq_overflow},
          {"detail", r.detail}});
}

}  // namespace

DrainReport drain_qp(Runtime& rt, Qp& qp, Traffic& traffic, Cq& send_cq, Cq& recv_cq,
                     TimeNs deadline_ns, AsyncDispatcher* dispatcher, Srq* srq) {
  // Everything of the QP's context (and the traffic's host), before the QP is touched.
  const std::string verb = "drain";
  check_owner(traffic.scope(), qp, verb, "qp");
  check_owner(qp, send_cq, verb, "send_cq");
  check_owner(qp, recv_cq, verb, "recv_cq");
  if (srq != nullptr) check_owner(qp, *srq, verb, "srq");
  if (dispatcher != nullptr) check_owner(qp, dispatcher->context(), verb, "dispatcher's context");
  DrainReport r;
  const TimeNs t0 = rt.now_ns();
  const std::string label = qp.label();
  CompletionLedger& ledger = traffic.ledger();
  const std::vector<Cq*> cqs{&send_cq, &recv_cq};
  std::vector<std::string> notes;
  r.srq_attached = srq != nullptr;
  r.outstanding_sq = ledger.outstanding(label, WorkQueue::SQ);
  r.outstanding_rq = ledger.outstanding(label, WorkQueue::RQ);
  record(traffic, qp, "drain_begin",
         {{"outstanding_sq", r.outstanding_sq}, {"outstanding_rq", r.outstanding_rq}});
  const size_t first_wc = traffic.completion_count();
  const size_t last_wqe_baseline =
      dispatcher ? dispatcher->count_events(qp.id(), AsyncEventType::QP_LAST_WQE_REACHED) : 0;

  // A CQ_ERR on either CQ (read by the dispatcher, before or during the drain): completions
  // were lost (CQ overflow), so what is outstanding may never complete.
  const auto overflowed_cq = [&]() -> Cq* {
    if (dispatcher == nullptr) return nullptr;
    for (Cq* cq : cqs) {
      if (dispatcher->count_events(cq->id(), AsyncEventType::CQ_ERR) > 0) return cq;
    }
    return nullptr;
  };
  const std::function<bool()> overflowed = [&] { return overflowed_cq() != nullptr; };

  modify_to_err(qp, notes);
  QueueDrain sq{WorkQueue::SQ, qp.qp_type() != QpType::XRC_RECV, std::nullopt};
  QueueDrain rq{WorkQueue::RQ, srq == nullptr && qp.qp_type() != QpType::XRC_SEND, std::nullopt};
  if (qp.device_caps().err_post == ErrPostPolicy::kStrand) {
    // A marker would never complete: count the flushes of what is outstanding instead.
    notes.emplace_back("the provider strands WRs posted in ERR (err_post strand): counting");
  } else {
    post_markers(qp, traffic, sq, rq, notes);
  }
  // librxe writes receives into the mapped queue without entering the kernel, so on rxe an RQ
  // marker posted to an ERR QP is never flushed (seen in the VM lab, Linux 6.1). ERR -> ERR is
  // valid (verbs.c qp_state_table) and makes the provider flush what is queued.
  if (rq.marker) modify_to_err(qp, notes);
  bool counting = (sq.used && !sq.marker) || (rq.used && !rq.marker);
  if (srq != nullptr) {
    r.last_wqe_reached = await_last_wqe(rt, qp, traffic, cqs, dispatcher, last_wqe_baseline,
                                        deadline_ns, overflowed, notes);
    counting = counting || !r.last_wqe_reached;
  }
  r.method = counting ? "counting" : "marker";

  const auto done = [&] { return queue_done(ledger, label, sq) && queue_done(ledger, label, rq); };
  traffic.poll_until(
      cqs, [&] { return done() || overflowed(); }, deadline_ns);
  // SRQ: reap the completions already generated for this QP (bounded: CQs are finite).
  for (int i = 0; srq != nullptr && i < 1024 && !traffic.poll(recv_cq).empty(); ++i) {
  }

  std::vector<uint64_t> markers;
  if (sq.marker) markers.push_back(*sq.marker);
  if (rq.marker) markers.push_back(*rq.marker);
  tally(ledger, qp, traffic.completions_since(first_wc), markers, r);
  r.complete = done();
  if (Cq* cq = overflowed_cq(); cq != nullptr) {
    r.cq_overflow = cq->label();
    notes.emplace_back(cq->label() + " overflowed (CQ_ERR): its lost completions never come");
  }
  if (!r.complete) {
    std::string left = outstanding_text(ledger, label, sq);
    const std::string rq_left = outstanding_text(ledger, label, rq);
    left += (left.empty() || rq_left.empty() ? "" : "; ") + rq_left;
    notes.emplace_back("not drained by the deadline: " + left);
  }
  for (const auto& n : notes) r.detail += (r.detail.empty() ? "" : "; ") + n;
  r.elapsed_ns = rt.now_ns() - t0;
  record_end(traffic, qp, r);
  return r;
}

}  // namespace rdmalab::stack
