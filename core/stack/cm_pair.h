// A connected pair over rdma_cm in one call, and its disconnect and its channel's close: the
// calls CmPair (rdmalab.api.resources) makes step by step, in the same order and with the same
// deadlines, so the history is the same; only the round trips between them are gone (an
// agent's host pays one per step). Each stops at the first step that does not succeed and
// leaves what it made in its state: the caller cleans up, and raises what that step raises.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "stack/connection.h"

namespace rdmalab::stack {

struct CmPairUp {
  std::shared_ptr<CmId> listener;
  std::optional<CmConnection> client;
  std::optional<CmEvent> request;
  TimeNs request_ns = 0;  // when it was taken
  std::optional<CmConnection> server;
  std::shared_ptr<Context> client_ctx, server_ctx;  // the ids' devices (CmId::context)
  std::optional<CmEventRecord> client_established;  // ESTABLISHED or the failure that came
  std::optional<CmEventRecord> server_established;
  bool client_waited = false;  // the waits ran (a missing record then means their timeout)
  bool server_waited = false;
  bool ok = false;  // every step done, both sides ESTABLISHED
};

// Listen on server, connect from client to dst:port, take the request, accept it, then wait
// for the first of `established` on the client and on the server (established[0] is the
// success, the others end a wait early). Each step's deadline is timeout_ns from its start.
// No spec: the defaults (connect_spec: dst and port). Errors of a step propagate.
void cm_pair_up(CmPairUp& st, Runtime& rt, CmEventPump& server, CmEventPump& client, uint16_t port,
                const std::string& dst, std::optional<CmEndpointSpec> connect_spec,
                std::optional<CmEndpointSpec> accept_spec, TimeNs timeout_ns,
                const std::vector<CmEventType>& established);

struct CmPairDown {
  std::optional<CmEventRecord> server_disconnected;
  std::optional<CmEventRecord> client_disconnected;
  bool server_waited = false;
  bool client_waited = false;
  bool ok = false;  // both sides DISCONNECTED
};

// The client disconnects, the server waits for the first of `disconnected` and answers, the
// client waits for it too (disconnected[0] is the success).
void cm_pair_disconnect(CmPairDown& st, Runtime& rt, CmEventPump& client, CmId& client_id,
                        CmEventPump& server, CmId& server_id, TimeNs timeout_ns,
                        const std::vector<CmEventType>& disconnected);

struct CmChannelClose {
  bool stopped = false;  // the pump is stopped
};

// Closes every connection of a pump's channel (cm_close, in the order given; ids already
// destroyed are passed over), stops the pump and destroys the channel. False at once, with
// nothing done, when a listener of the channel has a CONNECT_REQUEST whose id is none of
// conns: the caller takes those ids in first.
bool cm_channel_close(CmChannelClose& st, Runtime& rt, CmEventPump& pump,
                      const std::vector<CmConnection>& conns,
                      const std::vector<uint64_t>& listeners, TimeNs timeout_ns);

}  // namespace rdmalab::stack
