#!/usr/bin/env python3
"""One rank of the C API test (test/runtime/capi.sh): drives
libmeshplan_runtime.so (include/meshplan/runtime.h) from ctypes.

Started once per rank by `meshplan run`, it opens its rank's plan, fills the
fp32 parameter shards with a function of (tensor id, global index), adds
grad = 0.001 * (g mod 7 - 3) + 0.0005 * step in every backward, runs 2 steps
and checks its parameter shards and AdamW state against a pure-Python
single-process reference on whole tensors (every float operation rounded to
fp32 in the order of kernels::adamwFp32). Forward calls check that the
gathered parameters equal the reference's. Tolerance: 1e-5 relative.

With --save CKPT (after the checks above): saves a checkpoint at CKPT
(mp_session_save_checkpoint, collective), checks that a save under a missing
parent directory fails on every rank with a message, overwrites every
parameter shard and optimizer state with garbage, loads CKPT back into the
same session (mp_session_load_checkpoint) and checks the bytes equal the
saved ones and the recorded step is 2; a load from a missing directory fails
with a message and changes nothing; mp_resume_after after a step is refused.

With --resume CKPT (another job, any plan of the tiny model): loads CKPT
before any step, checks the loaded shards against the reference after 2
steps, continues with mp_resume_after and runs step 3, checked against the
reference after 3 steps (the reference assumes every step has as many
microbatches as step 3).

Usage: capi_test.py PLAN_DIR LIBMESHPLAN_RUNTIME_SO [--save CKPT | --resume CKPT]
"""
import ctypes as C
import json
import math
import os
import struct
import sys
import threading

STEPS = 2
RTOL = 1e-5
MP_OK, MP_ERROR_INVALID, MP_ERROR_RUNTIME, MP_ERROR_NOT_FOUND = 0, 1, 2, 3
MP_TENSORS_PARAMETERS, MP_TENSORS_OPTIMIZER_STATE = 0, 1
MP_DTYPE_FLOAT32 = 0

_F = struct.Struct("f")


def f32(x):
    return _F.unpack(_F.pack(x))[0]


class Tensor(C.Structure):
    _fields_ = [
        ("id", C.c_char_p),
        ("tensor", C.c_char_p),
        ("tensor_id", C.c_int64),
        ("dtype", C.c_int32),
        ("dtype_name", C.c_char_p),
        ("data", C.c_void_p),
        ("nbytes", C.c_size_t),
        ("ndim", C.c_int64),
        ("global_shape", C.POINTER(C.c_int64)),
        ("offset", C.POINTER(C.c_int64)),
        ("local_shape", C.POINTER(C.c_int64)),
        ("has_scale", C.c_int32),
        ("scale", C.c_float),
    ]


class FaultTolerance(C.Structure):
    _fields_ = [
        ("epoch", C.c_int64),
        ("num_groups", C.c_int64),
        ("group", C.c_int64),
        ("num_live_groups", C.c_int64),
        ("live_groups", C.POINTER(C.c_int64)),
        ("num_data_ranks", C.c_int64),
        ("data_ranks", C.POINTER(C.c_int64)),
        ("steps_discarded", C.c_int64),
        ("heals", C.c_int64),
    ]


class ComputeCall(C.Structure):
    _fields_ = [
        ("phase", C.c_char_p),
        ("unit", C.c_char_p),
        ("microbatch", C.c_int64),
        ("step", C.c_int64),
        ("num_params", C.c_size_t),
        ("params", C.POINTER(Tensor)),
        ("num_grads", C.c_size_t),
        ("grads", C.POINTER(Tensor)),
        ("session", C.c_void_p),
    ]


COMPUTE_FN = C.CFUNCTYPE(C.c_int, C.POINTER(ComputeCall), C.c_void_p)
INIT_FN = C.CFUNCTYPE(C.c_int, C.POINTER(Tensor), C.c_void_p)


