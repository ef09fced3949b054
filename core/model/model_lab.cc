#include "model/model_lab.h"

#include <algorithm>
#include <sstream>

#include "model/context.h"
#include "model/device.h"
#include "model/qp.h"
#include "model/resources.h"

namespace rdmalab::model {

ModelLabImpl::ModelLabImpl(const LabOptions& opts)
    : env_(std::make_unique<Env>(opts.seed)),
      fabric_(std::make_unique<Fabric>(*env_, opts.fabric)) {
  if (opts.hosts.empty()) throw Error("make_lab", EINVAL, "a lab needs at least one host");
  MutationSet mutations;
  for (const std::string& name : opts.mutations) {
    const auto m = mutation_by_name(name);
    if (!m) {
      throw Error("make_lab", EINVAL,
                  "unknown mutation '" + name + "'; known: " + mutation_names());
    }
    mutations.set(*m);
  }
  env_->runtime.set_mutations(mutations);
  int index = 0;
  for (const HostSpec& spec : opts.hosts) {
    if (spec.name.empty()) throw Error("make_lab", EINVAL, "a host needs a name");
    if (env_->devices.count(spec.name))
      throw Error("make_lab", EINVAL, "host '" + spec.name + "' twice");
    Personality p = personality(spec.personality);
    if (spec.xrc_tgt_lifetime && p.caps.xrc) p.caps.xrc_tgt_lifetime = *spec.xrc_tgt_lifetime;
    hosts_.push_back(std::make_shared<ModelHost>(*env_, *fabric_, spec.name, p, index++));
    fabric_->rules().add_host(spec.name, p.caps.transport == Transport::iWARP);
  }
  Env* env = env_.get();
  fabric_->set_link_up([env](const std::string& host) -> const char* {
    Device* d = env->device(host);
    if (d == nullptr || d->host_down) return Fabric::kHostDown;
    return d->port_up && !d->fatal ? nullptr : Fabric::kPortDown;
  });
  nlohmann::json start = {{"seed", opts.seed}, {"hosts", opts.hosts.size()}};
  if (!opts.mutations.empty()) start["mutations"] = opts.mutations;  // a planted-defect model
  env_->record("", "lab", "lab_start", std::move(start));
}

ModelLabImpl::~ModelLabImpl() {
  shutdown();
}

void ModelLabImpl::check_alive(const std::string& verb) const {
  if (shut_down_) throw Error(verb, ESHUTDOWN, "lab shut down");
}

std::vector<std::shared_ptr<Host>> ModelLabImpl::hosts() const {
  return {hosts_.begin(), hosts_.end()};
}

std::shared_ptr<Host> ModelLabImpl::host(const std::string& name) const {
  for (const auto& h : hosts_) {
    if (h->name() == name) return h;
  }
  throw Error("host", ENOENT, "no host '" + name + "'");
}

Device& ModelLabImpl::device_of(const std::string& verb, const std::string& host) const {
  check_alive(verb);
  Device* d = env_->device(host);
  if (d == nullptr) throw Error(verb, ENOENT, "no host '" + host + "'");
  return *d;
}

void ModelLabImpl::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  env_->runtime.shutdown();  // harness threads end while the model is still whole
  for (size_t i = hosts_.size(); i-- > 0;) hosts_[i]->shutdown();  // newest first
  env_->token->alive = false;
}

void ModelLabImpl::run_until(TimeNs deadline_ns) {
  check_alive("run_until");
  env_->runtime.wait_until([] { return false; }, deadline_ns);
}

// fn runs inside the scheduler (like a packet arrival): it must not block. A fault that fails
// (e.g. inject on a QP already gone) is recorded, not thrown into whichever thread was waiting.
void ModelLabImpl::at(TimeNs t_ns, std::function<void()> fn) {
  check_alive("at");
  Env* env = env_.get();
  env_->runtime.schedule_at(std::max(t_ns, env_->runtime.now_ns()), [env, fn = std::move(fn)] {
    try {
      fn();
    } catch (const Error& e) {
      env->record("", "lab", "at_error",
                  {{"verb", e.verb()}, {"err", e.err()}, {"detail", e.detail()}});
    }
  });
}

uint64_t ModelLabImpl::add_rule(const nlohmann::json& rule) {
  check_alive("add_rule");
  const uint64_t id = fabric_->rules().add(rule);
  env_->record("", "fabric", "wire_rule", {{"id", id}, {"rule", rule}});
  return id;
}

bool ModelLabImpl::remove_rule(uint64_t id) {
  check_alive("remove_rule");
  const bool removed = fabric_->rules().remove(id);
  if (removed) env_->record("", "fabric", "wire_rule_removed", {{"id", id}});
  return removed;
}

size_t ModelLabImpl::clear_rules() {
  check_alive("clear_rules");
  const size_t n = fabric_->rules().clear();
  if (n > 0) env_->record("", "fabric", "wire_rules_cleared", {{"removed", n}});
  return n;
}

nlohmann::json ModelLabImpl::rules() const {
  return fabric_->rules().rules_json();
}

void ModelLabImpl::set_fabric(const FabricOptions& opts) {
  check_alive("set_fabric");
  fabric_->set_options(opts);
  env_->record("", "fabric", "fabric_options",
               {{"latency_ns", opts.latency_ns},
                {"jitter_ns", opts.jitter_ns},
                {"loss_ppm", opts.loss_ppm}});
}

