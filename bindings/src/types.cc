// The vocabulary of types.h: enums under their spec names (to_string's names, so
// `QpState.RTS.name == "RTS"`), flag bits as dicts, plain structs with read-write fields.
#include <pybind11/operators.h>

#include "bind.h"
#include "rdmalab/kernel_timer.h"
#include "rdmalab/types.h"
#include "rdmalab/verbs.h"

namespace rdmalab::bindings {

namespace {

void bind_enums(py::module_& m) {
  bind_enum<Transport>(m, "Transport", 3);
  bind_enum<QpType>(m, "QpType", 4);
  bind_enum<QpState>(m, "QpState", 7);
  bind_enum<WcStatus>(m, "WcStatus", static_cast<int>(WcStatus::GENERAL_ERR) + 1);
  bind_enum<WrOpcode>(m, "WrOpcode", static_cast<int>(WrOpcode::RDMA_READ) + 1);
  bind_enum<WcOpcode>(m, "WcOpcode", static_cast<int>(WcOpcode::RECV_RDMA_WITH_IMM) + 1);
  bind_enum<AsyncEventType>(m, "AsyncEventType", static_cast<int>(AsyncEventType::GID_CHANGE) + 1);
  bind_enum<ObjectKind>(m, "ObjectKind", static_cast<int>(ObjectKind::MR) + 1);
  bind_enum<XrcTgtLifetime>(m, "XrcTgtLifetime", 3);
  bind_enum<ErrPostPolicy>(m, "ErrPostPolicy", 4);
  bind_enum<QpnPolicy>(m, "QpnPolicy", 3);
  py::enum_<PortState>(m, "PortState")
      .value("DOWN", PortState::DOWN)
      .value("INIT", PortState::INIT)
      .value("ARMED", PortState::ARMED)
      .value("ACTIVE", PortState::ACTIVE);

  m.attr("QP_ATTR_MASK") = py::dict(
      py::arg("QP_STATE") = +QP_STATE, py::arg("QP_CUR_STATE") = +QP_CUR_STATE,
      py::arg("QP_EN_SQD_ASYNC_NOTIFY") = +QP_EN_SQD_ASYNC_NOTIFY,
      py::arg("QP_ACCESS_FLAGS") = +QP_ACCESS_FLAGS, py::arg("QP_PKEY_INDEX") = +QP_PKEY_INDEX,
      py::arg("QP_PORT") = +QP_PORT, py::arg("QP_QKEY") = +QP_QKEY, py::arg("QP_AV") = +QP_AV,
      py::arg("QP_PATH_MTU") = +QP_PATH_MTU, py::arg("QP_TIMEOUT") = +QP_TIMEOUT,
      py::arg("QP_RETRY_CNT") = +QP_RETRY_CNT, py::arg("QP_RNR_RETRY") = +QP_RNR_RETRY,
      py::arg("QP_RQ_PSN") = +QP_RQ_PSN, py::arg("QP_MAX_QP_RD_ATOMIC") = +QP_MAX_QP_RD_ATOMIC,
      py::arg("QP_ALT_PATH") = +QP_ALT_PATH, py::arg("QP_MIN_RNR_TIMER") = +QP_MIN_RNR_TIMER,
      py::arg("QP_SQ_PSN") = +QP_SQ_PSN, py::arg("QP_MAX_DEST_RD_ATOMIC") = +QP_MAX_DEST_RD_ATOMIC,
      py::arg("QP_PATH_MIG_STATE") = +QP_PATH_MIG_STATE, py::arg("QP_CAP") = +QP_CAP,
      py::arg("QP_DEST_QPN") = +QP_DEST_QPN);
  m.attr("ACCESS_FLAGS") = py::dict(py::arg("LOCAL_WRITE") = +ACCESS_LOCAL_WRITE,
                                    py::arg("REMOTE_WRITE") = +ACCESS_REMOTE_WRITE,
                                    py::arg("REMOTE_READ") = +ACCESS_REMOTE_READ,
                                    py::arg("REMOTE_ATOMIC") = +ACCESS_REMOTE_ATOMIC);
  m.attr("NS_PER_US") = kNsPerUs;
  m.attr("NS_PER_MS") = kNsPerMs;
  m.attr("NS_PER_SEC") = kNsPerSec;
  def_fn(m, "affiliation", &affiliation, py::arg("type"));
}

void bind_device_structs(py::module_& m) {
  Class<Gid>(m, "Gid")
      .def(py::init<>())
      .def_property(
          "raw",
          [](const Gid& g) {
            return py::bytes(reinterpret_cast<const char*>(g.raw.data()), g.raw.size());
          },
          [](Gid& g, const py::bytes& b) {
            const std::string s = b;
            if (s.size() != g.raw.size()) throw py::value_error("a GID is 16 bytes");
            std::copy(s.begin(), s.end(), g.raw.begin());
          })
      .def("__str__", &Gid::str)
      .def("__repr__", [](const Gid& g) { return "Gid('" + g.str() + "')"; })
      .def(py::self == py::self);

  Class<DeviceCaps>(m, "DeviceCaps")
      .def(py::init<>())
      .def_readwrite("name", &DeviceCaps::name)
      .def_readwrite("personality", &DeviceCaps::personality)
      .def_readwrite("transport", &DeviceCaps::transport)
      .def_readwrite("xrc", &DeviceCaps::xrc)
      .def_readwrite("srq", &DeviceCaps::srq)
      .def_readwrite("ud", &DeviceCaps::ud)
      .def_readwrite("node_guid", &DeviceCaps::node_guid)
      .def_readwrite("max_qp", &DeviceCaps::max_qp)
      .def_readwrite("max_qp_wr", &DeviceCaps::max_qp_wr)
      .def_readwrite("max_sge", &DeviceCaps::max_sge)
      .def_readwrite("max_cq", &DeviceCaps::max_cq)
      .def_readwrite("max_cqe", &DeviceCaps::max_cqe)
      .def_readwrite("max_srq", &DeviceCaps::max_srq)
      .def_readwrite("max_srq_wr", &DeviceCaps::max_srq_wr)
      .def_readwrite("max_mr", &DeviceCaps::max_mr)
      .def_readwrite("phys_port_cnt", &DeviceCaps::phys_port_cnt)
      .def_readwrite("err_post", &DeviceCaps::err_post)
      .def_readwrite("xrc_tgt_lifetime", &DeviceCaps::xrc_tgt_lifetime)
      .def_readwrite("retry_cnt_7_infinite", &DeviceCaps::retry_cnt_7_infinite)
      .def_readwrite("reports_qp_state", &DeviceCaps::reports_qp_state)
      .def_readwrite("qpn_policy", &DeviceCaps::qpn_policy)
      .def_readwrite("local_ca_ack_delay", &DeviceCaps::local_ca_ack_delay)
      .def_readwrite("kernel_hz", &DeviceCaps::kernel_hz)
      .def_readwrite("disassociates", &DeviceCaps::disassociates)
      .def_readwrite("send_completes_on_handoff", &DeviceCaps::send_completes_on_handoff)
      .def_readwrite("connect_is_synchronous", &DeviceCaps::connect_is_synchronous)
      .def_readwrite("iw_close_timeout_s", &DeviceCaps::iw_close_timeout_s)
      .def_readwrite("rts_needs_cm", &DeviceCaps::rts_needs_cm)
      .def_readwrite("refused_send_resend_races", &DeviceCaps::refused_send_resend_races)
      .def_readwrite("tcp_syn_retries", &DeviceCaps::tcp_syn_retries)
      .def_readwrite("raises", &DeviceCaps::raises)
      .def("raises_event", &DeviceCaps::raises_event, py::arg("type"));
}

void bind_qp_structs(py::module_& m) {
  Class<QpCap>(m, "QpCap")
      .verb("ibv_create_qp")
      .def(py::init<>())
      .def_readwrite("max_send_wr", &QpCap::max_send_wr)
      .def_readwrite("max_recv_wr", &QpCap::max_recv_wr)
      .def_readwrite("max_send_sge", &QpCap::max_send_sge)
      .def_readwrite("max_recv_sge", &QpCap::max_recv_sge)
      .def_readwrite("max_inline_data", &QpCap::max_inline_data);

  Class<AhAttr>(m, "AhAttr")
      .verb("ibv_modify_qp")
      .def(py::init<>())
      .def_readwrite("dgid", &AhAttr::dgid)
      .def_readwrite("dlid", &AhAttr::dlid)
      .def_readwrite("sgid_index", &AhAttr::sgid_index)
      .def_readwrite("port_num", &AhAttr::port_num)
      .def_readwrite("sl", &AhAttr::sl);

  Class<QpAttr>(m, "QpAttr")
      .verb("ibv_modify_qp")
      .def(py::init<>())
      .def_readwrite("qp_state", &QpAttr::qp_state)
      .def_readwrite("cur_qp_state", &QpAttr::cur_qp_state)
      .def_readwrite("qp_access_flags", &QpAttr::qp_access_flags)
      .def_readwrite("pkey_index", &QpAttr::pkey_index)
      .def_readwrite("port_num", &QpAttr::port_num)
      .def_readwrite("qkey", &QpAttr::qkey)
      .def_readwrite("ah_attr", &QpAttr::ah_attr)
      .def_readwrite("path_mtu", &QpAttr::path_mtu)
      .def_readwrite("dest_qp_num", &QpAttr::dest_qp_num)
      .def_readwrite("rq_psn", &QpAttr::rq_psn)
      .def_readwrite("sq_psn", &QpAttr::sq_psn)
      .def_readwrite("max_rd_atomic", &QpAttr::max_rd_atomic)
      .def_readwrite("max_dest_rd_atomic", &QpAttr::max_dest_rd_atomic)
      .def_readwrite("min_rnr_timer", &QpAttr::min_rnr_timer)
      .def_readwrite("timeout", &QpAttr::timeout)
      .def_readwrite("retry_cnt", &QpAttr::retry_cnt)
      .def_readwrite("rnr_retry", &QpAttr::rnr_retry)
      .def_readwrite("en_sqd_async_notify", &QpAttr::en_sqd_async_notify)
      .def_readwrite("sq_draining", &QpAttr::sq_draining)
      .def_readwrite("cap", &QpAttr::cap);

  Class<SrqInitAttr>(m, "SrqInitAttr")
      .verb("ibv_create_srq")
      .def(py::init<>())
      .def_readwrite("max_wr", &SrqInitAttr::max_wr)
      .def_readwrite("max_sge", &SrqInitAttr::max_sge)
      .def_readwrite("srq_limit", &SrqInitAttr::srq_limit);
}

void bind_wr_structs(py::module_& m) {
  Class<Sge>(m, "Sge")
      .def(py::init<>())
      .def(py::init([](const IntArg<uint64_t>& addr, const IntArg<uint32_t>& length,
                       const IntArg<uint32_t>& lkey) {
             return Sge{int_of(addr, "Sge", "addr"), int_of(length, "Sge", "length"),
                        int_of(lkey, "Sge", "lkey")};
           }),
           py::arg("addr"), py::arg("length"), py::arg("lkey"))
      .def_readwrite("addr", &Sge::addr)
      .def_readwrite("length", &Sge::length)
      .def_readwrite("lkey", &Sge::lkey);

  Class<SendWr>(m, "SendWr")
      .verb("ibv_post_send")
      .def(py::init<>())
      .def_readwrite("wr_id", &SendWr::wr_id)
      .def_readwrite("opcode", &SendWr::opcode)
      .def_readwrite("sg_list", &SendWr::sg_list)
      .def_readwrite("signaled", &SendWr::signaled)
      .def_readwrite("imm_data", &SendWr::imm_data)
      .def_readwrite("remote_addr", &SendWr::remote_addr)
      .def_readwrite("rkey", &SendWr::rkey)
      .def_readwrite("ah", &SendWr::ah)
      .def_readwrite("remote_qpn", &SendWr::remote_qpn)
      .def_readwrite("remote_qkey", &SendWr::remote_qkey)
      .def_readwrite("remote_srqn", &SendWr::remote_srqn);

  Class<RecvWr>(m, "RecvWr")
      .verb("ibv_post_recv")
      .def(py::init<>())
      .def_readwrite("wr_id", &RecvWr::wr_id)
      .def_readwrite("sg_list", &RecvWr::sg_list);

  Class<WorkCompletion>(m, "WorkCompletion")
      .def(py::init<>())
      .def_readwrite("wr_id", &WorkCompletion::wr_id)
      .def_readwrite("status", &WorkCompletion::status)
      .def_readwrite("opcode", &WorkCompletion::opcode)
      .def_readwrite("vendor_err", &WorkCompletion::vendor_err)
      .def_readwrite("byte_len", &WorkCompletion::byte_len)
      .def_readwrite("imm_data", &WorkCompletion::imm_data)
      .def_readwrite("qp_num", &WorkCompletion::qp_num)
      .def_readwrite("src_qp", &WorkCompletion::src_qp)
      .def_readwrite("with_imm", &WorkCompletion::with_imm);

  Class<AsyncEvent>(m, "AsyncEvent")
      .def(py::init<>())
      .def_readwrite("type", &AsyncEvent::type)
      .def_readwrite("kind", &AsyncEvent::kind)
      .def_readwrite("object_id", &AsyncEvent::object_id)
      .def_readwrite("qp_num", &AsyncEvent::qp_num)
      .def_readwrite("srq_num", &AsyncEvent::srq_num)
      .def_readwrite("port_num", &AsyncEvent::port_num)
      .def_readwrite("seq", &AsyncEvent::seq);
}

// rdmalab/kernel_timer.h: the one home of the timer wheel's arithmetic (cm_timing uses it).
void bind_kernel_timer(py::module_& m) {
  using py::arg;
  def_fn(m, "kernel_timer_delay_ns", &kernel_timer_delay_ns, arg("now_ns"), arg("ms"), arg("hz"));
  def_fn(m, "kernel_timer_delay_range_ns", &kernel_timer_delay_range_ns, arg("ms"), arg("hz"));
  def_fn(m, "kernel_timer_rearm_period_ns", &kernel_timer_rearm_period_ns, arg("ms"), arg("hz"));
  def_fn(m, "msecs_to_jiffies", &msecs_to_jiffies, arg("ms"), arg("hz"));
}

}  // namespace

void bind_types(py::module_& m) {
  bind_kernel_timer(m);
  bind_enums(m);
  bind_device_structs(m);
  bind_qp_structs(m);
  bind_wr_structs(m);
}

}  // namespace rdmalab::bindings
