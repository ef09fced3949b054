// The stack helpers of core/stack: connection bring-up, the completion ledger and traffic
// engine, the async event dispatcher and the drain. Classes that keep a Runtime& or
// History* take the lab and keep it alive (keep_alive), so they never outlive it.
#include "bind.h"
#include "stack/connect.h"
#include "stack/dispatcher.h"
#include "stack/drain.h"
#include "stack/ledger.h"
#include "stack/traffic.h"

namespace rdmalab::bindings {

namespace {

using py::arg;
using namespace rdmalab::stack;  // NOLINT(google-build-using-namespace): names as in the headers

void bind_connect(py::module_& m) {
  Class<Endpoint>(m, "Endpoint")
      .verb("bring_up")
      .def(py::init<>())
      .def_readwrite("qp_num", &Endpoint::qp_num)
      .def_readwrite("psn", &Endpoint::psn)
      .def_readwrite("gid", &Endpoint::gid)
      .def_readwrite("lid", &Endpoint::lid)
      .def_readwrite("transport", &Endpoint::transport)
      .def_readwrite("port_num", &Endpoint::port_num);
  def_fn(m, "local_endpoint", &local_endpoint, arg("ctx"), arg("qp"), arg("psn"), kRelease);

  Class<RcParams>(m, "RcParams")
      .verb("bring_up")
      .def(py::init<>())
      .def_readwrite("path_mtu", &RcParams::path_mtu)
      .def_readwrite("timeout", &RcParams::timeout)
      .def_readwrite("retry_cnt", &RcParams::retry_cnt)
      .def_readwrite("rnr_retry", &RcParams::rnr_retry)
      .def_readwrite("min_rnr_timer", &RcParams::min_rnr_timer)
      .def_readwrite("max_rd_atomic", &RcParams::max_rd_atomic)
      .def_readwrite("max_dest_rd_atomic", &RcParams::max_dest_rd_atomic)
      .def_readwrite("access", &RcParams::access)
      .def_readwrite("qkey", &RcParams::qkey)
      .def_readwrite("pkey_index", &RcParams::pkey_index);

  Class<TransitionMasks>(m, "TransitionMasks")
      .def(py::init<>())
      .def_readwrite("to_init", &TransitionMasks::to_init)
      .def_readwrite("to_rtr", &TransitionMasks::to_rtr)
      .def_readwrite("to_rts", &TransitionMasks::to_rts);
  def_fn(m, "transition_masks", &transition_masks, arg("qp_type"), arg("transport"));
  def_fn(m, "bring_up_attr", &bring_up_attr, arg("local"), arg("remote"), arg("params"));
  def_fn(m, "bring_up", &bring_up, arg("qp"), arg("local"), arg("remote"),
         arg("params") = RcParams{}, kRelease);
}

void bind_ledger(py::module_& m) {
  bind_enum<WorkQueue>(m, "WorkQueue", 3);
  bind_enum<WrOutcome>(m, "WrOutcome", static_cast<int>(WrOutcome::PASSED) + 1);
  bind_enum<ViolationKind>(m, "ViolationKind", static_cast<int>(ViolationKind::OUT_OF_ORDER) + 1);

  Class<LedgerEntry>(m, "LedgerEntry")
      .def_readonly("wr_id", &LedgerEntry::wr_id)
      .def_readonly("label", &LedgerEntry::label)
      .def_readonly("qp_num", &LedgerEntry::qp_num)
      .def_readonly("queue", &LedgerEntry::queue)
      .def_readonly("signaled", &LedgerEntry::signaled)
      .def_readonly("post_seq", &LedgerEntry::post_seq)
      .def_readonly("outcome", &LedgerEntry::outcome)
      .def_readonly("status", &LedgerEntry::status)
      .def_readonly("completed_qp_num", &LedgerEntry::completed_qp_num);
  Class<LedgerViolation>(m, "LedgerViolation")
      .def_readonly("kind", &LedgerViolation::kind)
      .def_readonly("wr_id", &LedgerViolation::wr_id)
      .def_readonly("qp_num", &LedgerViolation::qp_num)
      .def_readonly("detail", &LedgerViolation::detail);
  Class<LedgerReport>(m, "LedgerReport")
      .def_readonly("posted", &LedgerReport::posted)
      .def_readonly("succeeded", &LedgerReport::succeeded)
      .def_readonly("flushed", &LedgerReport::flushed)
      .def_readonly("errored", &LedgerReport::errored)
      .def_readonly("implied", &LedgerReport::implied)
      .def_readonly("unknown", &LedgerReport::unknown)
      .def_readonly("unknown_wr_ids", &LedgerReport::unknown_wr_ids)
      .def_readonly("violations", &LedgerReport::violations)
      .def("exactly_once", &LedgerReport::exactly_once);

  using QpnOutstanding = uint64_t (CompletionLedger::*)(uint32_t, WorkQueue) const;
  using LabelOutstanding = uint64_t (CompletionLedger::*)(const std::string&, WorkQueue) const;
  using QpnIds = std::vector<uint64_t> (CompletionLedger::*)(uint32_t, WorkQueue) const;
  using LabelIds = std::vector<uint64_t> (CompletionLedger::*)(const std::string&, WorkQueue) const;
  Class<CompletionLedger, std::shared_ptr<CompletionLedger>>(m, "CompletionLedger")
      .def(py::init([](const std::shared_ptr<Lab>& lab, const std::string& host) {
             return std::make_shared<CompletionLedger>(lab ? &lab->history() : nullptr, host);
           }),
           arg("lab") = nullptr, arg("host") = "", py::keep_alive<1, 2>())
      .def("on_post", &CompletionLedger::on_post, arg("label"), arg("qp_num"), arg("queue"),
           arg("wr_id"), arg("signaled") = true, kRelease)
      .def("forget", &CompletionLedger::forget, arg("wr_id"), kRelease)
      .def("attach_srq", &CompletionLedger::attach_srq, arg("srq_label"), arg("qp_num"), kRelease)
      .def("on_completion", &CompletionLedger::on_completion, arg("wc"), kRelease)
      .def("outstanding", static_cast<QpnOutstanding>(&CompletionLedger::outstanding),
           arg("qp_num"), arg("queue"), kRelease)
      .def("outstanding", static_cast<LabelOutstanding>(&CompletionLedger::outstanding),
           arg("label"), arg("queue"), kRelease)
      .def("outstanding_ids", static_cast<QpnIds>(&CompletionLedger::outstanding_ids),
           arg("qp_num"), arg("queue"), kRelease)
      .def("outstanding_ids", static_cast<LabelIds>(&CompletionLedger::outstanding_ids),
           arg("label"), arg("queue"), kRelease)
      .def("entry", &CompletionLedger::entry, arg("wr_id"), kRelease)
      .def("violations", &CompletionLedger::violations, kRelease)
      .def("check", &CompletionLedger::check, kRelease);
}

void bind_traffic(py::module_& m) {
  Class<Traffic, std::shared_ptr<Traffic>>(m, "Traffic")
      .def(py::init([](const std::shared_ptr<Lab>& lab, CompletionLedger& ledger,
                       const std::string& host) {
             return gil_free_delete(
                 std::make_shared<Traffic>(lab->runtime(), ledger, &lab->history(), host));
           }),
           arg("lab"), arg("ledger"), arg("host") = "", py::keep_alive<1, 2>(),
           py::keep_alive<1, 3>())
      .def("post_send", &Traffic::post_send, arg("qp"), arg("wr"), kRelease)
      .def("post_recv", &Traffic::post_recv, arg("qp"), arg("wr"), kRelease)
      .def("post_srq_recv", &Traffic::post_srq_recv, arg("srq"), arg("wr"), kRelease)
      .def("poll", &Traffic::poll, arg("cq"), arg("max") = 32, kRelease)
      .def(
          "poll_until",
          [](Traffic& t, const std::vector<Cq*>& cqs, const py::object& pred, TimeNs deadline_ns) {
            auto cb = make_callback(pred, "poll_until predicate", {});
            if (!cb) throw py::type_error("poll_until: pred must be callable");
            py::gil_scoped_release release;
            return t.poll_until(
                cqs, [&cb] { return cb->call<bool>(true); }, deadline_ns);
          },
          arg("cqs"), arg("pred"), arg("deadline_ns"))
      .def("wait_completions", &Traffic::wait_completions, arg("cq"), arg("n"), arg("deadline_ns"),
           kRelease)
      .def("completions", &Traffic::completions, kRelease)
      .def("completion_count", &Traffic::completion_count, kRelease)
      .def("completions_since", &Traffic::completions_since, arg("index"), kRelease)
      .def("set_poll_interval", &Traffic::set_poll_interval, arg("min_ns"), arg("max_ns"), kRelease)
      .def("next_wr_id", &Traffic::next_wr_id, kRelease)
      .def_property_readonly("ledger", &Traffic::ledger,
                             py::return_value_policy::reference_internal)
      // (0, "", host): what its objects must be of (its host; "" = any).
      .def_property_readonly("scope", [](const Traffic& t) {
        const Owner o = t.scope();
        return py::make_tuple(o.id, o.label, o.host);
      });
}

void bind_dispatcher(py::module_& m) {
  Class<DispatcherStats>(m, "DispatcherStats")
      .def_readonly("read", &DispatcherStats::read)
      .def_readonly("delivered", &DispatcherStats::delivered)
      .def_readonly("dropped", &DispatcherStats::dropped)
      .def_readonly("unaffiliated", &DispatcherStats::unaffiliated)
      .def_readonly("handler_errors", &DispatcherStats::handler_errors)
      .def_readonly("max_concurrent_per_object", &DispatcherStats::max_concurrent_per_object);

  // Handlers run on the dispatcher's workers: a raising Python handler is parked (bind.h) and
  // reported to the dispatcher as a C++ exception, so it counts in handler_errors.
  auto handler = [](const py::object& fn, const std::string& where) {
    auto cb = make_callback(fn, where, {});
    if (!cb) throw py::type_error(where + ": handler must be callable");
    return AsyncHandler([cb](const AsyncEvent& ev) { cb->call_or_throw(ev); });
  };
  Class<AsyncDispatcher, std::shared_ptr<AsyncDispatcher>>(m, "AsyncDispatcher")
      .def(py::init([](const std::shared_ptr<Lab>& lab, std::shared_ptr<Context> ctx,
                       const std::string& host, const IntArg<int>& workers_arg) {
             const int workers = int_of(workers_arg, "AsyncDispatcher", "workers");
             py::gil_scoped_release release;
             return gil_free_delete(std::make_shared<AsyncDispatcher>(
                 lab->runtime(), std::move(ctx), &lab->history(), host, workers));
           }),
           arg("lab"), arg("ctx"), arg("host") = "", arg("workers") = 2, py::keep_alive<1, 2>())
      .def("start", &AsyncDispatcher::start, kRelease)
      .def("stop", &AsyncDispatcher::stop, arg("deadline_ns"), kRelease)
      .def_property_readonly("running", py::cpp_function(&AsyncDispatcher::running, kRelease))
      .def(
          "watch",
          [handler](AsyncDispatcher& d, const Object& obj, const py::object& fn) {
            AsyncHandler h = handler(fn, "handler of " + obj.label());
            py::gil_scoped_release release;
            d.watch(obj, std::move(h));
          },
          arg("obj"), arg("handler"))
      .def(
          "set_default_handler",
          [handler](AsyncDispatcher& d, const py::object& fn) {
            AsyncHandler h = handler(fn, "default handler");
            py::gil_scoped_release release;
            d.set_default_handler(std::move(h));
          },
          arg("handler"))
      .def("destroy_qp", &AsyncDispatcher::destroy_qp, arg("qp"), arg("deadline_ns"), kRelease)
      .def("destroy_srq", &AsyncDispatcher::destroy_srq, arg("srq"), arg("deadline_ns"), kRelease)
      .def("destroy_cq", &AsyncDispatcher::destroy_cq, arg("cq"), arg("deadline_ns"), kRelease)
      .def("wait_event", &AsyncDispatcher::wait_event, arg("object_id"), arg("type"),
           arg("deadline_ns"), arg("min_count") = 1, kRelease)
      .def("count_events", &AsyncDispatcher::count_events, arg("object_id"), arg("type"), kRelease)
      .def("events_for", &AsyncDispatcher::events_for, arg("object_id"), kRelease)
      .def("stats", &AsyncDispatcher::stats, kRelease);
}

void bind_drain(py::module_& m) {
  Class<DrainReport>(m, "DrainReport")
      .def_readonly("method", &DrainReport::method)
      .def_readonly("outstanding_sq", &DrainReport::outstanding_sq)
      .def_readonly("outstanding_rq", &DrainReport::outstanding_rq)
      .def_readonly("succeeded", &DrainReport::succeeded)
      .def_readonly("flushed", &DrainReport::flushed)
      .def_readonly("errored", &DrainReport::errored)
      .def_readonly("order_kept", &DrainReport::order_kept)
      .def_readonly("srq_attached", &DrainReport::srq_attached)
      .def_readonly("last_wqe_reached", &DrainReport::last_wqe_reached)
      .def_readonly("complete", &DrainReport::complete)
      .def_readonly("cq_overflow", &DrainReport::cq_overflow)
      .def_readonly("elapsed_ns", &DrainReport::elapsed_ns)
      .def_readonly("detail", &DrainReport::detail);
  def_fn(
      m, "drain_qp",
      [](Lab& lab, Qp& qp, Traffic& traffic, Cq& send_cq, Cq& recv_cq, TimeNs deadline_ns,
         AsyncDispatcher* dispatcher, Srq* srq) {
        return drain_qp(lab.runtime(), qp, traffic, send_cq, recv_cq, deadline_ns, dispatcher, srq);
      },
      arg("lab"), arg("qp"), arg("traffic"), arg("send_cq"), arg("recv_cq"), arg("deadline_ns"),
      arg("dispatcher") = nullptr, arg("srq") = nullptr, kRelease);
}

}  // namespace

void bind_stack(py::module_& m) {
  bind_connect(m);
  bind_ledger(m);
  bind_traffic(m);
  bind_dispatcher(m);
  bind_drain(m);
}

}  // namespace rdmalab::bindings
