//===- Session.cpp - meshplan.Session: the runtime from Python ------------===//
//
// One rank's runtime::Session. Buffers reach Python as views (meshplan.Tensor)
// whose numpy arrays and torch tensors share the runtime's memory, with the
// Python Session object as their owner: an array keeps the session's memory
// alive, so it never reads freed memory; the view object itself raises once
// its session is closed, and a compute call's views raise once the call has
// returned (the runtime may free or reuse a gathered buffer after it).
//
// The GIL: step(), checkpoints and close() release it while the executor
// runs; a stream's thread takes it only to call a Python callback. A Python
// exception in a callback fails the instruction (the runtime's error names
// the rank and the instruction), ends the step, and step() re-raises that
// same exception on this rank with the runtime's message as a note.
//
//===----------------------------------------------------------------------===//
#include "Bindings.h"

#include "meshplan/Runtime/LauncherEnvironment.h"
#include "meshplan/Runtime/Session.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

namespace fs = std::filesystem;
using namespace meshplan;
using namespace meshplan::python;
using runtime::TensorView;

namespace {

struct SessionObject {
  std::unique_ptr<runtime::Session> session;
  PlanObject plan;
  /// The Python callables the runtime's callbacks call (kept alive here).
  std::vector<nb::object> callables;
  /// The first exception a Python callback raised in the current step or
  /// init_parameters; touched with the GIL held.
  nb::object pendingError;
  bool closed = false;
  /// A store directory this object made (one-rank plans without a store).
  std::string ownedStore;

  void ensureOpen() const {
    if (closed)
      raise("ClosedError", "rank " + std::to_string(plan.plan->rank) +
                               ": the session is closed");
  }
  /// Leaves the communicators (Session::close). While an exception unwinds
  /// past the session, a failure to close is not raised over it.
  void close(bool unwinding) {
    if (closed)
      return;
    closed = true;
    Result<void> ok;
    {
      nb::gil_scoped_release release;
      ok = session->close();
    }
    if (!unwinding)
      check("SessionError", ok);
  }
  /// Keeps the first exception of a step; later ones are consequences.
  void record(nb::handle exception) {
    if (!pendingError.is_valid())
      pendingError = nb::borrow(exception);
  }
  /// Raises the recorded exception, with the runtime's message as a note,
  /// when there is one; else `kind` with the runtime's error.
  [[noreturn]] void raiseFailure(const char *kind, const Error &error) {
    nb::object pending = std::move(pendingError);
    pendingError = nb::object();
    if (!pending.is_valid())
      raise(kind, error);
    nb::object note = nb::str(("meshplan: " + error.message).c_str());
    if (nb::hasattr(pending, "add_note"))
      pending.attr("add_note")(note);
    PyObject *traceback = PyException_GetTraceback(pending.ptr());
    PyObject *type = reinterpret_cast<PyObject *>(Py_TYPE(pending.ptr()));
    Py_INCREF(type);
    PyErr_Restore(type, pending.release().ptr(), traceback);
    throw nb::python_error();
  }
  ~SessionObject() {
    // A session dropped without close(): the runtime's destructor closes it
    // (a barrier on its communicators); let other threads run meanwhile.
    if (session) {
      nb::gil_scoped_release release;
      session.reset();
    }
    if (!ownedStore.empty()) {
      std::error_code ec;
      fs::remove_all(ownedStore, ec);
    }
  }
};

/// Whether a call's views may still be used: false once it returned.
using Scope = std::shared_ptr<bool>;

/// meshplan.Tensor: one runtime buffer's bytes and its place in the tensor.
struct TensorObject {
  TensorView view;
  nb::object owner; ///< the Python Session object
  SessionObject *session = nullptr;
  Scope scope; ///< set for a compute call's views

  void check() const {
    if (session->closed)
      raise("ClosedError", "view of \"" + view.id() + "\": its session (rank " +
                               std::to_string(session->plan.plan->rank) +
                               ") is closed");
    if (scope && !*scope)
      raise("ClosedError", "view of \"" + view.id() +
                               "\": its compute call has returned (a call's "
                               "views are valid during the call only)");
  }
};

/// meshplan.ComputeCall: one compute instruction, as the callback sees it.
struct CallObject {
  runtime::ComputeCall *call = nullptr;
  nb::object owner;
  SessionObject *session = nullptr;
  Scope scope;
  nb::object params, grads; ///< lists of Tensor, made on first use

