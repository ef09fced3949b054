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

#include <algorithm>
#include <cstddef>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "rdmalab/error.h"
#include "rdmalab/lab.h"

namespace rdmalab::bindings {

namespace py = pybind11;

using Release = py::call_guard<py::gil_scoped_release>;
inline constexpr Release kRelease{};

void bind_errors(py::module_& m);
void bind_callbacks(py::module_& m);
void bind_types(py::module_& m);
void bind_facts(py::module_& m);
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

// "ValueError: boom": a Python exception's type and message, without its traceback (GIL held).
std::string exception_text(py::error_already_set& e);

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

  // For callbacks whose failure the engine should see and record (a dispatcher's or CM pump's
  // handler: handler_error / cm_handler_error, with handler_errors counted): the error is
  // parked (not recorded as python_error: the engine's record names the handler), then
  // rethrown as std::runtime_error("ValueError: boom").
  template <typename... Args>
  void call_or_throw(const Args&... args) {
    std::string what;
    {
      py::gil_scoped_acquire gil;
      try {
        fn_(py::cast(args, py::return_value_policy::copy)...);
        return;
      } catch (py::error_already_set& e) {
        what = exception_text(e);
        park(e);
      }
    }
    throw std::runtime_error(what);
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

// ---------------------------------------------------------------- integer arguments
//
// Any Python int reaches a binding; one outside its C type's range is an rdmalab.Error (EINVAL)
// naming the verb and the argument ("ibv_create_cq: EINVAL (22): cqe = 1099511627776 is outside
// int32 (-2147483648..2147483647)"), never pybind11's "incompatible function arguments"
// TypeError. The functions, methods and read-write fields bound through Class and def_fn (below)
// get this from their signatures: every integer parameter (bool and char aside) is taken as an
// IntArg and checked before the call. A Verb extra names the verb (else "Class::method"; a
// field: the class's verb()). Non-integers keep pybind11's TypeError.

template <class T>
struct IntArg {
  T value{};
  bool in_range = true;
  std::string given;  // the Python int as text, when out of range
};

template <class T>
inline constexpr bool kIsInt =
    std::is_integral_v<T> && !std::is_same_v<T, bool> && !std::is_same_v<T, char> &&
    !std::is_same_v<T, wchar_t> && !std::is_same_v<T, char8_t> && !std::is_same_v<T, char16_t> &&
    !std::is_same_v<T, char32_t>;

// "int32", "uint64": the type's name in the error.
template <class T>
std::string int_type_name() {
  return std::string(std::is_signed_v<T> ? "int" : "uint") + std::to_string(8 * sizeof(T));
}

// An integer argument outside its C type's range: rdmalab._core.OutOfRange, an Error (EINVAL)
// that is also a TypeError (errors.cc).
class OutOfRange : public Error {
 public:
  OutOfRange(std::string verb, const std::string& detail)
      : Error(std::move(verb), EINVAL, detail) {}
};

// Throws OutOfRange for an out-of-range argument (errors.cc holds the one format).
[[noreturn]] void throw_out_of_range(const std::string& verb, const std::string& name,
                                     const std::string& given, const std::string& type,
                                     const std::string& min, const std::string& max);

// arg's value, or the error naming verb and name.
template <class T>
T int_of(const IntArg<T>& arg, const std::string& verb, const std::string& name) {
  if (!arg.in_range) {
    throw_out_of_range(verb, name, arg.given, int_type_name<T>(),
                       std::to_string(std::numeric_limits<T>::min()),
                       std::to_string(std::numeric_limits<T>::max()));
  }
  return arg.value;
}

// The verb a binding's range errors name (an extra of Class::def and def_fn).
struct Verb {
  const char* name;
};

namespace detail {

// An integer parameter taken as IntArg (by value or const reference), others as they are.
template <class A, class = void>
struct Param {
  using Type = A;
};
template <class A>
struct Param<
    A, std::enable_if_t<kIsInt<std::remove_cvref_t<A>> &&
                        (!std::is_reference_v<A> || std::is_const_v<std::remove_reference_t<A>>)>> {
  using Type = IntArg<std::remove_cvref_t<A>>;
};
template <class A>
using ParamT = typename Param<A>::Type;

struct ArgNames {
  std::string verb;
  std::vector<std::string> names;  // of the Python-visible parameters, in order
  size_t offset = 0;               // leading C++ parameters with no name (self)
};

template <class T>
struct IsIntArg : std::false_type {};
template <class T>
struct IsIntArg<IntArg<T>> : std::true_type {};

inline std::string arg_name(const ArgNames& info, size_t index) {
  const size_t k = index - std::min(index, info.offset);
  return k < info.names.size() && !info.names[k].empty() ? info.names[k]
                                                         : "argument " + std::to_string(k + 1);
}

// Refuses an out-of-range IntArg (naming it); anything else passes.
template <class P>
void check_arg(const P& p, const ArgNames& info, size_t index) {
  if constexpr (IsIntArg<P>::value) {
    if (!p.in_range) (void)int_of(p, info.verb, arg_name(info, index));
  }
}

// An IntArg's value; anything else as it is.
template <class P>
decltype(auto) unwrap_arg(P&& p) {
  if constexpr (IsIntArg<std::remove_cvref_t<P>>::value) {
    return p.value;
  } else {
    return std::forward<P>(p);
  }
}

template <class R, class Fn, class... P, size_t... I>
R call_checked(const Fn& fn, const ArgNames& info, std::index_sequence<I...> /*seq*/, P&&... p) {
  (check_arg(p, info, I), ...);  // left to right: the first bad argument is named
  return fn(unwrap_arg(std::forward<P>(p))...);
}

template <class R, class... A, class Fn>
auto wrap_args(Fn fn, ArgNames info) {
  return [fn = std::move(fn), info = std::move(info)](ParamT<A>... a) -> R {
    return call_checked<R>(fn, info, std::index_sequence_for<A...>{},
                           std::forward<ParamT<A>>(a)...);
  };
}

template <class F>
struct Sig : Sig<decltype(&F::operator())> {};  // a lambda or functor: its call operator
template <class R, class... A>
struct Sig<R (*)(A...)> {
  template <class Fn>
  static auto wrap(Fn fn, ArgNames info) {
    return wrap_args<R, A...>(std::move(fn), std::move(info));
  }
};
template <class R, class... A>
struct Sig<R (*)(A...) noexcept> : Sig<R (*)(A...)> {};
template <class L, class R, class... A>
struct Sig<R (L::*)(A...) const> : Sig<R (*)(A...)> {};
template <class L, class R, class... A>
struct Sig<R (L::*)(A...)> : Sig<R (*)(A...)> {};
template <class L, class R, class... A>
struct Sig<R (L::*)(A...) const noexcept> : Sig<R (*)(A...)> {};

// A member function as a callable taking self first.
template <class C, class R, class... A>
auto wrap_member(R (C::*f)(A...), ArgNames info) {
  return wrap_args<R, C&, A...>(
      [f](C& self, A... a) -> R { return (self.*f)(std::forward<A>(a)...); }, std::move(info));
}
template <class C, class R, class... A>
auto wrap_member(R (C::*f)(A...) const, ArgNames info) {
  return wrap_args<R, const C&, A...>(
      [f](const C& self, A... a) -> R { return (self.*f)(std::forward<A>(a)...); },
      std::move(info));
}
template <class C, class R, class... A>
auto wrap_member(R (C::*f)(A...) noexcept, ArgNames info) {
  return wrap_args<R, C&, A...>(
      [f](C& self, A... a) -> R { return (self.*f)(std::forward<A>(a)...); }, std::move(info));
}
template <class C, class R, class... A>
auto wrap_member(R (C::*f)(A...) const noexcept, ArgNames info) {
  return wrap_args<R, const C&, A...>(
      [f](const C& self, A... a) -> R { return (self.*f)(std::forward<A>(a)...); },
      std::move(info));
}

// A callable (lambda, function pointer) or a member function pointer, with its integer
// parameters checked.
template <class F>
auto wrap_callable(F&& f, ArgNames info) {
  using D = std::decay_t<F>;
  if constexpr (std::is_member_function_pointer_v<D>) {
    return wrap_member(f, std::move(info));
  } else if constexpr (std::is_pointer_v<D>) {
    return Sig<D>::wrap(D(f), std::move(info));
  } else {
    return Sig<D>::wrap(D(std::forward<F>(f)), std::move(info));
  }
}

template <class E>
void collect(ArgNames& info, const E& e) {
  if constexpr (std::is_base_of_v<py::arg, E>) {
    info.names.emplace_back(e.name != nullptr ? e.name : "");
  } else if constexpr (std::is_same_v<E, Verb>) {
    info.verb = e.name;
  }
}

template <class E>
auto unless_verb(const E& e) {
  if constexpr (std::is_same_v<E, Verb>) {
    return std::tuple<>();
  } else {
    return std::tuple<const E&>(e);
  }
}

template <class W, class Tuple, size_t... I>
void module_def(py::module_& m, const char* name, W&& w, const Tuple& extra,
                std::index_sequence<I...> /*seq*/) {
  m.def(name, std::forward<W>(w), std::get<I>(extra)...);
}

}  // namespace detail

// A pybind11 class whose def() and def_readwrite() check integer arguments (see above).
template <class T, class... Options>
class Class : public py::class_<T, Options...> {
  using Base = py::class_<T, Options...>;

 public:
  template <class... Extra>
  Class(py::handle scope, const char* name, const Extra&... extra)
      : Base(scope, name, extra...), name_(name), verb_(name) {}

  // The verb range errors of the fields bound after this name ("ibv_create_srq").
  Class& verb(const char* v) {
    verb_ = v;
    return *this;
  }

  template <class F, class... Extra>
  Class& def(const char* name, F&& f, const Extra&... extra) {
    detail::ArgNames info;
    info.verb = name_ + "::" + name;
    (detail::collect(info, extra), ...);
    info.offset = 1;  // self: the first parameter, with no py::arg
    auto wrapped = detail::wrap_callable(std::forward<F>(f), std::move(info));
    const auto rest = std::tuple_cat(detail::unless_verb(extra)...);
    def_with(name, std::move(wrapped), rest,
             std::make_index_sequence<std::tuple_size_v<std::remove_cvref_t<decltype(rest)>>>{});
    return *this;
  }
  // py::init<...>(), py::self == py::self: as pybind11 binds them.
  template <class First, class... Rest>
  requires(!std::is_convertible_v<First, const char*>) Class& def(First&& first, Rest&&... rest) {
    Base::def(std::forward<First>(first), std::forward<Rest>(rest)...);
    return *this;
  }

  template <class C, class D, class... Extra>
  Class& def_readwrite(const char* name, D C::*pm, const Extra&... extra) {
    if constexpr (kIsInt<D>) {
      const std::string verb = verb_;
      const std::string field = name;
      Base::def_property(
          name, [pm](const T& c) -> D { return c.*pm; },
          [pm, verb, field](T& c, const IntArg<D>& v) { c.*pm = int_of(v, verb, field); },
          extra...);
    } else {
      Base::def_readwrite(name, pm, extra...);
    }
    return *this;
  }
  template <class... A>
  Class& def_readonly(A&&... a) {
    Base::def_readonly(std::forward<A>(a)...);
    return *this;
  }
  template <class... A>
  Class& def_property(A&&... a) {
    Base::def_property(std::forward<A>(a)...);
    return *this;
  }
  template <class... A>
  Class& def_property_readonly(A&&... a) {
    Base::def_property_readonly(std::forward<A>(a)...);
    return *this;
  }

 private:
  template <class W, class Tuple, size_t... I>
  void def_with(const char* name, W&& w, const Tuple& extra, std::index_sequence<I...> /*seq*/) {
    Base::def(name, std::forward<W>(w), std::get<I>(extra)...);
  }

  std::string name_;
  std::string verb_;
};

// m.def with integer arguments checked (the verb: a Verb extra, else the function's name).
template <class F, class... Extra>
void def_fn(py::module_& m, const char* name, F&& f, const Extra&... extra) {
  detail::ArgNames info;
  info.verb = name;
  (detail::collect(info, extra), ...);
  auto wrapped = detail::wrap_callable(std::forward<F>(f), std::move(info));
  const auto rest = std::tuple_cat(detail::unless_verb(extra)...);
  detail::module_def(
      m, name, std::move(wrapped), rest,
      std::make_index_sequence<std::tuple_size_v<std::remove_cvref_t<decltype(rest)>>>{});
}

}  // namespace rdmalab::bindings

namespace pybind11::detail {

// Loads any Python int (or object with __index__; never a float) into an IntArg, noting
// whether it fits the C type; the binding's wrapper refuses one that does not.
template <class T>
struct type_caster<rdmalab::bindings::IntArg<T>> {
  PYBIND11_TYPE_CASTER(rdmalab::bindings::IntArg<T>, const_name("int"));

