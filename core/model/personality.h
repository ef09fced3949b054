// Device personalities: the caps and behaviour flags that make one model device act like rxe,
// mlx5, cxgb4, siw or mana. The table (personality.cc) cites the source of every line.
#pragma once

#include <cerrno>
#include <cstdint>
#include <string>
#include <vector>

#include "rdmalab/types.h"

namespace rdmalab::model {

// What a full CQ does with one more completion.
enum class CqOverflow {
  kLoseEach,  // the completion is lost, CQ_ERR per lost completion, QPs unaffected (rxe, siw)
  kErrorQps,  // CQ_ERR once, the CQ is dead, every QP using it goes to ERR (mlx5)
};

// How ibv_create_cq(n) sizes the CQ: what it reports in cq->cqe and how many completions it
// holds before it overflows (research kernel-facts.md Q11, Linux 6.1).
enum class CqRounding {
  kExact,            // (model) n and n
  kPow2PlusOne,      // rxe: pow2(n + 1) - 1 reported and held (rxe_queue_init, queue_full)
  kPow2PlusOneRing,  // mlx5: pow2(n + 1) - 1 reported, a ring of pow2(n + 1) (mlx5_ib_create_cq)
  kPow2,             // siw: pow2(n) reported and held (siw_create_cq)
  kCxgb4,            // cxgb4: roundup(n + 2, 16) - 2 reported; the IQ is about twice that
};

struct CqSize {
  int cqe = 0;       // ibv_cq->cqe
  int capacity = 0;  // completions it holds; one more overflows it
};

struct Personality {
  DeviceCaps caps;  // name is filled per host ("model-ib0"); caps.qpn_policy drives alloc_qpn
  uint32_t first_qpn = 0x100;
  uint32_t max_qpn = 0xffffff;
  CqOverflow cq_overflow = CqOverflow::kErrorQps;
  CqRounding cq_rounding = CqRounding::kExact;
  // The status of RDMA_CM_EVENT_REJECTED when the peer's MPA reply carries the reject flag.
  int mpa_reject_status = 0;
  // iWARP: the status of DISCONNECTED (IW_CM_EVENT_CLOSE) when the connection ends in an abort
  // (a TCP RST from the peer, or our own abrupt close).
  int abort_close_status = -ECONNRESET;
  // iWARP MPA timers, kernel timers on the wheel (ms; the model arms them through
  // kernel_timer_delay_ns). The active side waiting for the MPA reply after its MPA request:
  // when it runs, CONNECT_REPLY -ETIMEDOUT (rdma_cm UNREACHABLE).
  uint32_t iw_mpa_reply_timeout_ms = 0;
  // The passive side waiting for the MPA request on a TCP connection it accepted: when it
  // runs, the socket is released (a FIN). The model arms it where it models the TCP handshake
  // (caps.connect_is_synchronous); elsewhere the passive endpoint begins with the request.
  uint32_t iw_mpa_request_timeout_ms = 0;
  // (The close timer is caps.iw_close_timeout_s: the callers of caps read it.)
  // iWARP: SQD is RDMAC CLOSING; no posts in CLOSING; modify to CLOSING with SQ WRs -> ERR.
  bool iwarp_closing = false;
  // iWARP: the user moving a connected QP from RTS to ERR ends its connection: an abort (a
  // TCP RST, CLOSE(abort_close_status): cxgb4's c4iw_modify_qp, abort = 1) or a drop (the
  // socket released, a FIN, CLOSE(0): siw_qp_nextstate_from_rts, drop_conn).
  bool qp_error_aborts = false;
  // iWARP: RTS -> CLOSING flushes the RQ at once (siw_qp_nextstate_from_rts: siw_rq_flush;
  // vm:siw swarm seed 4: RECVs flushed by rdma_disconnect).
  bool closing_flushes_rq = false;
  // A post_send while the port is down completes with LOC_QP_OP_ERR and the QP goes to ERR.
  bool send_port_down_loc_qp_op_err = false;
  uint64_t guid_base = 0;
};

// Names in model.h order; throws Error("make_lab", EINVAL) for an unknown name.
const std::vector<std::string>& personality_names();
const Personality& personality(const std::string& name);
// What ibv_create_cq(n) gives on this personality.
CqSize cq_size(const Personality& p, int n);

}  // namespace rdmalab::model