  void check() const {
    if (!*scope)
      raise("ClosedError", "compute call used after it returned");
  }
  nb::object views(bool gradients) {
    check();
    nb::object &cached = gradients ? grads : params;
    if (!cached.is_valid()) {
      nb::list out;
      for (const TensorView &v : gradients ? call->grads : call->params)
        out.append(nb::cast(TensorObject{v, owner, session, scope}));
      cached = out;
    }
    return cached;
  }
};

/// DLPack's type of a buffer dtype; `raw` gives an integer of the same width
/// for those numpy lacks (bfloat16, float8), which torch() reinterprets.
nb::dlpack::dtype dlpackType(plan::DType dtype, bool raw) {
  using plan::DType;
  using Code = nb::dlpack::dtype_code;
  auto of = [](Code code, int bits) {
    return nb::dlpack::dtype{uint8_t(code), uint8_t(bits), 1};
  };
  switch (dtype) {
  case DType::Float32:
    return of(Code::Float, 32);
  case DType::Float64:
    return of(Code::Float, 64);
  case DType::Float16:
    return of(Code::Float, 16);
  case DType::BFloat16:
    return raw ? of(Code::UInt, 16) : of(Code::Bfloat, 16);
  case DType::Float8E4M3:
    return raw ? of(Code::UInt, 8) : of(Code::Float8_E4M3FN, 8);
  case DType::Float8E5M2:
    return raw ? of(Code::UInt, 8) : of(Code::Float8_E5M2, 8);
  case DType::Int8:
    return of(Code::Int, 8);
  case DType::UInt8:
    return of(Code::UInt, 8);
  case DType::Int32:
    return of(Code::Int, 32);
  case DType::Int64:
    return of(Code::Int, 64);
  }
  return of(Code::UInt, 8);
}

bool numpyHas(plan::DType dtype) {
  return dtype != plan::DType::BFloat16 && dtype != plan::DType::Float8E4M3 &&
         dtype != plan::DType::Float8E5M2;
}

/// A numpy array over the view's bytes (raw: integers of the same width for
/// the dtypes numpy lacks), owned by the session object.
nb::object numpyArray(const TensorObject &t, bool raw) {
  t.check();
  if (t.view.onDevice)
    raise("Error", "view of \"" + t.view.id() +
                       "\": device memory (use the session's device API)");
  if (!raw && !numpyHas(t.view.dtype()))
    raise("ViewError",
          "view of \"" + t.view.id() + "\": numpy has no " +
              std::string(plan::dtypeName(t.view.dtype())) +
              "; use .torch() (or .numpy(raw=True) for the bit patterns)");
  std::vector<size_t> shape(t.view.localShape().begin(),
                            t.view.localShape().end());
  nb::ndarray<nb::numpy> array(
      t.view.bytes.data(), shape.size(), shape.data(), t.owner, nullptr,
      dlpackType(t.view.dtype(), raw || !numpyHas(t.view.dtype())));
  return array.cast();
}

/// A torch tensor over the view's bytes: DLPack from the numpy array, then
/// reinterpreted as bfloat16 / float8 where numpy has no such type.
nb::object torchTensor(const TensorObject &t) {
  nb::object torch = nb::module_::import_("torch");
  nb::object tensor = torch.attr("from_dlpack")(numpyArray(t, /*raw=*/true));
  switch (t.view.dtype()) {
  case plan::DType::BFloat16:
    return tensor.attr("view")(torch.attr("bfloat16"));
  case plan::DType::Float8E4M3:
    return tensor.attr("view")(torch.attr("float8_e4m3fn"));
  case plan::DType::Float8E5M2:
    return tensor.attr("view")(torch.attr("float8_e5m2"));
  default:
    return tensor;
  }
}

/// Tensor.copy_(src): src's elements into the buffer, same shape and dtype.
void copyFrom(const TensorObject &t,
              nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu> src) {
  t.check();
  const std::vector<int64_t> &shape = t.view.localShape();
  bool sameShape = src.ndim() == shape.size();
  for (size_t d = 0; sameShape && d < shape.size(); ++d)
    sameShape = int64_t(src.shape(d)) == shape[d];
  auto text = [](auto &&dims, size_t n) {
    std::string s = "(";
    for (size_t d = 0; d < n; ++d)
      s += (d ? ", " : "") + std::to_string(dims(d));
    return s + (n == 1 ? ",)" : ")");
  };
  if (!sameShape)
    raise(
        "ViewError",
        "\"" + t.view.id() + "\": expected shape " +
            text([&](size_t d) { return shape[d]; }, shape.size()) + ", got " +
            text([&](size_t d) { return int64_t(src.shape(d)); }, src.ndim()));
  nb::dlpack::dtype want = dlpackType(t.view.dtype(), false);
  nb::dlpack::dtype wantRaw = dlpackType(t.view.dtype(), true);
  if (src.dtype() != want && src.dtype() != wantRaw)
    raise("ViewError", "\"" + t.view.id() + "\": expected dtype " +
                           std::string(plan::dtypeName(t.view.dtype())) +
                           ", got a DLPack type of code " +
                           std::to_string(int(src.dtype().code)) + " and " +
                           std::to_string(int(src.dtype().bits)) + " bits");
  if (src.nbytes() != t.view.bytes.size())
    raise("ViewError", "\"" + t.view.id() + "\": size mismatch");
  if (src.nbytes())
    std::memcpy(t.view.bytes.data(), src.data(), src.nbytes());
}

/// The exception's "Type: message", for the runtime's error text.
std::string describeException(nb::handle exception) {
  std::string type = nb::type_name(exception.type()).c_str();
  std::string text = nb::str(exception).c_str();
  return text.empty() ? type : type + ": " + text;
}

/// A runtime callback that calls a Python callable with the GIL held.
runtime::ComputeCallback computeCallback(SessionObject *self,
                                         nb::object callable) {
  PyObject *fn = callable.ptr();
  self->callables.push_back(std::move(callable));
  return [self, fn](runtime::ComputeCall &call) -> Result<void> {
    nb::gil_scoped_acquire gil;
    Scope scope = std::make_shared<bool>(true);
    try {
      nb::object owner = nb::find(self);
      nb::object pyCall =
          nb::cast(CallObject{&call, owner, self, scope, {}, {}});
      nb::handle callable(fn);
      callable(pyCall);
      *scope = false;
      return {};
    } catch (nb::python_error &e) {
      *scope = false;
      std::string what = describeException(e.value());
      self->record(e.value());
      return makeError("raised " + what);
    } catch (const std::exception &e) {
      *scope = false;
      return makeError(std::string("raised ") + e.what());
    }
  };
}

std::shared_ptr<const plan::Plan> planOfArgument(nb::handle planOrPath,
                                                 std::optional<int64_t> rank) {
  if (nb::isinstance<PlanObject>(planOrPath))
    return nb::cast<const PlanObject &>(planOrPath).plan;
  std::string path =
      nb::str(nb::module_::import_("os").attr("fspath")(planOrPath)).c_str();
  if (fs::is_directory(path)) {
    // A plan directory: this rank's file in it.
    int64_t r = rank ? *rank : 0;
    if (!rank)
      if (const char *env = std::getenv("RANK"))
        r = std::atoll(env);
    path = (fs::path(path) / ("rank" + std::to_string(r) + ".json")).string();
  }
  Result<plan::Plan> read = makeError("");
  {
    nb::gil_scoped_release release;
    read = plan::readPlanFile(path);
  }
  if (!read)
    raise("PlanError", read.error());
  return std::make_shared<const plan::Plan>(std::move(*read));
}

void openSession(SessionObject *self, nb::handle planOrPath,
                 std::optional<int64_t> rank, std::optional<int64_t> worldSize,
                 std::optional<std::string> store, double timeout,
                 std::optional<std::string> job,
                 std::optional<std::string> reductionOrder,
                 std::optional<std::string> trace,
                 std::optional<std::pair<int64_t, int64_t>> traceSteps) {
  std::shared_ptr<const plan::Plan> plan = planOfArgument(planOrPath, rank);
  int64_t world = worldSizeOf(*plan);
  runtime::SessionOptions options;
  std::string ownedStore;
  if (store) {
    auto parsed = runtime::parseStoreAddress(*store);
    if (!parsed)
      raise("StoreError", parsed.error().within("store"));
    options.store = *parsed;
    options.rank = rank ? *rank : plan->rank;
    options.worldSize = worldSize ? *worldSize : world;
  } else if (runtime::launcherEnvironmentPresent()) {
    // `meshplan run`, torchrun or srun started this process
    // (LauncherEnvironment.h).
    options = take("StoreError", runtime::sessionOptionsFromEnv());
    if (rank)
      options.rank = *rank;
    if (worldSize)
      options.worldSize = *worldSize;
  } else if (world == 1) {
    // One rank needs no peers: a private store directory.
    std::string tmpl =
        (fs::temp_directory_path() / "meshplan-store-XXXXXX").string();
    if (!mkdtemp(tmpl.data()))
      raise("StoreError", "cannot make a store directory in " +
                              fs::temp_directory_path().string());
    ownedStore = tmpl;
    options.store.kind = runtime::StoreAddress::Kind::File;
    options.store.path = ownedStore;
    options.rank = 0;
  } else {
    raise("StoreError",
          "store: MESHPLAN_STORE is not set and the plan has " +
              std::to_string(world) +
              " ranks; pass store=\"file:DIR\" or \"redis://HOST:PORT\" "
              "with rank=, or launch with `meshplan run` (which sets RANK, "
              "WORLD_SIZE and MESHPLAN_STORE)");
  }
  if (!(timeout > 0))
    raise("SessionError", "timeout: must be > 0 seconds");
  options.timeout = std::chrono::milliseconds(int64_t(timeout * 1000.0));
  if (job)
    options.job = *job;
  if (reductionOrder) {
    if (*reductionOrder != "key" && *reductionOrder != "gloo")
      raise("SessionError", "reduction_order: expected \"key\" or \"gloo\", "
                            "not \"" +
                                *reductionOrder + "\"");
    options.keyOrderReductions = *reductionOrder == "key";
  }
  if (traceSteps && !trace)
    raise("SessionError", "trace_steps: needs trace=DIR (where to write)");
  if (trace) {
    if (trace->empty())
      raise("SessionError", "trace: expected a directory");
    runtime::StepTraceOptions t;
    t.dir = *trace;
    if (traceSteps) {
      if (traceSteps->first < 1 || traceSteps->second < traceSteps->first)
        raise("SessionError",
              "trace_steps: expected (first, last) with 1 <= first <= last, "
              "got (" +
                  std::to_string(traceSteps->first) + ", " +
                  std::to_string(traceSteps->second) + ")");
      t.firstStep = traceSteps->first;
      t.lastStep = traceSteps->second;
    }
    options.trace = t;
  }
  Result<std::unique_ptr<runtime::Session>> opened = makeError("");
  {
    nb::gil_scoped_release release;
    opened = runtime::Session::open(*plan, options);
  }
  if (!opened) {
    std::error_code ec;
    if (!ownedStore.empty())
      fs::remove_all(ownedStore, ec);
    raise("SessionError", opened.error());
  }
  new (self) SessionObject();
  self->session = std::move(*opened);
  self->plan = PlanObject{std::move(plan), nullptr};
  if (nb::isinstance<PlanObject>(planOrPath))
    self->plan = nb::cast<const PlanObject &>(planOrPath);
  self->ownedStore = std::move(ownedStore);
}

nb::list viewList(SessionObject &s, std::vector<TensorView> views) {
  s.ensureOpen();
  nb::object owner = nb::find(&s);
  nb::list out;
  for (TensorView &v : views)
    out.append(nb::cast(TensorObject{std::move(v), owner, &s, nullptr}));
  return out;
}

nb::dict profileDict(const runtime::StepProfile &p) {
  nb::dict d;
  d["wall"] = p.wall;
  d["callbacks"] = p.callbacks;
  d["kernels"] = p.kernels;
  d["collectives"] = p.collectives;
  d["exposed_collectives"] = p.exposedCollectives;
  d["overhead"] = p.overhead;
  d["needless_wakeups"] = p.needlessWakeups;
  d["instruction_start"] = nb::cast(p.instructionStart);
  d["instruction_end"] = nb::cast(p.instructionEnd);
  d["instruction_ready"] = nb::cast(p.instructionReady);
  // Gradient clipping (optimizer.max_norm): None when the step had none.
  d["grad_norm"] = p.gradNorm ? nb::cast(*p.gradNorm) : nb::none();
  d["clip_coefficient"] = p.clipCoefficient;
  d["update_skipped"] = p.updateSkipped;
  return d;
}

} // namespace

