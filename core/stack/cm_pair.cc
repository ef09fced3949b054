#include "stack/cm_pair.h"

#include <algorithm>
#include <cerrno>

#include "rdmalab/error.h"

namespace rdmalab::stack {

namespace {

// The first of `types` for the id, within timeout_ns from now.
std::optional<CmEventRecord> wait_for(CmEventPump& pump, Runtime& rt, const CmId& id,
                                      const std::vector<CmEventType>& types, TimeNs timeout_ns) {
  return pump.wait_first(id.id(), types, rt.now_ns() + timeout_ns);
}

// The wait ended with `type`.
bool came(const std::optional<CmEventRecord>& r, CmEventType type) {
  return r && r->event.event == type;
}

void check_events(const char* verb, const std::vector<CmEventType>& types) {
  if (types.empty()) throw Error(verb, EINVAL, "no event to wait for");
}

}  // namespace

void cm_pair_up(CmPairUp& st, Runtime& rt, CmEventPump& server, CmEventPump& client, uint16_t port,
                const std::string& dst, std::optional<CmEndpointSpec> connect_spec,
                std::optional<CmEndpointSpec> accept_spec, TimeNs timeout_ns,
                const std::vector<CmEventType>& established) {
  check_events("cm_pair_up", established);
  if (!connect_spec) {
    connect_spec.emplace();
    connect_spec->dst = dst;
    connect_spec->port = port;
  }
  if (!accept_spec) accept_spec.emplace();
  st.listener = cm_listen(server, port);
  st.client = cm_connect(client, *connect_spec, rt.now_ns() + timeout_ns);
  st.client_ctx = st.client->id->context();
  st.request = server.next_connect_request(st.listener->id(), rt.now_ns() + timeout_ns);
  if (!st.request) return;
  st.request_ns = rt.now_ns();
  st.server = cm_accept(server, server.channel().find_id(st.request->id), *accept_spec);
  st.server_ctx = st.server->id->context();
  st.client_waited = true;
  st.client_established = wait_for(client, rt, *st.client->id, established, timeout_ns);
  if (!came(st.client_established, established[0])) return;
  st.server_waited = true;
  st.server_established = wait_for(server, rt, *st.server->id, established, timeout_ns);
  st.ok = came(st.server_established, established[0]);
}

void cm_pair_disconnect(CmPairDown& st, Runtime& rt, CmEventPump& client, CmId& client_id,
                        CmEventPump& server, CmId& server_id, TimeNs timeout_ns,
                        const std::vector<CmEventType>& disconnected) {
  check_events("cm_pair_disconnect", disconnected);
  client_id.disconnect();
  st.server_waited = true;
  st.server_disconnected = wait_for(server, rt, server_id, disconnected, timeout_ns);
  if (!came(st.server_disconnected, disconnected[0])) return;
  server_id.disconnect();
  st.client_waited = true;
  st.client_disconnected = wait_for(client, rt, client_id, disconnected, timeout_ns);
  st.ok = came(st.client_disconnected, disconnected[0]);
}

bool cm_channel_close(CmChannelClose& st, Runtime& rt, CmEventPump& pump,
                      const std::vector<CmConnection>& conns,
                      const std::vector<uint64_t>& listeners, TimeNs timeout_ns) {
  for (uint64_t listener : listeners) {
    for (const auto& r : pump.events(listener)) {
      if (r.event.event != CmEventType::CONNECT_REQUEST) continue;
      const bool known = std::any_of(conns.begin(), conns.end(), [&r](const CmConnection& c) {
        return c.id && c.id->id() == r.event.id;
      });
      if (!known) return false;
    }
  }
  for (CmConnection c : conns) {
    if (!c.id || c.id->destroyed()) continue;
    cm_close(pump, c, rt.now_ns() + timeout_ns);
  }
  if (pump.running()) pump.stop(rt.now_ns() + timeout_ns);
  st.stopped = true;
  pump.channel().destroy();
  return true;
}

}  // namespace rdmalab::stack
