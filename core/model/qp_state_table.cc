#include "model/qp_state_table.h"

#include <array>
#include <utility>

namespace rdmalab::model {
namespace {

constexpr int kStates = 7;  // RESET INIT RTR RTS SQD SQE ERR
constexpr int kTypes = 4;   // RC UD XRC_SEND XRC_RECV

struct Entry {
  bool valid = false;
  std::array<uint32_t, kTypes> req{};
  std::array<uint32_t, kTypes> opt{};
};
using Table = std::array<std::array<Entry, kStates>, kStates>;

constexpr int idx(QpState s) {
  return static_cast<int>(s);
}

// Per type, in QpType order: RC, UD, XRC_SEND (XRC_INI), XRC_RECV (XRC_TGT).
constexpr std::array<uint32_t, kTypes> per_type(uint32_t rc, uint32_t ud, uint32_t ini,
                                                uint32_t tgt) {
  return {rc, ud, ini, tgt};
}

constexpr uint32_t kPkeyPortAccess = QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS;
constexpr uint32_t kRtrRc =
    QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN | QP_MAX_DEST_RD_ATOMIC | QP_MIN_RNR_TIMER;
constexpr uint32_t kRtrIni = QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN;
constexpr uint32_t kRtsRc =
    QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_SQ_PSN | QP_MAX_QP_RD_ATOMIC;
constexpr uint32_t kAltMig = QP_ALT_PATH | QP_ACCESS_FLAGS | QP_PATH_MIG_STATE;

Table build() {
  using enum QpState;
  Table t{};
  auto valid = [&t](QpState a, QpState b) -> Entry& {
    Entry& e = t[idx(a)][idx(b)];
    e.valid = true;
    return e;
  };
  valid(RESET, RESET);
  valid(RESET, INIT).req = per_type(kPkeyPortAccess, QP_PKEY_INDEX | QP_PORT | QP_QKEY,
                                    kPkeyPortAccess, kPkeyPortAccess);
  valid(INIT, RESET);
  valid(INIT, ERR);
  valid(INIT, INIT).opt = per_type(kPkeyPortAccess, QP_PKEY_INDEX | QP_PORT | QP_QKEY,
                                   kPkeyPortAccess, kPkeyPortAccess);
  Entry& init_rtr = valid(INIT, RTR);
  init_rtr.req = per_type(kRtrRc, 0, kRtrIni, kRtrRc);
  const uint32_t rtr_opt = QP_ALT_PATH | QP_ACCESS_FLAGS | QP_PKEY_INDEX;
  init_rtr.opt = per_type(rtr_opt, QP_PKEY_INDEX | QP_QKEY, rtr_opt, rtr_opt);
  valid(RTR, RESET);
  valid(RTR, ERR);
  Entry& rtr_rts = valid(RTR, RTS);
  rtr_rts.req = per_type(kRtsRc, QP_SQ_PSN, kRtsRc, QP_TIMEOUT | QP_SQ_PSN);
  rtr_rts.opt = per_type(QP_CUR_STATE | kAltMig | QP_MIN_RNR_TIMER, QP_CUR_STATE | QP_QKEY,
                         QP_CUR_STATE | kAltMig, QP_CUR_STATE | kAltMig | QP_MIN_RNR_TIMER);
  valid(RTS, RESET);
  valid(RTS, ERR);
  valid(RTS, RTS).opt = rtr_rts.opt;
  const uint32_t notify = QP_EN_SQD_ASYNC_NOTIFY;
  valid(RTS, SQD).opt = per_type(notify, notify, notify, notify);
  valid(SQD, RESET);
  valid(SQD, ERR);
  valid(SQD, RTS).opt = rtr_rts.opt;
  valid(SQD, SQD).opt =
      per_type(QP_PORT | QP_AV | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_MAX_QP_RD_ATOMIC |
                   QP_MAX_DEST_RD_ATOMIC | kAltMig | QP_PKEY_INDEX | QP_MIN_RNR_TIMER,
               QP_PKEY_INDEX | QP_QKEY,
               QP_PORT | QP_AV | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_MAX_QP_RD_ATOMIC |
                   kAltMig | QP_PKEY_INDEX,
               QP_PORT | QP_AV | QP_TIMEOUT | QP_MAX_DEST_RD_ATOMIC | kAltMig | QP_PKEY_INDEX |
                   QP_MIN_RNR_TIMER);
  valid(SQE, RESET);
  valid(SQE, ERR);
  valid(SQE, RTS).opt = per_type(0, QP_CUR_STATE | QP_QKEY, 0, 0);  // RC has no SQE->RTS option
  valid(ERR, RESET);
  valid(ERR, ERR);
  return t;
}

const Table& table() {
  static const Table t = build();
  return t;
}

constexpr std::array<std::pair<uint32_t, const char*>, 21> kMaskNames = {{
    {QP_STATE, "QP_STATE"},
    {QP_CUR_STATE, "QP_CUR_STATE"},
    {QP_EN_SQD_ASYNC_NOTIFY, "QP_EN_SQD_ASYNC_NOTIFY"},
    {QP_ACCESS_FLAGS, "QP_ACCESS_FLAGS"},
    {QP_PKEY_INDEX, "QP_PKEY_INDEX"},
    {QP_PORT, "QP_PORT"},
    {QP_QKEY, "QP_QKEY"},
    {QP_AV, "QP_AV"},
    {QP_PATH_MTU, "QP_PATH_MTU"},
    {QP_TIMEOUT, "QP_TIMEOUT"},
    {QP_RETRY_CNT, "QP_RETRY_CNT"},
    {QP_RNR_RETRY, "QP_RNR_RETRY"},
    {QP_RQ_PSN, "QP_RQ_PSN"},
    {QP_MAX_QP_RD_ATOMIC, "QP_MAX_QP_RD_ATOMIC"},
    {QP_ALT_PATH, "QP_ALT_PATH"},
    {QP_MIN_RNR_TIMER, "QP_MIN_RNR_TIMER"},
    {QP_SQ_PSN, "QP_SQ_PSN"},
    {QP_MAX_DEST_RD_ATOMIC, "QP_MAX_DEST_RD_ATOMIC"},
    {QP_PATH_MIG_STATE, "QP_PATH_MIG_STATE"},
    {QP_CAP, "QP_CAP"},
    {QP_DEST_QPN, "QP_DEST_QPN"},
}};

}  // namespace

TransitionRule transition_rule(QpState from, QpState to, QpType type) {
  const Entry& e = table()[idx(from)][idx(to)];
  const int ty = static_cast<int>(type);
  return TransitionRule{e.valid, e.req[ty], e.opt[ty]};
}

std::string attr_mask_names(uint32_t mask) {
  std::string out;
  for (const auto& [bit, name] : kMaskNames) {
    if ((mask & bit) == 0) continue;
    if (!out.empty()) out += "|";
    out += name;
  }
  return out.empty() ? "0" : out;
}

std::string check_modify(QpState cur, QpState next, QpType type, uint32_t mask, bool iwarp) {
  const std::string step = std::string(to_string(cur)) + "->" + std::string(to_string(next));
  const TransitionRule rule = transition_rule(cur, next, type);
  if (!rule.valid) return "invalid transition " + step;
  if ((mask & QP_CUR_STATE) && cur != QpState::RTR && cur != QpState::RTS && cur != QpState::SQD &&
      cur != QpState::SQE) {
    return "QP_CUR_STATE not accepted in " + std::string(to_string(cur));
  }
  if (iwarp) return "";
  const uint32_t missing = rule.required & ~mask;
  if (missing) {
    return step + " for " + std::string(to_string(type)) + " requires " + attr_mask_names(missing);
  }
  const uint32_t extra = mask & ~(rule.required | rule.optional | QP_STATE);
  if (extra) {
    return step + " for " + std::string(to_string(type)) + " does not accept " +
           attr_mask_names(extra);
  }
  return "";
}

}  // namespace rdmalab::model
