// rdmalab::Error -> rdmalab._core.Error (a RuntimeError) with .verb, .errno, .errno_name and
// .detail; DeadlineExceeded -> its subclass. str(e) is the engine's own message:
// "ibv_post_send: EBADF (9): qp 3 was destroyed".
#include <cstring>

#include "bind.h"
#include "rdmalab/error.h"

namespace rdmalab::bindings {

namespace {

// Leaked on purpose: exception types live as long as the interpreter, and a static
// py::object would be released after the interpreter is gone.
py::object* g_error = nullptr;
py::object* g_deadline = nullptr;
py::object* g_out_of_range = nullptr;

std::string errno_name(int err) {
  const char* n = strerrorname_np(err);
  return n != nullptr ? n : "errno " + std::to_string(err);
}

void raise(const py::object& type, const Error& e) {
  py::object inst = type(py::str(e.what()));
  inst.attr("verb") = e.verb();
  inst.attr("errno") = e.err();
  inst.attr("errno_name") = errno_name(e.err());
  inst.attr("detail") = e.detail();
  PyErr_SetObject(type.ptr(), inst.ptr());
}

}  // namespace

void throw_out_of_range(const std::string& verb, const std::string& name, const std::string& given,
                        const std::string& type, const std::string& min, const std::string& max) {
  throw OutOfRange(verb, name + " = " + given + " is outside " + type + " (" + min + ".." + max +
                             ")");
}

void bind_errors(py::module_& m) {
  g_error = new py::object(py::reinterpret_steal<py::object>(PyErr_NewExceptionWithDoc(
      "rdmalab._core.Error", "A verb failed: .verb, .errno, .errno_name, .detail.",
      PyExc_RuntimeError, nullptr)));
  g_deadline = new py::object(py::reinterpret_steal<py::object>(PyErr_NewExceptionWithDoc(
      "rdmalab._core.DeadlineExceeded", "A wait reached its deadline (errno ETIMEDOUT).",
      g_error->ptr(), nullptr)));
  // An Error that is a TypeError too: an int out of its C type's range was a TypeError
  // (pybind11's) before it was an Error, and code that catches TypeError for a bad value
  // still sees it.
  g_out_of_range = new py::object(py::reinterpret_steal<py::object>(PyErr_NewExceptionWithDoc(
      "rdmalab._core.OutOfRange",
      "An integer argument outside its C type's range (errno EINVAL); also a TypeError.",
      py::make_tuple(*g_error, py::handle(PyExc_TypeError)).ptr(), nullptr)));
  m.attr("Error") = *g_error;
  m.attr("DeadlineExceeded") = *g_deadline;
  m.attr("OutOfRange") = *g_out_of_range;

  py::register_exception_translator(
      [](std::exception_ptr p) {  // NOLINT(performance-unnecessary-value-param): pybind11 signature
        try {
          if (p) std::rethrow_exception(p);
        } catch (const DeadlineExceeded& e) {
          raise(*g_deadline, e);
        } catch (const OutOfRange& e) {
          raise(*g_out_of_range, e);
        } catch (const Error& e) {
          raise(*g_error, e);
        }
      });

  def_fn(m, "errno_name", &errno_name, py::arg("errno"), "EBADF for 9.");
  // Lets the Python layer build errors (FaultNotSupported, Hung) with the engine's format.
  def_fn(
      m, "format_error",
      [](const std::string& verb, int err, const std::string& detail) {
        return std::string(Error(verb, err, detail).what());
      },
      py::arg("verb"), py::arg("errno"), py::arg("detail") = "");
  // Raises the engine's own Error, so tests can check the translation end to end.
  def_fn(
      m, "raise_error",
      [](const std::string& verb, int err, const std::string& detail, bool deadline) {
        if (deadline) throw DeadlineExceeded(verb, detail);
        throw Error(verb, err, detail);
      },
      py::arg("verb"), py::arg("errno"), py::arg("detail") = "", py::arg("deadline") = false);
}

}  // namespace rdmalab::bindings
