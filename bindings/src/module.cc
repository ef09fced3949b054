// rdmalab._core: the C++ engine as a Python extension module. See bind.h for the GIL rule.
#include "bind.h"

PYBIND11_MODULE(_core, m) {
  namespace b = rdmalab::bindings;
  m.doc() = "rdmalab engine bindings (wrapping only; the Python API is the rdmalab package)";
  b::bind_errors(m);
  b::bind_callbacks(m);
  b::bind_types(m);
  b::bind_facts(m);
  b::bind_verbs(m);
  b::bind_lab(m);
  b::bind_stack(m);
  b::bind_cm(m);
  b::bind_metrics(m);
}
