// The QP state machine of ib_modify_qp_is_ok (drivers/infiniband/core/verbs.c, qp_state_table;
// semantics.md G): which transitions are valid and which attributes each one requires and
// allows, per QP type. Pure functions; the QP applies the result.
#pragma once

#include <cstdint>
#include <string>

#include "rdmalab/types.h"

namespace rdmalab::model {

struct TransitionRule {
  bool valid = false;
  uint32_t required = 0;  // beyond QP_STATE
  uint32_t optional = 0;
};

TransitionRule transition_rule(QpState from, QpState to, QpType type);

// Checks a modify as the kernel does. Returns "" when allowed, else the reason (an EINVAL
// detail naming the transition or the missing/unexpected attribute). iWARP QPs need only the
// state (iw_cm_init_qp_attr gives STATE|ACCESS_FLAGS at most) and may carry any attribute.
std::string check_modify(QpState cur, QpState next, QpType type, uint32_t mask, bool iwarp);

// "QP_AV|QP_PATH_MTU": the names of the bits in mask, for error details and history.
std::string attr_mask_names(uint32_t mask);

}  // namespace rdmalab::model
