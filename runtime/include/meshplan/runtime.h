/*===- runtime.h - The C embedding API of the meshplan runtime -----------===*\
|*                                                                            *|
|* A C interface over meshplan::runtime::Session (Runtime/Session.h) for     *|
|* ctypes / FFI callers, built as libmeshplan_runtime.so. No C++ types cross *|
|* it and no C++ exception escapes it: every failure is a status code plus a *|
|* message for mp_last_error().                                               *|
|*                                                                            *|
|*   mp_session *s;                                                           *|
|*   if (mp_session_open("plans/", &s) != MP_OK) puts(mp_last_error());       *|
|*   mp_init_parameters(s, fill, NULL);                                       *|
|*   mp_set_compute_callback(s, compute, NULL);                               *|
|*   for (int i = 0; i < 10; ++i) mp_step(s);                                 *|
|*   mp_session_close(s);                                                     *|
|*                                                                            *|
|* Lifetimes: strings and shape arrays of an mp_tensor live as long as the   *|
|* session. The data of a persistent tensor (parameter shard, optimizer      *|
|* state) lives as long as the session; its values change at every step.     *|
|* Everything an mp_compute_call points to is valid only during the call.    *|
|*                                                                            *|
\*===----------------------------------------------------------------------===*/
#ifndef MESHPLAN_RUNTIME_H
#define MESHPLAN_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes: every function returning int returns one of these. */
enum {
  MP_OK = 0,
  MP_ERROR_INVALID = 1,   /* a null or out-of-range argument */
  MP_ERROR_RUNTIME = 2,   /* the session failed (open, step, collective) */
  MP_ERROR_NOT_FOUND = 3, /* no tensor with that id */
  MP_ERROR_CALLBACK = 4   /* a callback returned non-zero */
};

/* Element types, in the plan's order (plan::DType). */
typedef enum mp_dtype {
  MP_DTYPE_FLOAT32 = 0,
  MP_DTYPE_BFLOAT16 = 1,
  MP_DTYPE_FLOAT16 = 2,
  MP_DTYPE_FLOAT8_E4M3 = 3,
  MP_DTYPE_FLOAT8_E5M2 = 4,
  MP_DTYPE_FLOAT64 = 5,
  MP_DTYPE_INT8 = 6,
  MP_DTYPE_UINT8 = 7,
  MP_DTYPE_INT32 = 8,
  MP_DTYPE_INT64 = 9
} mp_dtype;

/* Which persistent tensors mp_tensor_count / mp_get_tensor enumerate. */
typedef enum mp_tensor_kind {
  MP_TENSORS_PARAMETERS = 0,     /* parameter shards (param_shard) */
  MP_TENSORS_OPTIMIZER_STATE = 1 /* exp_avg, exp_avg_sq, ... */
} mp_tensor_kind;

typedef struct mp_session mp_session;

/* A buffer of the plan: its bytes and its box in the model tensor. */
typedef struct mp_tensor {
  const char *id;         /* buffer id, e.g. "norm.weight.gathered" */
  const char *tensor;     /* model tensor, e.g. "norm.weight" ("" for none) */
  int64_t tensor_id;      /* parameter index in the model, -1 if none */
  int32_t dtype;          /* an mp_dtype */
  const char *dtype_name; /* the plan's spelling, e.g. "float32" */
  void *data;
  size_t nbytes;
  int64_t ndim;
  const int64_t *global_shape; /* ndim entries each */
  const int64_t *offset;       /* this buffer's box in the global tensor */
  const int64_t *local_shape;
  int32_t has_scale; /* float8: value = stored / scale */
  float scale;
} mp_tensor;

/* One compute instruction: forward or backward of `unit`. */
typedef struct mp_compute_call {
  const char *phase; /* "forward" or "backward" */
  const char *unit;  /* the FSDP unit, e.g. "layers.3" */
  int64_t microbatch;
  int64_t step; /* 1-based */
  size_t num_params;
  const mp_tensor *params; /* the parameters it reads, in plan order */
  size_t num_grads;
  /* backward: the gradients it writes. The callback ADDS its contribution
     (zeros at the first microbatch, the earlier microbatches' sum after). */
  const mp_tensor *grads;
  mp_session *session;
  /* Fault tolerance with replica groups missing: the batch shares this call
     computes, as indices into mp_fault_tolerance's data_ranks. One per call
     where the session runs a pass per share (the full job's sums, bit for
     bit), all of them where it cannot (the callback then adds them into the
     same gradients). num_shares 0: the rank's own data. */
  size_t num_shares;
  const int64_t *shares;
} mp_compute_call;

/* Callbacks return 0 on success, non-zero to fail the step / the init. They
   may run on the session's worker threads, not the caller's. */
typedef int (*mp_compute_fn)(const mp_compute_call *call, void *user);
/* Fills one parameter shard (tensor->data, tensor->nbytes). */
typedef int (*mp_init_fn)(mp_tensor *shard, void *user);

/* The message of the last failure on this thread ("" if none). Valid until
   the next failing call on this thread. */
const char *mp_last_error(void);

/* From inside a callback: the message to report when it returns non-zero
   (copied; the default is "callback returned N"). */
void mp_set_callback_error(const char *message);

/* Opens a plan file or a plan directory (its rank<RANK>.json) with the
   options `meshplan run` / torchrun set in the environment (RANK,
   WORLD_SIZE, MESHPLAN_STORE, MESHPLAN_TIMEOUT, MESHPLAN_JOB). *out is set
   to a new session, or to NULL on failure. */
int mp_session_open(const char *plan_path, mp_session **out);

/* Destroys a session (NULL is allowed). */
void mp_session_close(mp_session *s);

