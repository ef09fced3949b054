// Bringing a QP up from RESET to RTS (or RTR for XRC_RECV) with exactly the attributes that
// ib_modify_qp_is_ok requires for its type (semantics.md G), given the peer's endpoint. The
// endpoint is what two hosts exchange out of band (pyverbs' tests exchange the same fields).
#pragma once

#include <cstdint>

#include "rdmalab/types.h"
#include "rdmalab/verbs.h"

namespace rdmalab::stack {

// What a peer needs to reach a QP. transport and port_num are local facts carried along so
// that bring_up (which sees only the Qp) knows which attribute set the device takes.
struct Endpoint {
  uint32_t qp_num = 0;
  uint32_t psn = 0;
  Gid gid;
  uint16_t lid = 0;  // the engine API has no port-attribute query yet: 0, routing by GID
  Transport transport = Transport::IB;
  uint8_t port_num = 1;
};

// The endpoint of qp on ctx: GID index 0 of port 1, the device's transport, psn as given.
Endpoint local_endpoint(Context& ctx, Qp& qp, uint32_t psn);

struct RcParams {
  uint32_t path_mtu = 1024;
  uint8_t timeout = 14;
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint8_t min_rnr_timer = 12;
  uint8_t max_rd_atomic = 1;
  uint8_t max_dest_rd_atomic = 1;
  uint32_t access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;
  uint32_t qkey = 0x11111111;  // UD only
  uint16_t pkey_index = 0;
};

// The attribute masks each transition takes for a QP type on a transport (table form of
// semantics.md G; iWARP follows iw_cm_init_qp_attr). 0 = the transition is not taken.
struct TransitionMasks {
  uint32_t to_init = 0;
  uint32_t to_rtr = 0;
  uint32_t to_rts = 0;
};
TransitionMasks transition_masks(QpType type, Transport transport);

// The attribute values for every transition, whatever the mask: a backend reads only what
// the mask names (an iWARP device learns its peer from the connection, not from the mask).
QpAttr bring_up_attr(const Endpoint& local, const Endpoint& remote, const RcParams& params);

// RESET -> INIT -> RTR -> RTS (XRC_RECV stops at RTR; UD ignores remote). The QP must be in
// RESET. Errors from ibv_modify_qp propagate unchanged.
void bring_up(Qp& qp, const Endpoint& local, const Endpoint& remote, const RcParams& params = {});

}  // namespace rdmalab::stack
