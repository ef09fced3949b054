#include <infiniband/verbs.h>

#include "verbs/convert.h"
#include "verbs/objects.h"

namespace rdmalab::verbs {

namespace {
ibv_cq* cq_of(const std::shared_ptr<Cq>& cq, const std::string& verb) {
  auto v = as_verbs<VerbsCq>(cq, verb);
  return v ? v->get(verb) : nullptr;
}
}  // namespace

VerbsQp::VerbsQp(std::shared_ptr<ContextState> st, const QpInitAttr& a, const CmBinding& cm)
    : VerbsObject(std::move(st), "qp"), type_(a.qp_type) {
  const bool xrc = a.qp_type == QpType::XRC_SEND || a.qp_type == QpType::XRC_RECV;
  const std::string verb = xrc ? "ibv_create_qp_ex" : "ibv_create_qp";
  pd_ = as_verbs<VerbsPd>(a.pd, verb);
  auto srq = as_verbs<VerbsSrq>(a.srq, verb);
  auto xrcd = as_verbs<VerbsXrcd>(a.xrcd, verb);
  for (const std::shared_ptr<Object>& d :
       {std::shared_ptr<Object>(a.pd), std::shared_ptr<Object>(a.send_cq),
        std::shared_ptr<Object>(a.recv_cq), std::shared_ptr<Object>(a.srq),
        std::shared_ptr<Object>(a.xrcd)}) {
    if (d) deps_.push_back(d);
  }
  ibv_qp_init_attr_ex ex{};
  ex.qp_type = to_ibv(a.qp_type);
  ex.send_cq = cq_of(a.send_cq, verb);
  ex.recv_cq = cq_of(a.recv_cq, verb);
  ex.srq = srq ? srq->get(verb) : nullptr;
  ex.cap = to_ibv(a.cap);
  ex.sq_sig_all = a.sq_sig_all ? 1 : 0;
  if (a.qp_type == QpType::XRC_RECV) {
    if (!xrcd) throw Error(verb, EINVAL, "XRC_RECV needs an xrcd");
    ex.comp_mask = IBV_QP_INIT_ATTR_XRCD;
    ex.xrcd = xrcd->get(verb);
    ex.cap = ibv_qp_cap{};  // a TGT QP has no queues of its own
  } else {
    if (!pd_) throw Error(verb, EINVAL, "no pd");
    ex.comp_mask = IBV_QP_INIT_ATTR_PD;
    ex.pd = pd_->get(verb);
  }
  if (xrc && cm.id != nullptr) throw Error("rdma_create_qp", EINVAL, "XRC QP on an rdma_cm id");
  if (xrc) {
    qp_ = create_qp_ex(st_->ctx.get(verb), &ex);
  } else {
    create_basic(ex, cm);
  }
  registered();
}

void VerbsQp::create_basic(const ibv_qp_init_attr_ex& ex, const CmBinding& cm) {
  ibv_qp_init_attr basic{};
  basic.send_cq = ex.send_cq;
  basic.recv_cq = ex.recv_cq;
  basic.srq = ex.srq;
  basic.cap = ex.cap;
  basic.qp_type = ex.qp_type;
  basic.sq_sig_all = ex.sq_sig_all;
  if (cm.id == nullptr) {
    qp_ = create_qp(ex.pd, &basic);
    return;
  }
  errno = 0;
  if (rdma_create_qp(cm.id, ex.pd, &basic) != 0) throw Error("rdma_create_qp", last_errno(), "");
  rdma_cm_id* id = cm.id;
  auto id_live = cm.id_live;
  // rdma_destroy_qp is ibv_destroy_qp + id->qp = NULL, but returns void: done by hand so an
  // EBUSY is seen. CQs that librdmacm made for a QP without any go with rdma_destroy_id.
  qp_ = Handle<ibv_qp>(id->qp, "ibv_destroy_qp", [id, id_live](ibv_qp* qp) {
    const int rc = ibv_destroy_qp(qp);
    if (rc == 0 && *id_live) id->qp = nullptr;
    return rc;
  });
}

VerbsQp::VerbsQp(std::shared_ptr<ContextState> st, std::shared_ptr<VerbsXrcd> xrcd, uint32_t qp_num)
    : VerbsObject(std::move(st), "qp"), type_(QpType::XRC_RECV), open_handle_(true) {
  ibv_qp_open_attr oa{};
  oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  oa.qp_num = qp_num;
  oa.xrcd = xrcd->get("ibv_open_qp");
  oa.qp_type = IBV_QPT_XRC_RECV;
  deps_.push_back(std::move(xrcd));
  qp_ = open_qp(st_->ctx.get("ibv_open_qp"), &oa);
  registered();
}

void VerbsQp::registered() {
  qp_num_ = qp_.raw()->qp_num;
  st_->events.add_object(qp_.raw(), ObjectKind::QP, id_, qp_num_);
  st_->name_qp(qp_num_, label_);
  recorded(open_handle_ ? "ibv_open_qp" : "ibv_create_qp",
           {{"qp_num", qp_num_}, {"qp_type", std::string(to_string(type_))}});
}

QpState VerbsQp::state() const {
  ibv_qp* qp = qp_.get("ibv_query_qp");
  ibv_qp_attr a{};
  ibv_qp_init_attr init{};
  check_rc("ibv_query_qp", ibv_query_qp(qp, &a, IBV_QP_STATE, &init), label_);
  return from_ibv(a.qp_state);
}

void VerbsQp::modify(const QpAttr& attr, uint32_t attr_mask) {
  ibv_qp* qp = qp_.get("ibv_modify_qp");
  ibv_qp_attr a = to_ibv(attr, attr_mask);
  // The state before, for the history's from/to (a device may have moved it on its own).
  const QpState from = (attr_mask & QP_STATE) ? state() : QpState::RESET;
  check_rc("ibv_modify_qp", ibv_modify_qp(qp, &a, static_cast<int>(attr_mask)), label_);
  if (attr_mask & QP_STATE) {
    st_->record(label_, "qp_state",
                {{"from", std::string(to_string(from))},
                 {"to", std::string(to_string(attr.qp_state))},
                 {"qp_num", qp_num_},
                 {"why", "ibv_modify_qp"}});
  }
}

QpAttr VerbsQp::query() const {
  ibv_qp* qp = qp_.get("ibv_query_qp");
  ibv_qp_attr a{};
  ibv_qp_init_attr init{};
  const int mask = IBV_QP_STATE | IBV_QP_CUR_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY |
                   IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY | IBV_QP_AV |
                   IBV_QP_PATH_MTU | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                   IBV_QP_RQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER | IBV_QP_SQ_PSN |
                   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_CAP | IBV_QP_DEST_QPN;
  check_rc("ibv_query_qp", ibv_query_qp(qp, &a, mask, &init), label_);
  return from_ibv(a);
}

ibv_ah* VerbsQp::ah_for(const AhAttr& a) {
  auto key = std::make_tuple(a.dgid.raw, a.dlid, a.sgid_index, a.port_num, a.sl);
  auto it = ahs_.find(key);
  if (it != ahs_.end()) return it->second.raw();
  if (!pd_) throw Error("ibv_create_ah", EINVAL, label_ + ": no pd");
  ibv_ah_attr attr = to_ibv(a);
  auto [pos, added] = ahs_.emplace(key, create_ah(pd_->get("ibv_create_ah"), &attr));
  return pos->second.raw();
}

void VerbsQp::post_send(const SendWr& wr) {
  ibv_qp* qp = qp_.get("ibv_post_send");
  ibv_ah* ah = nullptr;
  if (type_ == QpType::UD) {
    if (!wr.ah) throw Error("ibv_post_send", EINVAL, label_ + ": UD send without ah");
    ah = ah_for(*wr.ah);
  }
  IbvSendWr w;
  to_ibv(wr, type_, ah, w);
  ibv_send_wr* bad = nullptr;
  check_rc("ibv_post_send", ibv_post_send(qp, &w.wr, &bad), label_);
  if (st_->history == nullptr) return;
  // Built key by key: an initializer list would copy every value once more (the data path).
  nlohmann::json data(nlohmann::json::value_t::object);
  data["queue"] = "send";
  data["wr_id"] = wr.wr_id;
  data["signaled"] = wr.signaled;
  data["qp_num"] = qp_num_;
  data["opcode"] = to_string(wr.opcode);
  st_->record(label_, "post", std::move(data));
}

void VerbsQp::post_recv(const RecvWr& wr) {
  ibv_qp* qp = qp_.get("ibv_post_recv");
  IbvRecvWr w;
  to_ibv(wr, w);
  ibv_recv_wr* bad = nullptr;
  check_rc("ibv_post_recv", ibv_post_recv(qp, &w.wr, &bad), label_);
  if (st_->history == nullptr) return;
  nlohmann::json data(nlohmann::json::value_t::object);
  data["queue"] = "recv";
  data["wr_id"] = wr.wr_id;
  data["signaled"] = true;
  data["qp_num"] = qp_num_;
  st_->record(label_, "post", std::move(data));
}

void VerbsQp::destroy(TimeNs deadline_ns) {
  ibv_qp* qp = qp_.get("ibv_destroy_qp");
  if (!st_->events.begin_destroy(qp, id_, deadline_ns)) {
    throw Error("ibv_destroy_qp", EBUSY,
                label_ + ": " + std::to_string(st_->events.unacked(id_)) +
                    " async events read and not acked");
  }
  try {
    qp_.destroy();
  } catch (...) {
    st_->events.abort_destroy(qp);
    throw;
  }
  st_->events.remove_object(qp, id_);
  st_->unname_qp(qp_num_, label_);
  for (auto& [key, ah] : ahs_) ah.reset();
  ahs_.clear();
  recorded("ibv_destroy_qp", {{"qp_num", qp_num_}});
}

void VerbsQp::release() noexcept {
  if (qp_.live()) {
    st_->events.force_destroy(qp_.raw(), id_);
    st_->events.remove_object(qp_.raw(), id_);
    st_->unname_qp(qp_num_, label_);
    qp_.reset();
  }
  for (auto& [key, ah] : ahs_) ah.reset();
  ahs_.clear();
}

}  // namespace rdmalab::verbs
