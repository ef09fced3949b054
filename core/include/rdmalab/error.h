// Errors carry the errno and the verb that failed, as the kernel and libibverbs report them.
#pragma once

#include <cerrno>
#include <stdexcept>
#include <string>

namespace rdmalab {

class Error : public std::runtime_error {
 public:
  Error(std::string verb, int err, const std::string& detail);
  const std::string& verb() const noexcept { return verb_; }
  int err() const noexcept { return errno_; }
  const std::string& detail() const noexcept { return detail_; }

 private:
  std::string verb_;
  int errno_;
  std::string detail_;
};

// A wait that reached its deadline. Carries what the waiter was waiting for.
class DeadlineExceeded : public Error {
 public:
  DeadlineExceeded(std::string verb, const std::string& waiting_for)
      : Error(std::move(verb), ETIMEDOUT, waiting_for) {}
};

}  // namespace rdmalab
