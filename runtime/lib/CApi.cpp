//===- CApi.cpp - The C embedding API (meshplan/runtime.h) ----------------===//
//
// Thin wrappers over Session. Every entry point catches everything at the
// boundary: failures become a status code and a thread-local message. A
// callback's non-zero return becomes an Error inside the session, so that
// the step fails the way any failing instruction does.
//
//===----------------------------------------------------------------------===//

#include "meshplan/runtime.h"

#include "meshplan/Runtime/Session.h"

#include <exception>
#include <memory>
#include <string>
#include <vector>

using namespace meshplan;
using namespace meshplan::runtime;

struct mp_session {
  std::unique_ptr<Session> session;
  int64_t worldSize = 1;
  /// mp_fault_tolerance_state's arrays.
  std::vector<int64_t> liveGroups, dataRanks;
};

namespace {

thread_local std::string lastError;
/// Set by mp_set_callback_error in a callback, taken right after it returns
/// on the same thread.
thread_local std::string callbackError;
thread_local bool callbackErrorSet = false;

int fail(int status, std::string message) {
  lastError = std::move(message);
  return status;
}

int failUnknown() {
  try {
    throw;
  } catch (const std::exception &e) {
    return fail(MP_ERROR_RUNTIME, std::string("exception: ") + e.what());
  } catch (...) {
    return fail(MP_ERROR_RUNTIME, "unknown exception");
  }
}

/// NUL-terminated dtype spellings with static lifetime.
const char *dtypeCName(plan::DType dtype) {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (int i = 0; i <= static_cast<int>(plan::DType::Int64); ++i)
      out.emplace_back(plan::dtypeName(static_cast<plan::DType>(i)));
    return out;
  }();
  auto i = static_cast<size_t>(dtype);
  return i < names.size() ? names[i].c_str() : "";
}

void toC(const TensorView &v, mp_tensor &out) {
  const plan::Buffer &b = *v.buffer;
  out.id = b.id.c_str();
  out.tensor = b.tensor.c_str();
  out.tensor_id = b.tensorId ? *b.tensorId : -1;
  out.dtype = static_cast<int32_t>(b.dtype);
  out.dtype_name = dtypeCName(b.dtype);
  out.data = v.bytes.data();
  out.nbytes = v.bytes.size();
  out.ndim = static_cast<int64_t>(b.globalShape.size());
  out.global_shape = b.globalShape.data();
  out.offset = b.offset.data();
  out.local_shape = b.localShape.data();
  out.has_scale = v.scale.has_value() ? 1 : 0;
  out.scale = v.scale.value_or(0.0f);
}

/// The message for a callback that returned `rc`.
std::string takeCallbackError(const std::string &what, int rc) {
  std::string message = callbackErrorSet
                            ? callbackError
                            : "callback returned " + std::to_string(rc);
  callbackErrorSet = false;
  callbackError.clear();
  return what + ": " + message;
}

std::vector<TensorView> *viewsOf(mp_session *s, int kind,
                                 std::vector<TensorView> &storage) {
  if (kind == MP_TENSORS_PARAMETERS)
    storage = s->session->parameters();
  else if (kind == MP_TENSORS_OPTIMIZER_STATE)
    storage = s->session->optimizerState();
  else
    return nullptr;
  return &storage;
}

} // namespace

