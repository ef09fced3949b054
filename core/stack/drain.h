// A portable QP drain written over the engine API (semantics.md C, seed 000). The kernel's
// recipe: move the QP to ERR (never SQD: on iWARP that is CLOSING and needs an empty SQ),
// post a signaled marker on each queue and poll until it flushes; the marker proves every
// WR posted before it was reaped. Where the provider refuses posts in ERR (libcxgb4: EINVAL)
// the drain counts instead: it polls until the ledger shows nothing outstanding on the QP.
// An SRQ-attached QP has no RQ marker: it waits for QP_LAST_WQE_REACHED, then polls.
#pragma once

#include <cstdint>
#include <string>

#include "rdmalab/runtime.h"
#include "rdmalab/verbs.h"
#include "stack/dispatcher.h"
#include "stack/traffic.h"

namespace rdmalab::stack {

struct DrainReport {
  std::string method;  // "marker" or "counting" (any queue that counted makes it "counting")
  uint64_t outstanding_sq = 0;  // at the start of the drain, from the ledger
  uint64_t outstanding_rq = 0;
  uint64_t succeeded = 0;  // completions for this QP reaped during the drain, markers excluded
  uint64_t flushed = 0;
  uint64_t errored = 0;
  bool order_kept = true;  // each work queue's completions came in posting order
  bool srq_attached = false;
  bool last_wqe_reached = false;
  bool complete = false;  // nothing outstanding on the QP at the end
  // The CQ whose CQ_ERR the dispatcher read ("cq:4"), "" if none: an overflowed CQ has lost
  // completions, so the drain stops there instead of waiting out its deadline.
  std::string cq_overflow;
  TimeNs elapsed_ns = 0;
  std::string detail;  // why a fallback was taken; what is still outstanding
};

// Drains qp, polling send_cq and recv_cq (may be the same CQ) through traffic. srq: the SRQ
// the QP receives from, if any (the API cannot query it); its QP_LAST_WQE_REACHED is awaited
// through the dispatcher. Never waits past deadline_ns: an unfinished drain returns
// complete = false. With a dispatcher, a CQ_ERR on send_cq or recv_cq ends the drain at once
// (cq_overflow names the CQ). The caller stops other posters to this QP, as ib_drain_qp requires.
// What the QP's provider does with a post in ERR is its device's caps.err_post: on kStrand the
// drain posts no markers and counts the flushes of what is outstanding; on kRefuse it comes to
// that when the marker is refused.
DrainReport drain_qp(Runtime& runtime, Qp& qp, Traffic& traffic, Cq& send_cq, Cq& recv_cq,
                     TimeNs deadline_ns, AsyncDispatcher* dispatcher = nullptr, Srq* srq = nullptr);

}  // namespace rdmalab::stack
