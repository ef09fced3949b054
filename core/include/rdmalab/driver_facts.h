// Driver facts: what each kernel RDMA driver (with its rdma-core provider) does where no
// specification settles it, one row per driver with its sources (core/common/driver_facts.cc),
// and the model personality that predicts the driver. The model's personalities
// (core/model/personality.cc) and the verbs backend's caps (core/verbs/convert.cc) both read
// these rows; Python reads them through _core.driver_facts() and _core.personality_of_driver().
#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rdmalab/types.h"

namespace rdmalab {

// A kernel release, major.minor. {0, 0}: none (a running kernel not known; a bound not
// given, read as its fact's comment says).
struct KernelRelease {
  int major = 0;
  int minor = 0;
  bool known() const { return major != 0; }
  auto operator<=>(const KernelRelease&) const = default;
};

// The facts DeviceCaps carries that a device cannot report (types.h says what each means).
struct DriverFacts {
  std::string driver;       // the kernel driver: "rxe", "mlx5" (a verbs device's caps.personality)
  std::string personality;  // the model personality that predicts it; "" = none yet
  // A user-space post to a QP in ERR (semantics.md C); unset: by transport (err_post_of).
  std::optional<ErrPostPolicy> err_post;
  bool retry_cnt_7_infinite = false;
  // ibv_query_qp reports the state from this release ({0, 0}: every release).
  KernelRelease reports_qp_state_since;
  // A send the host's own stack refuses is resent racily before this release ({0, 0}: in
  // none): caps.refused_send_resend_races.
  KernelRelease refused_send_races_before;
  QpnPolicy qpn_policy = QpnPolicy::kUnknown;
  bool disassociates = false;
  bool send_completes_on_handoff = false;
  bool connect_is_synchronous = false;
  uint16_t iw_close_timeout_s = 0;
  // The async events the driver raises by itself (semantics.md E): the model raises these.
  std::vector<AsyncEventType> raises;
  // The list was measured or read in the driver, so a real device's caps report it; otherwise
  // they report none (unknown), and a scenario that needs an event runs and sees.
  bool raises_checked = false;
  // Events a real device's caps report beyond `raises`, which the model does not predict:
  // claims the sources read since contradict, kept until a device run settles them.
  std::vector<AsyncEventType> raises_unsettled;
};

// Every row, in the table's order.
const std::vector<DriverFacts>& driver_facts();
// The row of a driver; a driver without one gets a row of defaults (driver named, no facts).
DriverFacts driver_facts(const std::string& driver);
// The model personality that predicts a driver; nullopt where none does.
std::optional<std::string> personality_of_driver(const std::string& driver);

// What a post to an ERR QP does there: the row's answer, else the documented guess by
// transport (IB and RoCE providers flush; user-space iWARP, libcxgb4, refuses).
ErrPostPolicy err_post_of(const DriverFacts& d, Transport t);
// Writes the row's provider facts into caps (whose transport is set): err_post,
// retry_cnt_7_infinite, qpn_policy, disassociates, send_completes_on_handoff,
// connect_is_synchronous, iw_close_timeout_s, raises. The model's personalities and the verbs
// backend both take these.
void apply_driver_facts(const DriverFacts& d, DeviceCaps& caps);
// Writes the facts of a real device that the model's personalities do not take (types.h says
// why for each): those of the running kernel (reports_qp_state, refused_send_resend_races;
// running unknown: the older kernels' answer), rts_needs_cm (by transport), and raises
// (device_raises).
void apply_device_facts(const DriverFacts& d, KernelRelease running, DeviceCaps& caps);
// The events a real device's caps report: raises and raises_unsettled where checked, else none.
std::vector<AsyncEventType> device_raises(const DriverFacts& d);

}  // namespace rdmalab
