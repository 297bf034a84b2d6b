//===- Module.cpp - The meshplan._meshplan extension module ---------------===//
//
// Python imports `meshplan`, whose __init__.py imports this module and
// re-exports what users call. Errors are raised as the classes of
// meshplan/errors.py, imported when first needed (that module is pure
// Python and imports nothing of this one).
//
//===----------------------------------------------------------------------===//
#include "Bindings.h"

namespace meshplan::python {

void raise(const char *kind, const std::string &message) {
  nb::object cls = nb::module_::import_("meshplan.errors").attr(kind);
  nb::object exception = cls(nb::str(message.data(), message.size()));
  PyErr_SetObject(cls.ptr(), exception.ptr());
  throw nb::python_error();
}

int64_t worldSizeOf(const plan::Plan &plan) {
  int64_t n = 1;
  for (const MeshAxis &axis : plan.mesh.axes)
    n *= axis.size;
  return n;
}

} // namespace meshplan::python

NB_MODULE(_meshplan, m) {
  m.doc() = "meshplan's planner and runtime (C++), bound with nanobind; use "
            "the `meshplan` package, which re-exports what is public.";
  // A Session left open at exit (an exception unwinding past it) is closed
  // by the runtime's destructor; nanobind's report of objects alive at
  // interpreter exit would only add noise to the user's traceback.
  nanobind::set_leak_warnings(false);
  meshplan::python::bindPlanner(m);
  meshplan::python::bindSession(m);
}