/* This session's rank and world size; -1 for a NULL session. */
int64_t mp_session_rank(const mp_session *s);
int64_t mp_session_world_size(const mp_session *s);

/* Calls fn(call, user) for every compute instruction (replacing an earlier
   callback; fn NULL removes it). A step with compute instructions and no
   callback leaves gradients at zero. */
int mp_set_compute_callback(mp_session *s, mp_compute_fn fn, void *user);

/* Calls fn(shard, user) for every parameter shard, to fill it from its global
   box. Optimizer state starts at zero. */
int mp_init_parameters(mp_session *s, mp_init_fn fn, void *user);

/* Runs one training step. After a failure the session is unusable. */
int mp_step(mp_session *s);

/* Steps completed so far; -1 for a NULL session. */
int64_t mp_steps_done(const mp_session *s);

/* The learning rate the next mp_step runs with (mp_set_lr's, else the
   plan's lr_schedule at step mp_steps_done + 1) into *lr; MP_ERROR_INVALID
   for a NULL argument or a plan without optimizer. */
int mp_get_lr(const mp_session *s, double *lr);
/* Sets the rate of every later step, overriding the plan's schedule (every
   rank must set the same); a negative `lr` returns to the plan's schedule.
   MP_ERROR_INVALID for a rate above 1e6 or a plan without optimizer. */
int mp_set_lr(mp_session *s, double lr);

/* The last step's gradient clipping (plans with optimizer.max_norm): its
   global gradient norm (NaN when not finite), the coefficient the gradients
   were multiplied by, and 1 in *skipped when the update was skipped (a
   non-finite norm, on every rank alike). MP_ERROR_NOT_FOUND when the last
   step computed no norm. NULL outputs are allowed. */
int mp_last_grad_norm(const mp_session *s, double *norm, float *coefficient,
                      int *skipped);

/* The number of persistent tensors of `kind` (an mp_tensor_kind); -1 on an
   invalid argument. */
int64_t mp_tensor_count(mp_session *s, int kind);

/* The index-th persistent tensor of `kind`, in plan order. */
int mp_get_tensor(mp_session *s, int kind, int64_t index, mp_tensor *out);

/* A persistent tensor by buffer id (MP_ERROR_NOT_FOUND if there is none). */
int mp_find_tensor(mp_session *s, const char *id, mp_tensor *out);

/* Checkpoints (docs/checkpoint-format.md; docs/runtime.md "Checkpoints").

   Saves every parameter shard and optimizer state of the job as a checkpoint
   directory `dir` (its parent must exist). Collective: every rank calls it at
   the same point, after the same number of steps; each rank writes the boxes
   it owns into its own data file, rank 0 gathers the chunk records through
   the job's store and commits. The directory appears complete or not at all:
   it is written as `.<name>.partial` next to `dir`, fsynced and renamed, so a
   previous checkpoint at `dir` stays loadable until the rename (a crash or
   kill -9 at any point leaves it intact); an existing `dir` that is not a
   checkpoint is refused. Every rank returns the same status (MP_ERROR_RUNTIME
   with the message of the rank that failed).

   Recorded: `model_name` and `spec_name` (NULL for ""; names only, loading
   does not require the same spec), the step (mp_steps_done), the plan's
   stochastic-rounding flag, and `seed`: the stochastic-rounding seed, or -1
   for the plan optimizer's own seed (0 without an optimizer). */
int mp_session_save_checkpoint(mp_session *s, const char *dir,
                               const char *model_name, const char *spec_name,
                               int64_t seed);

/* Loads this rank's box of every parameter shard and optimizer state from the
   checkpoint at `dir`, written under any plan of the same model (any mesh,
   world size or layout). Not collective. It reads only the checksum blocks
   its boxes intersect and verifies them; a missing tensor, a shape or dtype
   mismatch, a checksum failure (naming the tensor, file and byte offset) or
   malformed metadata is MP_ERROR_RUNTIME and changes nothing. The data
   pointers of earlier mp_tensor results stay valid (the bytes are copied into
   them). On success *step_out (if not NULL) is the step the checkpoint was
   saved at; the step counter is not changed: call mp_resume_after(s,
   *step_out) before the first mp_step to continue the run. */
int mp_session_load_checkpoint(mp_session *s, const char *dir,
                               int64_t *step_out);

/* Before the first mp_step of a session: the next mp_step is step
   `steps` + 1 (AdamW's bias correction and stochastic rounding continue).
   MP_ERROR_RUNTIME once a step has run, MP_ERROR_INVALID for steps < 0. */
int mp_resume_after(mp_session *s, int64_t steps);

/* A fault-tolerant session (MESHPLAN_FT_STORE set; docs/fault-tolerance.md):
   the epoch it trains in, the live replica groups, and the ranks whose share
   of the batch this rank processes in the current step (itself first, then
   those of missing groups assigned to it: the compute callback computes the
   ones mp_compute_call's shares name). The arrays point into the session and
   stay valid until the next mp_step or mp_fault_tolerance_state. */
typedef struct mp_fault_tolerance {
  int64_t epoch;
  int64_t num_groups; /* the managed axis's size */
  int64_t group;      /* this rank's replica group */
  int64_t num_live_groups;
  const int64_t *live_groups; /* ascending */
  int64_t num_data_ranks;
  const int64_t *data_ranks;
  int64_t steps_discarded; /* steps redone in a later epoch so far */
  int64_t heals;           /* times this rank sent or received state */
} mp_fault_tolerance;

/* Fills *out; MP_ERROR_INVALID for a NULL argument or a session that is not
   fault-tolerant. */
int mp_fault_tolerance_state(mp_session *s, mp_fault_tolerance *out);

#ifdef __cplusplus
}
#endif

#endif /* MESHPLAN_RUNTIME_H */