  bool load(handle src, bool /*convert*/) {
    if (!src || PyFloat_Check(src.ptr()) != 0) return false;
    object num;
    if (PyLong_Check(src.ptr()) != 0) {
      num = reinterpret_borrow<object>(src);
    } else if (PyIndex_Check(src.ptr()) != 0) {
      num = reinterpret_steal<object>(PyNumber_Index(src.ptr()));
      if (!num) {
        PyErr_Clear();
        return false;
      }
    } else {
      return false;
    }
    value = {};
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(num.ptr(), &overflow);
    if (v == -1 && PyErr_Occurred() != nullptr) {
      PyErr_Clear();
      return false;
    }
    if (overflow == 0) {
      if constexpr (std::is_signed_v<T>) {
        if (v >= static_cast<long long>(std::numeric_limits<T>::min()) &&
            v <= static_cast<long long>(std::numeric_limits<T>::max())) {
          value.value = static_cast<T>(v);
          return true;
        }
      } else {
        if (v >= 0 && static_cast<unsigned long long>(v) <= std::numeric_limits<T>::max()) {
          value.value = static_cast<T>(v);
          return true;
        }
      }
    } else if (overflow > 0 && std::is_unsigned_v<T>) {
      const unsigned long long u = PyLong_AsUnsignedLongLong(num.ptr());
      if (PyErr_Occurred() != nullptr) {
        PyErr_Clear();
      } else if (u <= std::numeric_limits<T>::max()) {
        value.value = static_cast<T>(u);
        return true;
      }
    }
    value.in_range = false;
    value.given = str(num).cast<std::string>();
    return true;
  }

  static handle cast(const rdmalab::bindings::IntArg<T>& v, return_value_policy /*policy*/,
                     handle /*parent*/) {
    return make_caster<T>::cast(v.value, return_value_policy::copy, handle());
  }
};

}  // namespace pybind11::detail