def load(path):
    lib = C.CDLL(path)  # CDLL releases the GIL around calls
    sig = {
        "mp_last_error": (C.c_char_p, []),
        "mp_set_callback_error": (None, [C.c_char_p]),
        "mp_session_open": (C.c_int, [C.c_char_p, C.POINTER(C.c_void_p)]),
        "mp_session_close": (None, [C.c_void_p]),
        "mp_session_rank": (C.c_int64, [C.c_void_p]),
        "mp_session_world_size": (C.c_int64, [C.c_void_p]),
        "mp_set_compute_callback": (C.c_int, [C.c_void_p, COMPUTE_FN, C.c_void_p]),
        "mp_init_parameters": (C.c_int, [C.c_void_p, INIT_FN, C.c_void_p]),
        "mp_step": (C.c_int, [C.c_void_p]),
        "mp_steps_done": (C.c_int64, [C.c_void_p]),
        "mp_tensor_count": (C.c_int64, [C.c_void_p, C.c_int]),
        "mp_get_tensor": (C.c_int, [C.c_void_p, C.c_int, C.c_int64, C.POINTER(Tensor)]),
        "mp_find_tensor": (C.c_int, [C.c_void_p, C.c_char_p, C.POINTER(Tensor)]),
        "mp_session_save_checkpoint": (C.c_int, [C.c_void_p, C.c_char_p, C.c_char_p,
                                                 C.c_char_p, C.c_int64]),
        "mp_session_load_checkpoint": (C.c_int, [C.c_void_p, C.c_char_p,
                                                 C.POINTER(C.c_int64)]),
        "mp_resume_after": (C.c_int, [C.c_void_p, C.c_int64]),
        "mp_fault_tolerance_state": (C.c_int, [C.c_void_p, C.POINTER(FaultTolerance)]),
        "mp_get_lr": (C.c_int, [C.c_void_p, C.POINTER(C.c_double)]),
        "mp_set_lr": (C.c_int, [C.c_void_p, C.c_double]),
        "mp_last_grad_norm": (C.c_int, [C.c_void_p, C.POINTER(C.c_double),
                                        C.POINTER(C.c_float), C.POINTER(C.c_int)]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


def fail(msg):
    print("capi_test: " + msg, file=sys.stderr)
    sys.exit(1)


def shape_of(ptr, n):
    return [ptr[i] for i in range(n)]


def box(t):
    """(global shape, global flat indices of the box in local row-major order)."""
    n = t.ndim
    gshape = shape_of(t.global_shape, n)
    off, local = shape_of(t.offset, n), shape_of(t.local_shape, n)
    idx = [0]
    for d in range(n):
        idx = [i * gshape[d] + off[d] + j for i in idx for j in range(local[d])]
    return gshape, idx


def floats(t):
    if t.dtype != MP_DTYPE_FLOAT32:
        raise ValueError("%s: dtype %s, expected float32" % (t.id.decode(), t.dtype_name.decode()))
    return (C.c_float * (t.nbytes // 4)).from_address(t.data)


def init_value(tensor_id, g):
    return ((g * 7919 + tensor_id * 104729) % 255 - 127) * 2.0 ** -11


def grad_value(g, step):
    return f32(0.001 * (g % 7 - 3) + 0.0005 * step)


class Reference:
    """Whole tensors, AdamW as kernels::adamwFp32 (fp32 ops, no FMA)."""

    def __init__(self, opt):
        self.opt = opt
        self.w, self.m, self.v = {}, {}, {}

    def add(self, name, tensor_id, numel):
        if name not in self.w:
            self.w[name] = [f32(init_value(tensor_id, g)) for g in range(numel)]
            self.m[name] = [0.0] * numel
            self.v[name] = [0.0] * numel

    def step(self, step, microbatches):
        o = self.opt
        lr, b1, b2, eps, wd = o["lr"], o["beta1"], o["beta2"], o["eps"], o["weight_decay"]
        bc1, bc2 = 1 - b1 ** step, 1 - b2 ** step
        decay, w1 = f32(1 - lr * wd), f32(1 - b1)
        omw1, b2f, w2 = f32(1 - w1), f32(b2), f32(1 - b2)
        neg, bc2s, epsf = f32(-(lr / bc1)), f32(math.sqrt(bc2)), f32(eps)
        small = abs(w1) < 0.5
        for name, w in self.w.items():
            m, v = self.m[name], self.v[name]
            nmb = microbatches.get((name, step), 0)
            for g in range(len(w)):
                # Sum over microbatches; every rank adds the same, so the
                # average over the 2 shards' contributions is exact.
                gr = 0.0
                for _ in range(nmb):
                    gr = f32(gr + grad_value(g, step))
                p = f32(w[g] * decay)
                if small:
                    mn = f32(m[g] + f32(w1 * f32(gr - m[g])))
                else:
                    mn = f32(gr - f32(f32(gr - m[g]) * omw1))
                vn = f32(v[g] * b2f)
                vn = f32(vn + f32(f32(w2 * gr) * gr))
                d = f32(f32(f32(math.sqrt(vn)) / bc2s) + epsf)
                m[g], v[g] = mn, vn
                w[g] = f32(p + f32(f32(neg * mn) / d))


def close(a, b):
    return abs(a - b) <= RTOL * max(abs(a), abs(b)) + 1e-30


def all_tensors(lib, s):
    """Every persistent tensor (parameters, then optimizer state) as Tensor."""
    out = []
    for kind in (MP_TENSORS_PARAMETERS, MP_TENSORS_OPTIMIZER_STATE):
        for i in range(lib.mp_tensor_count(s, kind)):
            t = Tensor()
            if lib.mp_get_tensor(s, kind, i, C.byref(t)) != MP_OK:
                fail("mp_get_tensor: " + lib.mp_last_error().decode())
            out.append(t)
    return out


def snapshot(tensors):
    return {t.id.decode(): C.string_at(t.data, t.nbytes) for t in tensors}


def check_checkpoint(lib, s, rank, ckpt):
    """--save: save, a refused save, scribble, load back into the session."""
    err = lambda: lib.mp_last_error().decode()
    tensors = all_tensors(lib, s)
    saved = snapshot(tensors)
    if lib.mp_session_save_checkpoint(s, ckpt.encode(), b"tiny", b"fsdp2-fp32", -1) != MP_OK:
        fail("mp_session_save_checkpoint: " + err())
    meta = os.path.join(ckpt, "checkpoint.json")
    if not os.path.isfile(meta):
        fail("no %s after the save" % meta)
    # A missing parent directory: every rank gets the error (collective).
    bad = os.path.join(ckpt + ".missing-parent", "sub", "ckpt")
    rc = lib.mp_session_save_checkpoint(s, bad.encode(), b"tiny", None, -1)
    if rc != MP_ERROR_RUNTIME or not err():
        fail("a save under a missing directory returned %d (%r)" % (rc, err()))
    bad_save_message = err()
    # Garbage into every persistent tensor, then load the checkpoint back.
    for t in tensors:
        C.memset(t.data, 0x7f, t.nbytes)
    step = C.c_int64(-1)
    if lib.mp_session_load_checkpoint(s, ckpt.encode(), C.byref(step)) != MP_OK:
        fail("mp_session_load_checkpoint: " + err())
    if step.value != STEPS:
        fail("the checkpoint records step %d, expected %d" % (step.value, STEPS))
    # The same mp_tensor data pointers see the loaded bytes.
    if snapshot(tensors) != saved:
        fail("rank %d: the loaded tensors differ from the saved ones" % rank)
    # Refused: a missing directory (nothing changes), a NULL dir, a resume
    # after steps have run.
    rc = lib.mp_session_load_checkpoint(s, (ckpt + ".nope").encode(), C.byref(step))
    if rc != MP_ERROR_RUNTIME or not err():
        fail("a load from a missing directory returned %d (%r)" % (rc, err()))
    bad_load_message = err()
    if snapshot(tensors) != saved:
        fail("a failed load changed the tensors")
    if lib.mp_session_load_checkpoint(s, None, None) != MP_ERROR_INVALID:
        fail("mp_session_load_checkpoint(NULL dir) did not return MP_ERROR_INVALID")
    if lib.mp_resume_after(s, STEPS) != MP_ERROR_RUNTIME:
        fail("mp_resume_after after a step did not fail")
    print("capi_test: rank %d: saved %s at step %d, loaded back byte-exact (%d tensors, "
          "%d bytes); refused: save: %s | load: %s"
          % (rank, ckpt, STEPS, len(saved), sum(len(b) for b in saved.values()),
             bad_save_message, bad_load_message))


def main():
    args = sys.argv[1:]
    mode = ckpt = None
    if len(args) == 4 and args[2] in ("--save", "--resume"):
        mode, ckpt = args[2], args[3]
        args = args[:2]
    if len(args) != 2:
        fail("usage: capi_test.py PLAN_DIR LIBMESHPLAN_RUNTIME_SO [--save CKPT | --resume CKPT]")
    plan_path, lib_path = args
    lib = load(lib_path)
    err = lambda: lib.mp_last_error().decode()

    s = C.c_void_p()
    if lib.mp_session_open(plan_path.encode(), C.byref(s)) != MP_OK:
        fail("mp_session_open: " + err())
    rank = lib.mp_session_rank(s)
    # Not a fault-tolerant job: the state is refused with a message.
    ft = FaultTolerance()
    if lib.mp_fault_tolerance_state(s, C.byref(ft)) != MP_ERROR_INVALID or \
            "not fault-tolerant" not in err():
        fail("mp_fault_tolerance_state on a plain session: " + err())
    plan_file = plan_path
    if os.path.isdir(plan_path):
        plan_file = os.path.join(plan_path, "rank%d.json" % rank)
    with open(plan_file) as f:
        opt = json.load(f)["optimizer"]
    if opt["name"] != "adamw" or opt.get("stochastic_rounding"):
        fail("the plan's optimizer is not fp32 AdamW: %r" % opt)
    ref = Reference(opt)

    def on_init(tp, _user):
        try:
            t = tp.contents
            gshape, idx = box(t)
            numel = 1
            for d in gshape:
                numel *= d
            ref.add(t.tensor.decode(), t.tensor_id, numel)
            data = floats(t)
            for l, g in enumerate(idx):
                data[l] = init_value(t.tensor_id, g)
            return 0
        except Exception as e:  # a ctypes callback must not raise
            lib.mp_set_callback_error(repr(e).encode())
            return 1

    init_cb = INIT_FN(on_init)
    if lib.mp_init_parameters(s, init_cb, None) != MP_OK:
        fail("mp_init_parameters: " + err())

    lock = threading.Lock()
    microbatches = {}  # (tensor, step) -> backward calls
    calls = {"forward": 0, "backward": 0}
    problems = []
    # --resume: the forward of step 3 sees the loaded parameters, which the
    # reference only knows after the step; checked after it instead.
    check_forward = mode != "--resume"

    def on_compute(cp, _user):
        try:
            c = cp.contents
            phase, step = c.phase.decode(), c.step
            with lock:
                calls[phase] = calls.get(phase, 0) + 1
            if phase == "forward" and check_forward:
                for i in range(c.num_params):
                    t = c.params[i]
                    w = ref.w[t.tensor.decode()]
                    data = floats(t)
                    for l, g in enumerate(box(t)[1]):
                        if data[l] != w[g]:
                            problems.append("step %d forward %s[%d] = %r, reference %r"
                                            % (step, t.id.decode(), g, data[l], w[g]))
                            break
            elif phase == "backward":
                for i in range(c.num_grads):
                    t = c.grads[i]
                    data = floats(t)
                    for l, g in enumerate(box(t)[1]):
                        data[l] += grad_value(g, step)
                    key = (t.tensor.decode(), step)
                    with lock:
                        microbatches[key] = microbatches.get(key, 0) + 1
            return 0
        except Exception as e:
            lib.mp_set_callback_error(repr(e).encode())
            return 1

    compute_cb = COMPUTE_FN(on_compute)  # kept alive until the end
    if lib.mp_set_compute_callback(s, compute_cb, None) != MP_OK:
        fail("mp_set_compute_callback: " + err())

    checked = elements = 0
    worst = 0.0

    def compare(t, want, what):
        nonlocal elements, worst
        data = floats(t)
        for l, g in enumerate(box(t)[1]):
            a, b = data[l], want[g]
            if not close(a, b):
                fail("rank %d: %s %s[%d] = %r, reference %r" % (rank, what, t.id.decode(), g, a, b))
            if b != 0:
                worst = max(worst, abs(a - b) / abs(b))
            elements += 1

    def compare_all():
        """Parameter shards and optimizer state against the reference."""
        nonlocal checked
        n = lib.mp_tensor_count(s, MP_TENSORS_PARAMETERS)
        if n <= 0:
            fail("mp_tensor_count(parameters) = %d: %s" % (n, err()))
        t = Tensor()
        for i in range(n):
            if lib.mp_get_tensor(s, MP_TENSORS_PARAMETERS, i, C.byref(t)) != MP_OK:
                fail("mp_get_tensor: " + err())
            name = t.tensor.decode()
            compare(t, ref.w[name], "parameter")
            for suffix, want in ((".exp_avg", ref.m[name]), (".exp_avg_sq", ref.v[name])):
                st = Tensor()
                if lib.mp_find_tensor(s, (t.id.decode() + suffix).encode(), C.byref(st)) != MP_OK:
                    fail("mp_find_tensor: " + err())
                compare(st, want, "state")
            checked += 1
        if lib.mp_tensor_count(s, MP_TENSORS_OPTIMIZER_STATE) != 2 * n:
            fail("expected 2 optimizer states per parameter")
        return n

    if mode == "--resume":
        step = C.c_int64(-1)
        if lib.mp_session_load_checkpoint(s, ckpt.encode(), C.byref(step)) != MP_OK:
            fail("mp_session_load_checkpoint: " + err())
        if step.value != STEPS:
            fail("the checkpoint records step %d, expected %d" % (step.value, STEPS))
        if lib.mp_resume_after(s, step.value) != MP_OK:
            fail("mp_resume_after: " + err())
        loaded = snapshot(all_tensors(lib, s))
        if lib.mp_step(s) != MP_OK:
            fail("mp_step %d: %s" % (STEPS + 1, err()))
        if problems:
            fail(problems[0])
        if lib.mp_steps_done(s) != STEPS + 1:
            fail("mp_steps_done = %d, expected %d" % (lib.mp_steps_done(s), STEPS + 1))
        for (name, st), count in list(microbatches.items()):
            for k in range(1, STEPS + 1):
                microbatches[(name, k)] = count
        for k in range(1, STEPS + 1):
            ref.step(k, microbatches)
        # The loaded bytes against the reference after STEPS steps.
        after = snapshot(all_tensors(lib, s))
        for t in all_tensors(lib, s):
            C.memmove(t.data, loaded[t.id.decode()], t.nbytes)
        compare_all()
        for t in all_tensors(lib, s):
            C.memmove(t.data, after[t.id.decode()], t.nbytes)
        ref.step(STEPS + 1, microbatches)
        n = compare_all()
        world = lib.mp_session_world_size(s)
        lib.mp_session_close(s)
        print("capi_test: rank %d of %d: loaded %s (step %d) into this layout, matches the "
              "reference; step %d after mp_resume_after matches it too (%d parameter shards, "
              "%d elements, max rel err %.3g)"
              % (rank, world, ckpt, STEPS, STEPS + 1, n, elements, worst))
        return

    for step in range(1, STEPS + 1):
        if lib.mp_step(s) != MP_OK:
            fail("mp_step %d: %s" % (step, err()))
        if problems:
            fail(problems[0])
        ref.step(step, microbatches)
    if lib.mp_steps_done(s) != STEPS:
        fail("mp_steps_done = %d, expected %d" % (lib.mp_steps_done(s), STEPS))
    if calls["backward"] == 0:
        fail("no backward compute call")

    n = compare_all()

    # Error paths: status + message, no exception.
    t = Tensor()
    if lib.mp_find_tensor(s, b"no.such.tensor", C.byref(t)) != MP_ERROR_NOT_FOUND or not err():
        fail("mp_find_tensor of a missing id did not fail with a message")
    if lib.mp_get_tensor(s, MP_TENSORS_PARAMETERS, n, C.byref(t)) == MP_OK:
        fail("mp_get_tensor out of range succeeded")

    # The learning rate: the plan's (no schedule here), an override, back.
    lr = C.c_double()
    if lib.mp_get_lr(s, C.byref(lr)) != MP_OK or lr.value != opt["lr"]:
        fail("mp_get_lr gave %r, expected the plan's %r" % (lr.value, opt["lr"]))
    if lib.mp_set_lr(s, 0.5) != MP_OK or lib.mp_get_lr(s, C.byref(lr)) != MP_OK or lr.value != 0.5:
        fail("mp_set_lr(0.5) did not hold: %r" % lr.value)
    if lib.mp_set_lr(s, 2e6) != MP_ERROR_INVALID or "learning rate" not in err():
        fail("mp_set_lr(2e6) was not refused with a message")
    if lib.mp_set_lr(s, -1.0) != MP_OK or lib.mp_get_lr(s, C.byref(lr)) != MP_OK or lr.value != opt["lr"]:
        fail("mp_set_lr(-1) did not return to the plan's rate: %r" % lr.value)
    # No clipping in this plan: no norm, said so.
    if lib.mp_last_grad_norm(s, None, None, None) != MP_ERROR_NOT_FOUND or "no gradient norm" not in err():
        fail("mp_last_grad_norm without clipping did not fail with a message")

    if mode == "--save":
        check_checkpoint(lib, s, rank, ckpt)

    world = lib.mp_session_world_size(s)
    lib.mp_session_close(s)
    print("capi_test: rank %d of %d: %d steps, %d parameter shards and their AdamW "
          "state (%d elements) match the reference (max rel err %.3g), %d forward "
          "+ %d backward calls" % (rank, world, STEPS, n, elements, worst,
                                   calls["forward"], calls["backward"]))


if __name__ == "__main__":
    main()
