#include "stack/connect.h"

namespace rdmalab::stack {

Endpoint local_endpoint(Context& ctx, Qp& qp, uint32_t psn) {
  check_owner(ctx, qp, "local_endpoint", "qp");  // the GID and transport are ctx's
  Endpoint ep;
  ep.qp_num = qp.qp_num();
  ep.psn = psn;
  ep.port_num = 1;
  ep.gid = ctx.query_gid(ep.port_num, 0);
  ep.transport = ctx.caps().transport;
  return ep;
}

TransitionMasks transition_masks(QpType type, Transport transport) {
  constexpr uint32_t kInitConnected = QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS;
  constexpr uint32_t kRtrFull = QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN |
                                QP_MAX_DEST_RD_ATOMIC | QP_MIN_RNR_TIMER;
  constexpr uint32_t kRtsFull =
      QP_STATE | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_SQ_PSN | QP_MAX_QP_RD_ATOMIC;
  // iw_cm_init_qp_attr: the connection supplies the peer, the QP takes only access flags.
  if (transport == Transport::iWARP && type != QpType::UD) {
    return {QP_STATE | QP_ACCESS_FLAGS, QP_STATE | QP_ACCESS_FLAGS,
            type == QpType::XRC_RECV ? 0u : uint32_t{QP_STATE}};
  }
  switch (type) {
    case QpType::RC:
      return {kInitConnected, kRtrFull, kRtsFull};
    case QpType::XRC_SEND:
      return {kInitConnected, QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN, kRtsFull};
    case QpType::XRC_RECV:
      return {kInitConnected, kRtrFull, 0};  // a TGT QP only receives: it stays in RTR
    case QpType::UD:
      return {QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_QKEY, QP_STATE, QP_STATE | QP_SQ_PSN};
  }
  return {};
}

QpAttr bring_up_attr(const Endpoint& local, const Endpoint& remote, const RcParams& params) {
  QpAttr a;
  a.qp_access_flags = params.access;
  a.pkey_index = params.pkey_index;
  a.port_num = local.port_num;
  a.qkey = params.qkey;
  a.ah_attr.dgid = remote.gid;
  a.ah_attr.dlid = remote.lid;
  a.ah_attr.port_num = local.port_num;
  a.path_mtu = params.path_mtu;
  a.dest_qp_num = remote.qp_num;
  a.rq_psn = remote.psn;  // the PSN the peer starts sending with
  a.sq_psn = local.psn;
  a.max_rd_atomic = params.max_rd_atomic;
  a.max_dest_rd_atomic = params.max_dest_rd_atomic;
  a.min_rnr_timer = params.min_rnr_timer;
  a.timeout = params.timeout;
  a.retry_cnt = params.retry_cnt;
  a.rnr_retry = params.rnr_retry;
  return a;
}

// On iWARP the connection binds a QP to its peer (iw_cm), not modify: QPs made through
// rdma_cm get their peer from the model's iWARP CM. A QP made with ibv_create_qp and brought
// up here gets its peer in the attributes iw_cm would take from the connection (AV, DEST_QPN,
// PSNs), which the model accepts on iWARP; a real iWARP device needs rdma_cm instead.
constexpr uint32_t kIwarpPeerRtr = QP_AV | QP_DEST_QPN | QP_RQ_PSN;
constexpr uint32_t kIwarpPeerRts = QP_SQ_PSN;

void bring_up(Qp& qp, const Endpoint& local, const Endpoint& remote, const RcParams& params) {
  TransitionMasks masks = transition_masks(qp.qp_type(), local.transport);
  if (local.transport == Transport::iWARP && qp.qp_type() != QpType::UD) {
    masks.to_rtr |= kIwarpPeerRtr;
    if (masks.to_rts != 0) masks.to_rts |= kIwarpPeerRts;
  }
  QpAttr attr = bring_up_attr(local, remote, params);
  const std::pair<QpState, uint32_t> steps[] = {
      {QpState::INIT, masks.to_init}, {QpState::RTR, masks.to_rtr}, {QpState::RTS, masks.to_rts}};
  for (const auto& [state, mask] : steps) {
    if (mask == 0) break;
    attr.qp_state = state;
    qp.modify(attr, mask);
  }
}

}  // namespace rdmalab::stack
