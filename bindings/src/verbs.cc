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

void bind_objects(py::module_& m) {
  py::class_<Object, std::shared_ptr<Object>>(m, "Object")
      .def_property_readonly("id", &Object::id)
      .def_property_readonly("destroyed", py::cpp_function(&Object::destroyed, kRelease))
      .def_property_readonly("label", &Object::label);

  py::class_<Pd, Object, std::shared_ptr<Pd>>(m, "Pd").def("dealloc", &Pd::dealloc, kRelease);

  py::class_<Mr, Object, std::shared_ptr<Mr>>(m, "Mr")
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
          arg("offset"), arg("length"))
      .def(
          "write",
          [](Mr& mr, uint64_t offset, const py::bytes& data) {
            const std::string s = data;
            const std::vector<uint8_t> bytes(s.begin(), s.end());
            py::gil_scoped_release release;
            mr.write(offset, bytes);
          },
          arg("offset"), arg("data"))
      .def("dereg", &Mr::dereg, kRelease);

  py::class_<Cq, Object, std::shared_ptr<Cq>>(m, "Cq")
      .def_property_readonly("cqe", &Cq::cqe)
      .def("poll", &Cq::poll, arg("max"), kRelease)
      .def("destroy", &Cq::destroy, arg("deadline_ns"), kRelease);

  py::class_<Srq, Object, std::shared_ptr<Srq>>(m, "Srq")
      .def_property_readonly("srq_num", &Srq::srq_num)
      .def_property_readonly("is_xrc", &Srq::is_xrc)
      .def("post_recv", &Srq::post_recv, arg("wr"), kRelease)
      .def("arm_limit", &Srq::arm_limit, arg("srq_limit"), kRelease)
      .def_property_readonly("limit", py::cpp_function(&Srq::limit, kRelease))
      .def_property_readonly("outstanding", py::cpp_function(&Srq::outstanding, kRelease))
      .def("destroy", &Srq::destroy, arg("deadline_ns"), kRelease);

  py::class_<Xrcd, Object, std::shared_ptr<Xrcd>>(m, "Xrcd").def("close", &Xrcd::close, kRelease);

  py::class_<Qp, Object, std::shared_ptr<Qp>>(m, "Qp")
      .def_property_readonly("qp_num", &Qp::qp_num)
      .def_property_readonly("qp_type", &Qp::qp_type)
      .def_property_readonly("state", py::cpp_function(&Qp::state, kRelease))
      .def_property_readonly("is_open_handle", &Qp::is_open_handle)
      .def("modify", &Qp::modify, arg("attr"), arg("attr_mask"), kRelease)
      .def("query", &Qp::query, kRelease)
      .def("post_send", &Qp::post_send, arg("wr"), kRelease)
      .def("post_recv", &Qp::post_recv, arg("wr"), kRelease)
      .def("destroy", &Qp::destroy, arg("deadline_ns"), kRelease);
}

void bind_context(py::module_& m) {
  py::class_<QpInitAttr>(m, "QpInitAttr")
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
  py::class_<Context, Object, std::shared_ptr<Context>>(m, "Context")
      .def_property_readonly("caps", [](const Context& c) { return c.caps(); })
      .def("query_gid", &Context::query_gid, arg("port_num") = 1, arg("index") = 0, kRelease)
      .def("query_port", &Context::query_port, arg("port_num") = 1, kRelease)
      .def("alloc_pd", creating(&Context::alloc_pd), kRelease, child)
      .def("reg_mr", creating(&Context::reg_mr), arg("pd"), arg("length"), arg("access"), kRelease,
           child)
      .def("create_cq", creating(&Context::create_cq), arg("cqe"), kRelease, child)
      .def("create_srq", creating(&Context::create_srq), arg("pd"), arg("attr"), kRelease, child)
      .def("create_srq_xrc", creating(&Context::create_srq_xrc), arg("pd"), arg("xrcd"), arg("cq"),
           arg("attr"), kRelease, child)
      .def("open_xrcd", creating(&Context::open_xrcd), arg("path"), arg("o_creat"), arg("o_excl"),
           kRelease, child)
      .def("create_qp", creating(&Context::create_qp), arg("attr"), kRelease, child)
      .def("open_qp", creating(&Context::open_qp), arg("xrcd"), arg("qp_num"), kRelease, child)
      .def("get_async_event", &Context::get_async_event, arg("deadline_ns"), kRelease)
      .def("ack_async_event", &Context::ack_async_event, arg("event"), kRelease)
      .def("close", &Context::close, kRelease);
}

}  // namespace

void bind_verbs(py::module_& m) {
  bind_objects(m);
  bind_context(m);
}

}  // namespace rdmalab::bindings
