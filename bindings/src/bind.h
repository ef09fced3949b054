// Shared pieces of the rdmalab._core module. The bindings only wrap: argument parsing,
// defaults and conveniences live in the Python package (bindings/rdmalab).
//
// GIL rule: the model runs harness threads one at a time, and any engine call may hand the
// baton to a simulated thread that calls back into Python (a handler, a hook, a predicate).
// So every bound call into the engine releases the GIL (kRelease), and every callback the
// engine stores acquires it (PyCallback). py::object values are touched only with the GIL.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "rdmalab/lab.h"

namespace rdmalab::bindings {

namespace py = pybind11;

using Release = py::call_guard<py::gil_scoped_release>;
inline constexpr Release kRelease{};

void bind_errors(py::module_& m);
void bind_callbacks(py::module_& m);
void bind_types(py::module_& m);
void bind_verbs(py::module_& m);
void bind_lab(py::module_& m);
void bind_stack(py::module_& m);
void bind_cm(py::module_& m);
void bind_metrics(py::module_& m);

// Binds an enum whose values are 0..count-1 under the names to_string gives (found by ADL,
// so stack enums use stack::to_string).
template <typename E>
void bind_enum(py::module_& m, const char* name, int count) {
  py::enum_<E> e(m, name);
  for (int i = 0; i < count; ++i) {
    const auto v = static_cast<E>(i);
    e.value(std::string(to_string(v)).c_str(), v);
  }
}

// Destroys engine objects without the GIL: a destructor may wait in the simulation (a QP
// destroy waits for acks, a lab joins its threads) while a simulated thread wants the GIL.
template <typename T>
std::shared_ptr<T> gil_free_delete(std::shared_ptr<T> inner) {
  if (!inner) return inner;
  T* raw = inner.get();
  return std::shared_ptr<T>(raw, [keep = std::move(inner)](T*) mutable {
    if (PyGILState_Check() != 0) {
      py::gil_scoped_release release;
      keep.reset();
    } else {
      keep.reset();
    }
  });
}

// A Python callable the engine may call from any simulated thread. Calls take the GIL. A
// Python exception cannot cross the engine's threads: it is recorded in the lab's history
// (kind "python_error") and parked; the Python layer re-raises parked errors from
// rdmalab.Lab.check_errors() (after every call that advances time and at teardown).
class PyCallback {
 public:
  PyCallback(py::object fn, std::string where, std::weak_ptr<Lab> lab);
  ~PyCallback();  // releases fn under the GIL
  PyCallback(const PyCallback&) = delete;
  PyCallback& operator=(const PyCallback&) = delete;

  // Calls fn(args...) with the GIL held and converts the result to R (bool: by Python
  // truthiness); None, a Python exception or a result of the wrong type give `fallback` (the
  // latter two are parked).
  template <typename R, typename... Args>
  R call(R fallback, const Args&... args) {
    py::gil_scoped_acquire gil;
    try {
      py::object r = fn_(py::cast(args, py::return_value_policy::copy)...);
      if constexpr (std::is_same_v<R, bool>) {
        return truth(r);  // Python truthiness: a predicate may return None, a list, ...
      } else {
        return r.is_none() ? fallback : r.cast<R>();
      }
    } catch (py::error_already_set& e) {
      park(e);
    } catch (const py::cast_error& e) {
      park_message(std::string("TypeError: ") + e.what());
    }
    return fallback;
  }

  template <typename... Args>
  void call_void(const Args&... args) {
    py::gil_scoped_acquire gil;
    try {
      fn_(py::cast(args, py::return_value_policy::copy)...);
    } catch (py::error_already_set& e) {
      park(e);
    }
  }

  // For callbacks whose failure the engine should see (a dispatcher handler counts
  // handler_errors): the error is parked, then rethrown as std::runtime_error.
  template <typename... Args>
  void call_or_throw(const Args&... args) {
    std::string what;
    {
      py::gil_scoped_acquire gil;
      try {
        fn_(py::cast(args, py::return_value_policy::copy)...);
        return;
      } catch (py::error_already_set& e) {
        what = e.what();
        park(e);
      }
    }
    throw std::runtime_error("python callback " + where_ + " raised: " + what);
  }

 private:
  void park(py::error_already_set& e);        // GIL held
  void park_message(const std::string& msg);  // GIL held
  static bool truth(const py::object& r);     // GIL held; throws error_already_set

  py::object fn_;
  std::string where_;
  std::weak_ptr<Lab> lab_;
};

// Converts a Python callable (or None) into a shared PyCallback; None gives nullptr.
std::shared_ptr<PyCallback> make_callback(const py::object& fn, std::string where,
                                          std::weak_ptr<Lab> lab);

}  // namespace rdmalab::bindings
