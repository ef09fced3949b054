// The verbs objects of verbs.h behind std::shared_ptr holders. Every call releases the GIL
// (bind.h); objects the engine hands out are wrapped so that their destructors run without
// the GIL too. keep_alive ties each object to its creator, so Python can never hold a QP
// whose context, process or lab is already gone.
#include "rdmalab/verbs.h"
#include "bind.h"

namespace rdmalab::bindings {

namespace {

using py::arg;

// Result of a creating verb: wrapped for GIL-free destruction.
template <typename T, typename... A>
auto creating(std::shared_ptr<T> (Context::*verb)(A...)) {
  return
      [verb](Context& ctx, A... a) { return gil_free_delete((ctx.*verb)(std::forward<A>(a)...)); };
}

// (id, label, host) of an Owner: plain values, which also cross to another agent's process.
py::tuple owner_tuple(const Owner& o) {
  return py::make_tuple(o.id, o.label, o.host);
}

Owner owner_of(const py::tuple& t) {
  if (t.size() != 3) throw py::value_error("an owner is (id, label, host)");
  return {nullptr, t[0].cast<uint64_t>(), t[1].cast<std::string>(), t[2].cast<std::string>()};
}

void bind_objects(py::module_& m) {
  Class<Object, std::shared_ptr<Object>>(m, "Object")
      .def_property_readonly("id", &Object::id)
      .def_property_readonly("destroyed", py::cpp_function(&Object::destroyed, kRelease))
      .def_property_readonly("label", &Object::label)
      // (id, label, host) of the context or channel it was made through (verbs.h Owner).
      .def_property_readonly("owner", [](const Object& o) { return owner_tuple(o.owner()); });

  // check_owner (verbs.h): the one error for an object used through another context, channel
  // or host, for the Python entry points that pass only ids to the engine.
  def_fn(
      m, "check_owner",
      [](const Object& through, const Object& obj, const std::string& verb,
         const std::string& kind) { check_owner(through, obj, verb, kind); },
      arg("through"), arg("obj"), arg("verb"), arg("kind"));
  // The same error for an object the engine cannot see (a proxy of another agent's object):
  // of and where as (id, label, host) tuples.
  def_fn(
      m, "raise_foreign_object",
      [](const std::string& verb, const std::string& kind, const std::string& label,
         const py::tuple& of, const py::tuple& where) {
        throw foreign_object_error(verb, kind, label, owner_of(of), owner_of(where));
      },
      arg("verb"), arg("kind"), arg("label"), arg("of"), arg("where"));

  Class<Pd, Object, std::shared_ptr<Pd>>(m, "Pd").def("dealloc", &Pd::dealloc, kRelease,
                                                      Verb{"ibv_dealloc_pd"});

  Class<Mr, Object, std::shared_ptr<Mr>>(m, "Mr")
      .def_property_readonly("lkey", &Mr::lkey)
      .def_property_readonly("rkey", &Mr::rkey)
      .def_property_readonly("addr", &Mr::addr)
      .def_property_readonly("length", &Mr::length)
      .def(
          "read",
          [](const Mr& mr, uint64_t offset, uint64_t len) {
            std::vector<uint8_t> bytes;
            {
              py::gil_scoped_release release;
              bytes = mr.read(offset, len);
            }
            return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
          },
          arg("offset"), arg("length"), Verb{"mr_read"})
      .def(
          "write",
          [](Mr& mr, uint64_t offset, const py::bytes& data) {
            const std::string s = data;
            const std::vector<uint8_t> bytes(s.begin(), s.end());
            py::gil_scoped_release release;
            mr.write(offset, bytes);
          },
          arg("offset"), arg("data"), Verb{"mr_write"})
      .def("dereg", &Mr::dereg, kRelease);

  Class<Cq, Object, std::shared_ptr<Cq>>(m, "Cq")
      .def_property_readonly("cqe", &Cq::cqe)
      .def("poll", &Cq::poll, arg("max"), kRelease, Verb{"ibv_poll_cq"})
      .def("destroy", &Cq::destroy, arg("deadline_ns"), kRelease, Verb{"ibv_destroy_cq"});

  Class<Srq, Object, std::shared_ptr<Srq>>(m, "Srq")
      .def_property_readonly("srq_num", &Srq::srq_num)
      .def_property_readonly("is_xrc", &Srq::is_xrc)
      .def("post_recv", &Srq::post_recv, arg("wr"), kRelease, Verb{"ibv_post_srq_recv"})
      .def("arm_limit", &Srq::arm_limit, arg("srq_limit"), kRelease, Verb{"ibv_modify_srq"})
      .def_property_readonly("limit", py::cpp_function(&Srq::limit, kRelease))
      .def_property_readonly("outstanding", py::cpp_function(&Srq::outstanding, kRelease))
      .def("destroy", &Srq::destroy, arg("deadline_ns"), kRelease, Verb{"ibv_destroy_srq"});

  Class<Xrcd, Object, std::shared_ptr<Xrcd>>(m, "Xrcd").def("close", &Xrcd::close, kRelease);

  Class<Qp, Object, std::shared_ptr<Qp>>(m, "Qp")
      .def_property_readonly("qp_num", &Qp::qp_num)
      .def_property_readonly("qp_type", &Qp::qp_type)
      .def_property_readonly("state", py::cpp_function(&Qp::state, kRelease))
      .def_property_readonly("is_open_handle", &Qp::is_open_handle)
      .def("modify", &Qp::modify, arg("attr"), arg("attr_mask"), kRelease, Verb{"ibv_modify_qp"})
      .def("query", &Qp::query, kRelease)
      .def("post_send", &Qp::post_send, arg("wr"), kRelease)
      .def("post_recv", &Qp::post_recv, arg("wr"), kRelease)
      .def("destroy", &Qp::destroy, arg("deadline_ns"), kRelease, Verb{"ibv_destroy_qp"});
}

void bind_context(py::module_& m) {
  Class<QpInitAttr>(m, "QpInitAttr")
      .def(py::init<>())
      .def_readwrite("qp_type", &QpInitAttr::qp_type)
      .def_readwrite("pd", &QpInitAttr::pd)
      .def_readwrite("send_cq", &QpInitAttr::send_cq)
      .def_readwrite("recv_cq", &QpInitAttr::recv_cq)
      .def_readwrite("srq", &QpInitAttr::srq)
      .def_readwrite("xrcd", &QpInitAttr::xrcd)
      .def_readwrite("cap", &QpInitAttr::cap)
      .def_readwrite("sq_sig_all", &QpInitAttr::sq_sig_all);

  const auto child = py::keep_alive<0, 1>();  // the created object keeps its context alive
  Class<Context, Object, std::shared_ptr<Context>>(m, "Context")
      .def_property_readonly("caps", [](const Context& c) { return c.caps(); })
      .def("query_gid", &Context::query_gid, arg("port_num") = 1, arg("index") = 0, kRelease,
           Verb{"ibv_query_gid"})
      .def("query_port", &Context::query_port, arg("port_num") = 1, kRelease,
           Verb{"ibv_query_port"})
      .def("alloc_pd", creating(&Context::alloc_pd), kRelease, child)
      .def("reg_mr", creating(&Context::reg_mr), arg("pd"), arg("length"), arg("access"), kRelease,
           child, Verb{"ibv_reg_mr"})
      .def("create_cq", creating(&Context::create_cq), arg("cqe"), kRelease, child,
           Verb{"ibv_create_cq"})
      .def("create_srq", creating(&Context::create_srq), arg("pd"), arg("attr"), kRelease, child)
      .def("create_srq_xrc", creating(&Context::create_srq_xrc), arg("pd"), arg("xrcd"), arg("cq"),
           arg("attr"), kRelease, child)
      .def("open_xrcd", creating(&Context::open_xrcd), arg("path"), arg("o_creat"), arg("o_excl"),
           kRelease, child)
      .def("create_qp", creating(&Context::create_qp), arg("attr"), kRelease, child)
      .def("open_qp", creating(&Context::open_qp), arg("xrcd"), arg("qp_num"), kRelease, child,
           Verb{"ibv_open_qp"})
      .def("get_async_event", &Context::get_async_event, arg("deadline_ns"), kRelease,
           Verb{"ibv_get_async_event"})
      .def("ack_async_event", &Context::ack_async_event, arg("event"), kRelease)
      .def("close", &Context::close, kRelease);
}

}  // namespace

void bind_verbs(py::module_& m) {
  bind_objects(m);
  bind_context(m);
}

}  // namespace rdmalab::bindings
