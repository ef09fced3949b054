// The engine's tables of provider facts, for Python to read instead of mirroring them: the
// driver rows (rdmalab/driver_facts.h) and the model personalities (model/personality.h).
#include "bind.h"
#include "model/personality.h"
#include "rdmalab/driver_facts.h"
#include "rdmalab/model.h"

namespace rdmalab::bindings {

namespace {

using py::arg;

py::tuple release(KernelRelease r) {
  return py::make_tuple(r.major, r.minor);
}

std::optional<std::string> none_if_empty(const std::string& s) {
  if (s.empty()) return std::nullopt;
  return s;
}

void bind_driver_facts(py::module_& m) {
  py::class_<DriverFacts>(m, "DriverFacts")
      .def_readonly("driver", &DriverFacts::driver)
      .def_property_readonly("personality",
                             [](const DriverFacts& d) { return none_if_empty(d.personality); })
      .def_readonly("err_post", &DriverFacts::err_post)  // None: by transport
      .def_readonly("retry_cnt_7_infinite", &DriverFacts::retry_cnt_7_infinite)
      .def_property_readonly("reports_qp_state_since",
                             [](const DriverFacts& d) { return release(d.reports_qp_state_since); })
      .def_property_readonly(
          "refused_send_races_before",
          [](const DriverFacts& d) { return release(d.refused_send_races_before); })
      .def_readonly("qpn_policy", &DriverFacts::qpn_policy)
      .def_readonly("disassociates", &DriverFacts::disassociates)
      .def_readonly("send_completes_on_handoff", &DriverFacts::send_completes_on_handoff)
      .def_readonly("connect_is_synchronous", &DriverFacts::connect_is_synchronous)
      .def_readonly("iw_close_timeout_s", &DriverFacts::iw_close_timeout_s)
      .def_readonly("raises", &DriverFacts::raises)
      .def_readonly("raises_checked", &DriverFacts::raises_checked)
      .def_readonly("raises_unsettled", &DriverFacts::raises_unsettled)
      .def("__repr__", [](const DriverFacts& d) {
        const std::string p = d.personality.empty() ? "None" : "'" + d.personality + "'";
        return "DriverFacts('" + d.driver + "', personality=" + p + ")";
      });
  def_fn(m, "driver_facts", [] { return driver_facts(); });
  def_fn(m, "personality_of_driver", &personality_of_driver, arg("driver"));
}

void bind_personalities(py::module_& m) {
  def_fn(m, "personalities", &model::personalities);
  // A personality's caps as its hosts get them (name empty): xrc, xrc_tgt_lifetime, err_post...
  def_fn(
      m, "personality_caps", [](const std::string& name) { return model::personality(name).caps; },
      arg("personality"));
  // A model personality's iWARP MPA timers, (reply_ms, request_ms): the one home of the fact
  // (personality.cc cites the drivers) for bounds computed in Python (cm_timing.IwMpaTiming).
  def_fn(
      m, "iw_mpa_timeouts_ms",
      [](const std::string& name) {
        const model::Personality& p = model::personality(name);
        return py::make_tuple(p.iw_mpa_reply_timeout_ms, p.iw_mpa_request_timeout_ms);
      },
      arg("personality"));
}

}  // namespace

void bind_facts(py::module_& m) {
  bind_driver_facts(m);
  bind_personalities(m);
}

}  // namespace rdmalab::bindings
