// Labs, hosts and processes (lab.h), and the model lab with its fault verbs (model.h).
// Python callables given to the engine (predicates, hooks, timers, harness threads) go
// through PyCallback: they take the GIL and park their exceptions (bind.h).
#include <nlohmann/json.hpp>

#include "bind.h"
#include "faults/rules.h"
#include "rdmalab/model.h"
#include "verbs/verbs_lab.h"

namespace rdmalab::bindings {

namespace {

using model::ModelLab;
using py::arg;

nlohmann::json parse_rule_json(const std::string& text) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw py::value_error(std::string("rule: not JSON: ") + e.what());
  }
}

void bind_hosts(py::module_& m) {
  const auto child = py::keep_alive<0, 1>();
  Class<Process, std::shared_ptr<Process>>(m, "Process")
      .def_property_readonly("name", &Process::name)
      .def_property_readonly("pid", &Process::pid)
      .def_property_readonly("alive", py::cpp_function(&Process::alive, kRelease))
      .def(
          "open_device",
          [](Process& p, const std::string& name) { return gil_free_delete(p.open_device(name)); },
          arg("device_name") = "", kRelease, child)
      .def(
          "create_event_channel",
          [](Process& p) { return gil_free_delete(p.create_event_channel()); }, kRelease, child)
      .def("kill", &Process::kill, kRelease)
      .def("kernel_objects", &Process::kernel_objects, kRelease);

  Class<Host, std::shared_ptr<Host>>(m, "Host")
      .def_property_readonly("name", &Host::name)
      .def("device_names", &Host::device_names, kRelease)
      .def("device_caps", &Host::device_caps, arg("device_name"), kRelease)
      .def(
          "create_process",
          [](Host& h, const std::string& name) { return gil_free_delete(h.create_process(name)); },
          arg("name"), kRelease, child)
      .def("processes", &Host::processes, kRelease);
}

void bind_lab_class(py::module_& m) {
  Class<Lab, std::shared_ptr<Lab>>(m, "Lab")
      .def_property_readonly("backend", &Lab::backend)
      .def_property_readonly("seed", &Lab::seed)
      .def_property_readonly("now_ns", [](Lab& l) { return l.runtime().now_ns(); })
      .def_property_readonly("stopping", [](Lab& l) { return l.runtime().stopping(); })
      .def("hosts", &Lab::hosts, kRelease)
      .def("host", &Lab::host, arg("name"), kRelease, py::keep_alive<0, 1>())
      .def("shutdown", &Lab::shutdown, kRelease)
      // Blocks the controller until pred() or the deadline; a raising pred ends the wait
      // (its error is parked). In the model time advances while it waits.
      .def(
          "wait_until",
          [](const std::shared_ptr<Lab>& lab, const py::object& pred, TimeNs deadline_ns) {
            auto cb = make_callback(pred, "wait_until predicate", lab);
            if (!cb) throw py::type_error("wait_until: pred must be callable");
            py::gil_scoped_release release;
            return lab->runtime().wait_until([&cb] { return cb->call<bool>(true); }, deadline_ns);
          },
          arg("pred"), arg("deadline_ns"), Verb{"wait_until"})
      .def(
          "sleep_for", [](Lab& l, TimeNs d) { l.runtime().sleep_for(d); }, arg("duration_ns"),
          kRelease, Verb{"sleep_for"})
      // A harness thread running a Python function (in the model: a simulated thread).
      .def(
          "spawn",
          [](const std::shared_ptr<Lab>& lab, const std::string& name, const py::object& fn) {
            auto cb = make_callback(fn, "thread " + name, lab);
            if (!cb) throw py::type_error("spawn: fn must be callable");
            py::gil_scoped_release release;
            lab->runtime().spawn(name, [cb] { cb->call_void(); });
          },
          arg("name"), arg("fn"))
      .def(
          "history_jsonl", [](Lab& l) { return l.history().to_jsonl(); }, kRelease)
      .def(
          "history_since_jsonl", [](Lab& l, uint64_t seq) { return l.history().since_jsonl(seq); },
          arg("seq"), kRelease)
      .def(
          "history_wait_since_jsonl",
          [](Lab& l, uint64_t seq, int64_t wait_ns) {
            return l.history().wait_since_jsonl(seq, std::chrono::nanoseconds(wait_ns));
          },
          arg("seq"), arg("wait_ns"), kRelease)
      .def("history_size", [](Lab& l) { return l.history().size(); })
      .def("history_next_seq", [](Lab& l) { return l.history().next_seq(); })
      .def(
          "record",
          [](Lab& l, const std::string& host, const std::string& object, const std::string& kind,
             const std::string& data_json) {
            return l.history().record(host, object, kind, nlohmann::json::parse(data_json));
          },
          arg("host"), arg("object"), arg("kind"), arg("data_json") = "{}", kRelease);
}

void bind_model_structs(py::module_& m) {
  Class<model::HostSpec>(m, "HostSpec")
      .def(py::init<>())
      .def_readwrite("name", &model::HostSpec::name)
      .def_readwrite("personality", &model::HostSpec::personality)
      .def_readwrite("xrc_tgt_lifetime", &model::HostSpec::xrc_tgt_lifetime);
  Class<model::FabricOptions>(m, "FabricOptions")
      .verb("set_fabric")
      .def(py::init<>())
      .def_readwrite("latency_ns", &model::FabricOptions::latency_ns)
      .def_readwrite("jitter_ns", &model::FabricOptions::jitter_ns)
      .def_readwrite("loss_ppm", &model::FabricOptions::loss_ppm);
  Class<model::LabOptions>(m, "LabOptions")
      .verb("make_lab")
      .def(py::init<>())
      .def_readwrite("seed", &model::LabOptions::seed)
      .def_readwrite("hosts", &model::LabOptions::hosts)
      .def_readwrite("fabric", &model::LabOptions::fabric)
      .def_readwrite("mutations", &model::LabOptions::mutations);

  Class<model::VerbCall>(m, "VerbCall")
      .def(py::init<>())
      .def_readwrite("host", &model::VerbCall::host)
      .def_readwrite("verb", &model::VerbCall::verb)
      .def_readwrite("object", &model::VerbCall::object)
      .def_readwrite("qp_num", &model::VerbCall::qp_num)
      .def("__repr__", [](const model::VerbCall& v) {
        return "<VerbCall " + v.host + " " + v.verb + " " + v.object + ">";
      });
}