void ModelLabImpl::set_verb_hook(VerbHook hook) {
  check_alive("set_verb_hook");
  env_->verb_hook = std::move(hook);
}

// The hardware makes the EQE now; the driver handles it after driver_delay_ns. Errors that
// come with a QP event (QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR) move the QP to ERR at once.
void ModelLabImpl::inject_async_event(const std::string& host, AsyncEventType type, uint32_t number,
                                      TimeNs driver_delay_ns) {
  const std::string verb = "inject_async_event";
  Device& d = device_of(verb, host);
  if (!d.caps.raises_event(type)) {
    throw Error(verb, EOPNOTSUPP,
                d.caps.personality + " does not raise " + std::string(to_string(type)));
  }
  const std::string n = std::to_string(number);
  QpCore* qp = nullptr;
  switch (affiliation(type)) {
    case ObjectKind::QP:
      if (!d.qp_table.count(number)) throw Error(verb, ENOENT, "no QPN " + n + " on " + host);
      qp = d.qp_table.at(number);
      break;
    case ObjectKind::SRQ:
      if (!d.srq_table.count(number)) throw Error(verb, ENOENT, "no SRQN " + n + " on " + host);
      break;
    case ObjectKind::CQ:
      if (!d.cq_table.count(number)) throw Error(verb, ENOENT, "no CQ " + n + " on " + host);
      break;
    case ObjectKind::PORT:
      if (number == 0 || number > d.caps.phys_port_cnt)
        throw Error(verb, ENOENT, "no port " + n + " on " + host);
      break;
    default:
      break;
  }
  env_->fault(host, "device", "async_event",
              {{"event", std::string(to_string(type))},
               {"number", number},
               {"driver_delay_ns", driver_delay_ns}});
  if (qp && (type == AsyncEventType::QP_FATAL || type == AsyncEventType::QP_REQ_ERR ||
             type == AsyncEventType::QP_ACCESS_ERR)) {
    qp->to_error("injected " + std::string(to_string(type)));
  }
  d.raise(type, number, driver_delay_ns);
}

void ModelLabImpl::set_port_state(const std::string& host, bool up) {
  Device& d = device_of("set_port_state", host);
  env_->fault(host, "port:1", up ? "port_up" : "port_down");
  d.set_port(up);
}

void ModelLabImpl::device_fatal(const std::string& host) {
  Device& d = device_of("device_fatal", host);
  if (!d.caps.raises_event(AsyncEventType::DEVICE_FATAL)) {
    throw Error("device_fatal", EOPNOTSUPP, d.caps.personality + " does not raise DEVICE_FATAL");
  }
  env_->fault(host, "device", "device_fatal");
  d.make_fatal();
}

void ModelLabImpl::rdma_link_delete(const std::string& host) {
  Device& d = device_of("rdma_link_delete", host);
  if (d.removal != Device::Removal::kNone)
    throw Error("rdma_link_delete", EBUSY, host + ": its device is already being removed");
  env_->fault(host, "device", "rdma_link_delete", {{"disassociates", d.caps.disassociates}});
  d.remove();
}

bool ModelLabImpl::rdma_link_removal_pending(const std::string& host) const {
  return device_of("rdma_link_removal_pending", host).removal == Device::Removal::kPending;
}

void ModelLabImpl::rdma_link_add(const std::string& host) {
  Device& d = device_of("rdma_link_add", host);
  if (d.removal == Device::Removal::kNone)
    throw Error("rdma_link_add", ENODEV, host + ": no device of it was deleted");
  if (d.removal == Device::Removal::kPending)
    throw Error("rdma_link_add", EBUSY, host + ": rdma link delete still blocks: a user context "
                                        "on it is still open");
  env_->fault(host, "device", "rdma_link_add");
  d.add_back();
}

// A host crash: everything on it goes at once with nothing sent (no DREQ, no FIN), packets
// to it are lost while it is down, and it comes back with the same GUID, GID and first QPN.
void ModelLabImpl::reboot(const std::string& host, TimeNs down_ns) {
  Device& d = device_of("reboot", host);
  if (d.host_down) throw Error("reboot", EALREADY, host + " is already down");
  env_->fault(host, "host", "reboot", {{"down_ns", down_ns}});
  d.host_down = true;
  for (const auto& h : hosts_) {
    if (h->name() == host) h->crash();
  }
  Env* env = env_.get();
  Device* dev = &d;
  env_->runtime.schedule_after(std::max<TimeNs>(0, down_ns), [env, dev] {
    dev->host_down = false;
    env->record(dev->host, "host", "host_up", {{"node_guid", dev->caps.node_guid}});
  });
}

std::string ModelLabImpl::dump_state() const {
  std::ostringstream out;
  out << "model lab seed " << env_->seed << " at " << env_->runtime.now_ns() << " ns"
      << (shut_down_ ? " (shut down)" : "") << ", " << env_->runtime.pending_timers()
      << " timers\n";
  if (shut_down_) return out.str();
  for (const auto& h : hosts_) out << h->dump();
  out << env_->runtime.dump_threads();
  return out.str();
}

std::shared_ptr<ModelLab> make_lab(const LabOptions& opts) {
  return std::make_shared<ModelLabImpl>(opts);
}

}  // namespace rdmalab::model