// Long because: the binding table of the session API, one nanobind def per
// method or property with its docstring; the work is in the helpers above.
void meshplan::python::bindSession(nb::module_ &m) {
  nb::class_<TensorObject>(
      m, "Tensor",
      "A view of one runtime buffer: its local shard of a tensor, with the "
      "shard's place in it. numpy()/torch() share the runtime's memory.")
      .def_prop_ro("id", [](const TensorObject &t) { return t.view.id(); })
      .def_prop_ro(
          "tensor", [](const TensorObject &t) { return t.view.tensor(); },
          "The model tensor this buffer holds a version of.")
      .def_prop_ro("kind",
                   [](const TensorObject &t) {
                     return std::string(
                         plan::bufferKindName(t.view.buffer->kind));
                   })
      .def_prop_ro("dtype",
                   [](const TensorObject &t) {
                     return std::string(plan::dtypeName(t.view.dtype()));
                   })
      .def_prop_ro("global_shape",
                   [](const TensorObject &t) { return t.view.globalShape(); })
      .def_prop_ro("local_shape",
                   [](const TensorObject &t) { return t.view.localShape(); })
      .def_prop_ro(
          "offset", [](const TensorObject &t) { return t.view.offset(); },
          "Where the local shard starts in the global tensor.")
      .def_prop_ro("nbytes",
                   [](const TensorObject &t) { return t.view.bytes.size(); })
      .def_prop_ro(
          "scale", [](const TensorObject &t) { return t.view.scale; },
          "float8 buffers: the tensorwise scale (value = stored / "
          "scale); None otherwise.")
      .def("numpy", &numpyArray, nb::arg("raw") = false,
           "A numpy array over the buffer (no copy). raw=True: the bit "
           "patterns (uint16/uint8) of bfloat16 and float8 buffers.")
      .def("torch", &torchTensor, "A torch tensor over the buffer (no copy).")
      .def("copy_", &copyFrom, nb::arg("src"),
           "Copies an array of the buffer's shape and dtype into it.")
      .def(
          "__array__",
          [](const TensorObject &t, nb::handle dtype, nb::handle copy) {
            nb::object a = numpyArray(t, false);
            if (!dtype.is_none())
              a = a.attr("astype")(dtype);
            else if (!copy.is_none() && PyObject_IsTrue(copy.ptr()) == 1)
              a = a.attr("copy")();
            return a;
          },
          nb::arg("dtype") = nb::none(), nb::arg("copy") = nb::none())
      .def("__repr__", [](const TensorObject &t) {
        std::string shape;
        for (int64_t d : t.view.localShape())
          shape += (shape.empty() ? "" : ", ") + std::to_string(d);
        return "<meshplan.Tensor " + t.view.id() + " " +
               std::string(plan::dtypeName(t.view.dtype())) + "[" + shape +
               "]>";
      });

  nb::class_<CallObject>(m, "ComputeCall",
                         "One compute instruction: run the forward or "
                         "backward of a unit on the given views.")
      .def_prop_ro("phase",
                   [](const CallObject &c) {
                     c.check();
                     return c.call->phase;
                   })
      .def_prop_ro("unit",
                   [](const CallObject &c) {
                     c.check();
                     return c.call->unit;
                   })
      .def_prop_ro("microbatch",
                   [](const CallObject &c) {
                     c.check();
                     return c.call->microbatch;
                   })
      .def_prop_ro("step",
                   [](const CallObject &c) {
                     c.check();
                     return c.call->step;
                   })
      .def_prop_ro("shares",
                   [](const CallObject &c) {
                     c.check();
                     return c.call->shares;
                   })
      .def_prop_ro(
          "params", [](CallObject &c) { return c.views(false); },
          "The parameters (gathered, or local shards) it reads, in plan "
          "order.")
      .def_prop_ro(
          "grads", [](CallObject &c) { return c.views(true); },
          "backward: the gradients it ADDS its contribution to (they hold "
          "the earlier microbatches' sum).")
      .def("__repr__", [](const CallObject &c) {
        if (!*c.scope)
          return std::string("<meshplan.ComputeCall (returned)>");
        return "<meshplan.ComputeCall " + c.call->phase + " " + c.call->unit +
               " microbatch " + std::to_string(c.call->microbatch) + " step " +
               std::to_string(c.call->step) + ">";
      });

  nb::class_<SessionObject>(
      m, "Session",
      "One rank running its plan (runtime::Session): parameter shards, "
      "gradients and optimizer state sized from the plan; compute callbacks "
      "in Python; step(), checkpoints, the step profile.")
      .def("__init__", &openSession, nb::arg("plan"), nb::kw_only(),
           nb::arg("rank") = nb::none(), nb::arg("world_size") = nb::none(),
           nb::arg("store") = nb::none(), nb::arg("timeout") = 60.0,
           nb::arg("job") = nb::none(), nb::arg("reduction_order") = nb::none(),
           nb::arg("trace") = nb::none(), nb::arg("trace_steps") = nb::none(),
           "Opens `plan` (a meshplan.Plan, a plan file, or a plan directory). "
           "Without store=, the environment `meshplan run` / torchrun sets "
           "(RANK, WORLD_SIZE, MESHPLAN_STORE, MESHPLAN_TIMEOUT, ...); a "
           "one-rank plan without either gets a private store. trace=DIR "
           "records what steps trace_steps=(first, last) (default: all) did "
           "into DIR/rank<R>.json (`meshplan trace --merge DIR`; "
           "docs/observability.md).")
      .def(
          "on_compute",
          [](SessionObject &s, nb::object fn, std::optional<std::string> phase,
             std::optional<std::string> unit) {
            s.ensureOpen();
            if (!PyCallable_Check(fn.ptr()))
              raise("SessionError", "on_compute: expected a callable");
            if (phase.has_value() != unit.has_value())
              raise("SessionError",
                    "on_compute: give both phase and unit, or neither");
            if (phase)
              s.session->onCompute(*phase, *unit,
                                   computeCallback(&s, std::move(fn)));
            else
              s.session->onCompute(computeCallback(&s, std::move(fn)));
          },
          nb::arg("fn"), nb::arg("phase") = nb::none(),
          nb::arg("unit") = nb::none(),
          "Registers fn(call: ComputeCall) for the compute instructions of "
          "(phase, unit), or for every one without a more specific callback.")
      .def(
          "init_parameters",
          [](SessionObject &s, nb::object fn) {
            s.ensureOpen();
            nb::object owner = nb::find(&s);
            Result<void> ok =
                s.session->initParameters([&](TensorView &v) -> Result<void> {
                  try {
                    fn(nb::cast(TensorObject{v, owner, &s, nullptr}));
                    return {};
                  } catch (nb::python_error &e) {
                    std::string what = describeException(e.value());
                    s.record(e.value());
                    return makeError("\"" + v.id() + "\": raised " + what);
                  }
                });
            if (!ok)
              s.raiseFailure("SessionError", ok.error());
          },
          nb::arg("fn"),
          "Calls fn(view) for every parameter shard, to fill it (its "
          "global box: view.offset, view.local_shape).")
      .def(
          "step",
          [](SessionObject &s) {
            s.ensureOpen();
            Result<void> ok;
            {
              nb::gil_scoped_release release;
              ok = s.session->step();
            }
            if (!ok)
              s.raiseFailure("StepError", ok.error());
            s.pendingError = nb::object();
          },
          "Runs one training step (the GIL is released while it runs).")
      .def("parameters",
           [](SessionObject &s) {
             s.ensureOpen();
             return viewList(s, s.session->parameters());
           })
      .def("optimizer_state",
           [](SessionObject &s) {
             s.ensureOpen();
             return viewList(s, s.session->optimizerState());
           })
      .def(
          "tensor",
          [](SessionObject &s, const std::string &id) {
            s.ensureOpen();
            TensorView v = take("SessionError", s.session->tensor(id));
            return TensorObject{v, nb::find(&s), &s, nullptr};
          },
          nb::arg("id"),
          "A persistent buffer (parameter shard, optimizer "
          "state) by its plan id.")
      .def(
          "save_checkpoint",
          [](SessionObject &s, const std::string &dir, const std::string &model,
             const std::string &spec, const std::string &mesh) {
            s.ensureOpen();
            ckpt::CheckpointInfo info;
            info.model.name = model;
            info.spec.name = spec;
            info.mesh = mesh;
            info.generator = "meshplan python 0.1.0";
            Result<void> ok;
            {
              nb::gil_scoped_release release;
              ok = s.session->saveCheckpoint(dir, info);
            }
            check("CheckpointError", ok);
          },
          nb::arg("dir"), nb::kw_only(), nb::arg("model") = "",
          nb::arg("spec") = "", nb::arg("mesh") = "",
          "Saves every parameter shard and optimizer state (collective: "
          "every rank calls it); the directory appears complete or not at "
          "all.")
      .def(
          "load_checkpoint",
          [](SessionObject &s, const std::string &dir, bool dtypeCast,
             bool resetOptimizerState) {
            s.ensureOpen();
            Result<ckpt::TrainingState> state = makeError("");
            ckpt::LoadOptions options;
            options.dtypeCast = dtypeCast;
            options.resetOptimizerState = resetOptimizerState;
            {
              nb::gil_scoped_release release;
              state = s.session->loadCheckpoint(dir, options);
            }
            ckpt::TrainingState t = take("CheckpointError", std::move(state));
            nb::dict d;
            d["step"] = t.step;
            d["seed"] = t.seed;
            d["stochastic_rounding"] = t.stochasticRounding;
            return d;
          },
          nb::arg("dir"), nb::kw_only(), nb::arg("dtype_cast") = false,
          nb::arg("reset_optimizer_state") = false,
          "Loads this rank's boxes from a checkpoint of any layout "
          "(dtype_cast: convert float32/bfloat16/float16 tensors stored in "
          "another dtype than the plan's; reset_optimizer_state: start the "
          "optimizer state at zero, step 0); nothing "
          "changes unless all load. Returns the training state "
          "(resume_after(state['step']) continues the run).")
      .def(
          "resume_after",
          [](SessionObject &s, int64_t steps) {
            s.ensureOpen();
            check("SessionError", s.session->resumeAfter(steps));
          },
          nb::arg("steps"))
      .def_prop_ro("steps_done",
                   [](const SessionObject &s) {
                     s.ensureOpen();
                     return s.session->stepsDone();
                   })
      .def_prop_ro(
          "lr",
          [](const SessionObject &s) {
            s.ensureOpen();
            return s.session->lr();
          },
          "The learning rate the next step() runs with: set_lr's, else the "
          "plan's lr_schedule; None without optimizer.")
      .def(
          "set_lr",
          [](SessionObject &s, std::optional<double> lr) {
            s.ensureOpen();
            check("SessionError", s.session->setLr(lr));
          },
          nb::arg("lr").none(),
          "Sets the rate of every later step (every rank the same), "
          "overriding the plan's schedule; None returns to the schedule.")
      .def_prop_ro("rank",
                   [](const SessionObject &s) { return s.plan.plan->rank; })
      .def_prop_ro("plan", [](const SessionObject &s) { return s.plan; })
      .def_prop_ro("closed", [](const SessionObject &s) { return s.closed; })
      .def_prop_ro(
          "profile",
          [](const SessionObject &s) {
            s.ensureOpen();
            return profileDict(s.session->lastStepProfile());
          },
          "Where the last step's time went, in seconds (StepProfile).")
      .def_prop_ro(
          "fault_tolerance",
          [](const SessionObject &s) -> nb::object {
            s.ensureOpen();
            auto ft = s.session->faultTolerance();
            if (!ft)
              return nb::none();
            nb::dict d;
            d["epoch"] = ft->epoch;
            d["live_groups"] = nb::cast(ft->liveGroups);
            d["num_groups"] = ft->numGroups;
            d["group"] = ft->group;
            d["data_ranks"] = nb::cast(ft->dataRanks);
            d["steps_discarded"] = ft->stepsDiscarded;
            d["heals"] = ft->heals;
            return d;
          },
          "Fault-tolerant sessions: epoch, live groups, this step's data "
          "ranks; None otherwise.")
      .def(
          "trainer_all_reduce",
          [](SessionObject &s, const std::string &comm,
             nb::ndarray<float, nb::c_contig, nb::device::cpu> data,
             const std::string &op) {
            s.ensureOpen();
            ReduceOp reduce;
            if (op == "avg")
              reduce = ReduceOp::Avg;
            else if (op == "sum")
              reduce = ReduceOp::Sum;
            else if (op == "max")
              reduce = ReduceOp::Max;
            else
              raise("SessionError", "trainer_all_reduce: op \"" + op +
                                        "\" is none of avg, sum, max");
            Result<void> done = makeError("");
            {
              nb::gil_scoped_release release;
              auto c = s.session->trainerCommunicator(comm);
              if (!c)
                done = c.error();
              else if ((*c)->memoryKind() != runtime::MemoryKind::Host)
                done = makeError("trainer_all_reduce: communicator \"" + comm +
                                 "\" is on a device; it takes host arrays "
                                 "only");
              else
                done = (*c)->allReduce(data.data(), int64_t(data.size()),
                                       plan::DType::Float32, reduce);
            }
            if (!done)
              raise("StepError", done.error());
          },
          nb::arg("comm"), nb::arg("data"), nb::arg("op") = "avg",
          "In place over a float32 host array: a collective of the "
          "trainer's own on a communicator the plan declares for it (the "
          "`trainer_<axis>` ones: the extra axes' gradient averages, a "
          "loss). Every member must call it, in the same order; from a "
          "compute callback or between steps.")
      .def("created_communicators",
           [](const SessionObject &s) {
             s.ensureOpen();
             return s.session->createdCommunicators();
           })
      .def(
          "close", [](SessionObject &s) { s.close(/*unwinding=*/false); },
          "Leaves every communicator (a barrier on each); idempotent. Views "
          "raise afterwards.")
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def(
          "__exit__",
          [](SessionObject &s, nb::handle type, nb::handle, nb::handle) {
            s.close(/*unwinding=*/!type.is_none());
          },
          nb::arg("type").none(), nb::arg("value").none(),
          nb::arg("traceback").none())
      .def("__repr__", [](const SessionObject &s) {
        return "<meshplan.Session rank " + std::to_string(s.plan.plan->rank) +
               " of " + std::to_string(worldSizeOf(*s.plan.plan)) +
               (s.closed ? ", closed>" : ">");
      });

  m.def(
      "_bench_steps_cpp",
      [](SessionObject &s, int steps) {
        // The C++ API's baseline for Session.step() (bench/bench-python.py):
        // `steps` steps of this same session, called from C++, with a C++
        // callback that does nothing in place of the Python ones (the
        // caller registers its own again afterwards).
        s.ensureOpen();
        s.session->onCompute(
            [](runtime::ComputeCall &) { return Result<void>(); });
        std::vector<double> seconds;
        Result<void> ok;
        {
          nb::gil_scoped_release release;
          for (int i = 0; i < steps && ok; ++i) {
            auto start = std::chrono::steady_clock::now();
            ok = s.session->step();
            seconds.push_back(std::chrono::duration<double>(
                                  std::chrono::steady_clock::now() - start)
                                  .count());
          }
        }
        check("StepError", ok);
        return seconds;
      },
      nb::arg("session"), nb::arg("steps"));
}