void bind_model_lab(py::module_& m) {
  Class<ModelLab, Lab, std::shared_ptr<ModelLab>>(m, "ModelLab")
      .def("run_until", &ModelLab::run_until, arg("deadline_ns"), kRelease, Verb{"run_until"})
      .def("run_for", &ModelLab::run_for, arg("duration_ns"), kRelease, Verb{"run_for"})
      .def(
          "at",
          [](const std::shared_ptr<ModelLab>& lab, TimeNs t_ns, const py::object& fn) {
            auto cb = make_callback(fn, "at(" + std::to_string(t_ns) + ")", lab);
            if (!cb) throw py::type_error("at: fn must be callable");
            py::gil_scoped_release release;
            lab->at(t_ns, [cb] { cb->call_void(); });
          },
          arg("t_ns"), arg("fn"))
      .def(
          "add_rule",
          [](const std::shared_ptr<ModelLab>& lab, const std::string& rule) {
            const nlohmann::json spec = parse_rule_json(rule);
            py::gil_scoped_release release;
            try {
              return lab->add_rule(spec);
            } catch (const faults::RuleError& e) {
              throw py::value_error(e.what());
            }
          },
          arg("rule"), "A wire-fault rule (the fault switch's JSON object); returns its id.")
      .def("remove_rule", &ModelLab::remove_rule, arg("id"), kRelease)
      .def("clear_rules", &ModelLab::clear_rules, kRelease)
      .def(
          "rules", [](const ModelLab& lab) { return lab.rules().dump(); },
          "The rules and their counters as JSON: [{id, rule, matched, acted}].")
      .def(
          "set_verb_hook",
          [](const std::shared_ptr<ModelLab>& lab, const py::object& fn) {
            auto cb = make_callback(fn, "verb hook", lab);
            model::VerbHook hook;
            if (cb) hook = [cb](const model::VerbCall& v) { cb->call_void(v); };
            py::gil_scoped_release release;
            lab->set_verb_hook(std::move(hook));
          },
          arg("hook"))
      .def("set_fabric", &ModelLab::set_fabric, arg("options"), kRelease)
      .def("inject_async_event", &ModelLab::inject_async_event, arg("host"), arg("type"),
           arg("number"), arg("driver_delay_ns") = 0, kRelease, Verb{"inject_async_event"})
      .def("set_port_state", &ModelLab::set_port_state, arg("host"), arg("up"), kRelease)
      .def("device_fatal", &ModelLab::device_fatal, arg("host"), kRelease)
      .def("rdma_link_delete", &ModelLab::rdma_link_delete, arg("host"), kRelease)
      .def("rdma_link_removal_pending", &ModelLab::rdma_link_removal_pending, arg("host"), kRelease)
      .def("rdma_link_add", &ModelLab::rdma_link_add, arg("host"), kRelease)
      .def("reboot", &ModelLab::reboot, arg("host"), arg("down_ns"), kRelease, Verb{"reboot"})
      .def("fault_counts", &ModelLab::fault_counts, kRelease)
      .def("dump_state", &ModelLab::dump_state, kRelease);

  def_fn(
      m, "make_lab", [](const model::LabOptions& o) { return gil_free_delete(model::make_lab(o)); },
      arg("options"), kRelease);
  // The fault switch's validation of a wire rule, for a lab that sends its rules to the switch:
  // the same error as the model's add_rule gives.
  def_fn(
      m, "check_wire_rule",
      [](const std::string& rule) {
        try {
          faults::parse_rule(parse_rule_json(rule));
        } catch (const faults::RuleError& e) {
          throw py::value_error(e.what());
        }
      },
      arg("rule"));
  // The planted defects (rdmalab/mutation.h) as (name, what it breaks), in table order.
  def_fn(m, "mutations", [] {
    std::vector<std::pair<std::string, std::string>> out;
    out.reserve(kMutations.size());
    for (const auto& mu : kMutations) out.emplace_back(mu.name, mu.breaks);
    return out;
  });
}

// The verbs backend: this machine's devices as one host (in the VM lab each guest's agent
// makes one, named as the scenario names that host).
void bind_verbs_lab(py::module_& m) {
  Class<verbs::VerbsLab, Lab, std::shared_ptr<verbs::VerbsLab>>(m, "VerbsLab")
      .def("set_clock_offset", &verbs::VerbsLab::set_clock_offset, arg("offset_ns"), kRelease)
      .def("stalled_ns", &verbs::VerbsLab::stalled_ns, arg("from_ns"), arg("to_ns"), kRelease);
  def_fn(
      m, "make_verbs_lab",
      [](uint64_t seed, const std::string& host) {
        return gil_free_delete(std::make_shared<verbs::VerbsLab>(seed, host));
      },
      arg("seed"), arg("host") = "local", kRelease);
}

}  // namespace

void bind_lab(py::module_& m) {
  bind_hosts(m);
  bind_lab_class(m);
  bind_model_structs(m);
  bind_model_lab(m);
  bind_verbs_lab(m);
}

}  // namespace rdmalab::bindings
