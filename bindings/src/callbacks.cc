// PyCallback: Python callables run by the engine, and the parking lot for their exceptions.
#include "bind.h"

namespace rdmalab::bindings {

namespace {
// Parked (where, exception) tuples; touched only with the GIL. Leaked: see errors.cc.
py::list& parked() {
  static auto* list = new py::list();
  return *list;
}
}  // namespace

PyCallback::PyCallback(py::object fn, std::string where, std::weak_ptr<Lab> lab)
    : fn_(std::move(fn)), where_(std::move(where)), lab_(std::move(lab)) {}

PyCallback::~PyCallback() {
  if (Py_IsInitialized() == 0) {
    fn_.release();  // interpreter gone: nothing to decref into
    return;
  }
  try {
    py::gil_scoped_acquire gil;
    fn_ = py::object();
  } catch (...) {  // a destructor must not throw; losing one reference is the lesser harm
    fn_.release();
  }
}

std::string exception_text(py::error_already_set& e) {
  std::string name = "exception";
  std::string message;
  try {
    name = py::str(e.type().attr("__name__")).cast<std::string>();
    message = py::str(e.value()).cast<std::string>();
  } catch (const std::exception&) {  // a broken __str__: the type alone
  }
  return message.empty() ? name : name + ": " + message;
}

bool PyCallback::truth(const py::object& r) {
  const int t = PyObject_IsTrue(r.ptr());
  if (t < 0) throw py::error_already_set();
  return t != 0;
}

void PyCallback::park(py::error_already_set& e) {
  py::object value = e.value();
  if (e.trace()) PyException_SetTraceback(value.ptr(), e.trace().ptr());
  parked().append(py::make_tuple(where_, value));
  if (auto lab = lab_.lock()) {
    lab->history().record("", "python", "python_error", {{"where", where_}, {"error", e.what()}});
  }
}

void PyCallback::park_message(const std::string& msg) {
  py::object value = py::module_::import("builtins").attr("TypeError")(msg);
  parked().append(py::make_tuple(where_, value));
  if (auto lab = lab_.lock()) {
    lab->history().record("", "python", "python_error", {{"where", where_}, {"error", msg}});
  }
}

std::shared_ptr<PyCallback> make_callback(const py::object& fn, std::string where,
                                          std::weak_ptr<Lab> lab) {
  if (fn.is_none()) return nullptr;
  if (!PyCallable_Check(fn.ptr())) {
    throw py::type_error(where + ": expected a callable or None, got " +
                         std::string(py::str(py::type::of(fn).attr("__name__"))));
  }
  return std::make_shared<PyCallback>(fn, std::move(where), std::move(lab));
}

void bind_callbacks(py::module_& m) {
  def_fn(
      m, "take_python_errors",
      [] {
        py::list out = parked();
        parked() = py::list();
        return out;
      },
      "Parked (where, exception) pairs from callbacks, oldest first; clears them.");
  def_fn(m, "pending_python_errors", [] { return py::len(parked()); });
}

}  // namespace rdmalab::bindings