extern "C" {

const char *mp_last_error(void) { return lastError.c_str(); }

void mp_set_callback_error(const char *message) {
  try {
    callbackError = message ? message : "";
    callbackErrorSet = true;
  } catch (...) {
  }
}

int mp_session_open(const char *plan_path, mp_session **out) {
  try {
    if (!out)
      return fail(MP_ERROR_INVALID, "mp_session_open: out is NULL");
    *out = nullptr;
    if (!plan_path)
      return fail(MP_ERROR_INVALID, "mp_session_open: plan_path is NULL");
    auto options = sessionOptionsFromEnv();
    if (!options)
      return fail(MP_ERROR_INVALID, options.error().message);
    auto session = Session::openPath(plan_path, *options);
    if (!session)
      return fail(MP_ERROR_RUNTIME, session.error().message);
    auto s = std::make_unique<mp_session>();
    s->session = std::move(*session);
    s->worldSize = options->worldSize;
    *out = s.release();
    return MP_OK;
  } catch (...) {
    return failUnknown();
  }
}

void mp_session_close(mp_session *s) {
  try {
    delete s;
  } catch (...) {
  }
}

int64_t mp_session_rank(const mp_session *s) {
  return s ? s->session->rank() : -1;
}

int64_t mp_session_world_size(const mp_session *s) {
  return s ? s->worldSize : -1;
}

int mp_set_compute_callback(mp_session *s, mp_compute_fn fn, void *user) {
  try {
    if (!s)
      return fail(MP_ERROR_INVALID, "mp_set_compute_callback: NULL session");
    if (!fn) {
      s->session->onCompute(ComputeCallback());
      return MP_OK;
    }
    s->session->onCompute([s, fn, user](ComputeCall &call) -> Result<void> {
      std::string what = "compute callback (" + call.phase + " " + call.unit +
                         ", microbatch " + std::to_string(call.microbatch) +
                         ")";
      try {
        std::vector<mp_tensor> params(call.params.size()),
            grads(call.grads.size());
        for (size_t i = 0; i < params.size(); ++i)
          toC(call.params[i], params[i]);
        for (size_t i = 0; i < grads.size(); ++i)
          toC(call.grads[i], grads[i]);
        mp_compute_call c{};
        c.phase = call.phase.c_str();
        c.unit = call.unit.c_str();
        c.microbatch = call.microbatch;
        c.step = call.step;
        c.num_params = params.size();
        c.params = params.data();
        c.num_grads = grads.size();
        c.grads = grads.data();
        c.session = s;
        c.num_shares = call.shares.size();
        c.shares = call.shares.empty() ? nullptr : call.shares.data();
        callbackErrorSet = false;
        int rc = fn(&c, user);
        if (rc != 0)
          return makeError(takeCallbackError(what, rc));
        return {};
      } catch (const std::exception &e) {
        return makeError(what + ": exception: " + e.what());
      } catch (...) {
        return makeError(what + ": unknown exception");
      }
    });
    return MP_OK;
  } catch (...) {
    return failUnknown();
  }
}

int mp_init_parameters(mp_session *s, mp_init_fn fn, void *user) {
  try {
    if (!s || !fn)
      return fail(MP_ERROR_INVALID,
                  "mp_init_parameters: NULL session or callback");
    bool callbackFailed = false;
    auto r = s->session->initParameters([&](TensorView &v) -> Result<void> {
      mp_tensor t{};
      toC(v, t);
      callbackErrorSet = false;
      int rc = fn(&t, user);
      if (rc != 0) {
        callbackFailed = true;
        return makeError(
            takeCallbackError("init callback (" + v.id() + ")", rc));
      }
      return {};
    });
    if (!r)
      return fail(callbackFailed ? MP_ERROR_CALLBACK : MP_ERROR_RUNTIME,
                  r.error().message);
    return MP_OK;
  } catch (...) {
    return failUnknown();
  }
}

int mp_step(mp_session *s) {
  try {
    if (!s)
      return fail(MP_ERROR_INVALID, "mp_step: NULL session");
    auto r = s->session->step();
    if (!r)
      return fail(MP_ERROR_RUNTIME, r.error().message);
    return MP_OK;
  } catch (...) {
    return failUnknown();
  }
}

int64_t mp_steps_done(const mp_session *s) {
  return s ? s->session->stepsDone() : -1;
}

int mp_get_lr(const mp_session *s, double *lr) {
  try {
    if (!s || !lr)
      return fail(MP_ERROR_INVALID, "mp_get_lr: NULL argument");
    std::optional<double> rate = s->session->lr();
    if (!rate)
      return fail(MP_ERROR_INVALID, "mp_get_lr: the plan has no optimizer");
    *lr = *rate;
    return MP_OK;
  } catch (...) {
    return failUnknown();
  }
}

int mp_set_lr(mp_session *s, double lr) {
  try {
    if (!s)
      return fail(MP_ERROR_INVALID, "mp_set_lr: NULL session");
    auto ok =
        s->session->setLr(lr < 0 ? std::nullopt : std::optional<double>(lr));
    if (!ok)
      return fail(MP_ERROR_INVALID, "mp_set_lr: " + ok.error().message);
    return MP_OK;
  } catch (...) {
    return failUnknown();
  }
}

int mp_last_grad_norm(const mp_session *s, double *norm, float *coefficient,
                      int *skipped) {
  try {
    if (!s)
      return fail(MP_ERROR_INVALID, "mp_last_grad_norm: NULL session");
    const StepProfile &p = s->session->lastStepProfile();
    if (!p.gradNorm)
      return fail(MP_ERROR_NOT_FOUND,
                  "mp_last_grad_norm: the last step computed no gradient "
                  "norm (no step yet, or no optimizer.max_norm)");
    if (norm)
      *norm = *p.gradNorm;
    if (coefficient)
      *coefficient = p.clipCoefficient;
    if (skipped)
      *skipped = p.updateSkipped ? 1 : 0;
    return MP_OK;
  } catch (...) {
    return failUnknown();
  }
}

int64_t mp_tensor_count(mp_session *s, int kind) {
  try {
    if (!s)
      return fail(MP_ERROR_INVALID, "mp_tensor_count: NULL session"), -1;
    std::vector<TensorView> storage;
    auto *views = viewsOf(s, kind, storage);
    if (!views)
      return fail(MP_ERROR_INVALID,
                  "mp_tensor_count: bad kind " + std::to_string(kind)),
             -1;
    return static_cast<int64_t>(views->size());
  } catch (...) {
    return failUnknown(), -1;
  }
}

int mp_get_tensor(mp_session *s, int kind, int64_t index, mp_tensor *out) {
  try {
    if (!s || !out)
      return fail(MP_ERROR_INVALID, "mp_get_tensor: NULL session or out");
    std::vector<TensorView> storage;
    auto *views = viewsOf(s, kind, storage);
    if (!views)
      return fail(MP_ERROR_INVALID,
                  "mp_get_tensor: bad kind " + std::to_string(kind));
    if (index < 0 || index >= static_cast<int64_t>(views->size()))
      return fail(MP_ERROR_INVALID, "mp_get_tensor: index " +
                                        std::to_string(index) +
                                        " out of range [0, " +
                                        std::to_string(views->size()) + ")");
    toC((*views)[static_cast<size_t>(index)], *out);
    return MP_OK;
  } catch (...) {
    return failUnknown();
  }
}

int mp_find_tensor(mp_session *s, const char *id, mp_tensor *out) {
  try {
    if (!s || !id || !out)
      return fail(MP_ERROR_INVALID, "mp_find_tensor: NULL session, id or out");
    auto v = s->session->tensor(id);
    if (!v)
      return fail(MP_ERROR_NOT_FOUND, v.error().message);
    toC(*v, *out);
    return MP_OK;
  } catch (...) {
    return failUnknown();
  }
}

int mp_session_save_checkpoint(mp_session *s, const char *dir,
                               const char *model_name, const char *spec_name,
                               int64_t seed) {
  try {
    if (!s || !dir)
      return fail(MP_ERROR_INVALID,
                  "mp_session_save_checkpoint: NULL session or dir");
    if (!*dir)
      return fail(MP_ERROR_INVALID, "mp_session_save_checkpoint: empty dir");
    if (seed < -1)
      return fail(MP_ERROR_INVALID, "mp_session_save_checkpoint: seed " +
                                        std::to_string(seed) +
                                        " (>= 0, or -1 for the plan's)");
    ckpt::CheckpointInfo info;
    info.model = {model_name ? model_name : "", ""};
    info.spec = {spec_name ? spec_name : "", ""};
    const auto &opt = s->session->plan().optimizer;
    info.training.seed = seed >= 0 ? seed : opt ? int64_t(opt->seed) : 0;
    info.training.stochasticRounding = opt && opt->stochasticRounding;
    info.generator = "meshplan C API";
    auto r = s->session->saveCheckpoint(dir, std::move(info));
    if (!r)
      return fail(MP_ERROR_RUNTIME, r.error().message);
    return MP_OK;
  } catch (...) {
    return failUnknown();
  }
}

int mp_session_load_checkpoint(mp_session *s, const char *dir,
                               int64_t *step_out) {
  try {
    if (!s || !dir)
      return fail(MP_ERROR_INVALID,
                  "mp_session_load_checkpoint: NULL session or dir");
    auto state = s->session->loadCheckpoint(dir);
    if (!state)
      return fail(MP_ERROR_RUNTIME, state.error().message);
    if (step_out)
      *step_out = state->step;
    return MP_OK;
  } catch (...) {
    return failUnknown();
  }
}

int mp_resume_after(mp_session *s, int64_t steps) {
  try {
    if (!s)
      return fail(MP_ERROR_INVALID, "mp_resume_after: NULL session");
    if (steps < 0)
      return fail(MP_ERROR_INVALID,
                  "mp_resume_after: steps " + std::to_string(steps) + " < 0");
    auto r = s->session->resumeAfter(steps);
    if (!r)
      return fail(MP_ERROR_RUNTIME, r.error().message);
    return MP_OK;
  } catch (...) {
    return failUnknown();
  }
}

int mp_fault_tolerance_state(mp_session *s, mp_fault_tolerance *out) {
  try {
    if (!s || !out)
      return fail(MP_ERROR_INVALID, "mp_fault_tolerance_state: NULL argument");
    auto ft = s->session->faultTolerance();
    if (!ft)
      return fail(MP_ERROR_INVALID,
                  "mp_fault_tolerance_state: the session is not "
                  "fault-tolerant (MESHPLAN_FT_STORE is not set)");
    s->liveGroups.assign(ft->liveGroups.begin(), ft->liveGroups.end());
    s->dataRanks = ft->dataRanks;
    out->epoch = ft->epoch;
    out->num_groups = ft->numGroups;
    out->group = ft->group;
    out->num_live_groups = int64_t(s->liveGroups.size());
    out->live_groups = s->liveGroups.data();
    out->num_data_ranks = int64_t(s->dataRanks.size());
    out->data_ranks = s->dataRanks.data();
    out->steps_discarded = ft->stepsDiscarded;
    out->heals = ft->heals;
    return MP_OK;
  } catch (...) {
    return failUnknown();
  }
}

} // extern "C"
