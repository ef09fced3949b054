#include "rdmalab/error.h"

#include <cstring>

namespace rdmalab {

namespace {
std::string errno_name(int err) {
  // strerrorname_np (glibc 2.32+) gives "EBADF"; fall back to the number.
  const char* n = strerrorname_np(err);
  return n != nullptr ? std::string(n) : "errno " + std::to_string(err);
}

std::string format(const std::string& verb, int err, const std::string& detail) {
  std::string s = verb + ": " + errno_name(err) + " (" + std::to_string(err) + ")";
  if (!detail.empty()) s += ": " + detail;
  return s;
}
}  // namespace

Error::Error(std::string verb, int err, const std::string& detail)
    : std::runtime_error(format(verb, err, detail)),
      verb_(std::move(verb)),
      errno_(err),
      detail_(detail) {}

}  // namespace rdmalab
