#!/usr/bin/env python3
"""Writes the seed corpora of fuzz-spec, fuzz-plan, fuzz-plan-set and
fuzz-checkpoint (fuzz/corpus/<target>/), from the repository's examples and
test inputs and from plans and a checkpoint that a meshplan binary makes of
small specs. Seeds are kept small: libFuzzer mutates faster, and a seed only
has to reach the code, not be realistic.

  fuzz/tools/make-seeds.py [MESHPLAN]     (default build/bin/meshplan; run
                                           from the repository root)

Rewrites the files it names (gen-*, example-*, test-*); regress-* seeds (the
inputs of fixed findings) are never touched. The view, placement and layout
seeds come from fuzz/tools/seeds-from-tests.py.
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

MESHPLAN = sys.argv[1] if len(sys.argv) > 1 else "build/bin/meshplan"
CORPUS = "fuzz/corpus"


def compact(doc):
    return json.dumps(doc, separators=(",", ":")) + "\n"


def clear(target, prefixes):
    os.makedirs(f"{CORPUS}/{target}", exist_ok=True)
    for prefix in prefixes:
        for old in glob.glob(f"{CORPUS}/{target}/{prefix}-*"):
            os.remove(old)


def write(target, name, text):
    with open(f"{CORPUS}/{target}/{name}", "w") as f:
        f.write(text)


# The tiny preset with one layer and every dim / 4: 12 parameter tensors.
def mini_model():
    model = json.load(open("examples/models/tiny.json"))
    model.pop("$schema", None)
    model["name"] = "mini"
    model["description"] = "tiny, one layer, dims / 4"

    def shrink(module):
        for p in module.get("parameters", []):
            p["shape"] = [d // 4 if d >= 16 else d for d in p["shape"]]
            p.pop("dtype", None)
        for c in module.get("children", []):
            shrink(c)

    for module in model["modules"]:
        if module["name"] == "layers":
            module["children"] = module["children"][:1]
        shrink(module)
    return model


TP_PLAN = [
    {"pattern": "tok_embeddings", "style": "rowwise"},
    {"pattern": "layers.*.attention_norm", "style": "sequence_parallel"},
    {"pattern": "layers.*.attention.wq", "style": "colwise"},
    {"pattern": "layers.*.attention.wk", "style": "colwise"},
    {"pattern": "layers.*.attention.wv", "style": "colwise"},
    {"pattern": "layers.*.attention.wo", "style": "rowwise"},
    {"pattern": "layers.*.ffn_norm", "style": "sequence_parallel"},
    {"pattern": "layers.*.feed_forward.w1", "style": "colwise"},
    {"pattern": "layers.*.feed_forward.w2", "style": "rowwise"},
    {"pattern": "layers.*.feed_forward.w3", "style": "colwise"},
    {"pattern": "norm", "style": "sequence_parallel"},
    {"pattern": "output", "style": "colwise"},
]
BF16 = {"param_dtype": "bfloat16", "reduce_dtype": "float32"}


def axes(**sizes):
    return [{"name": n, "size": s} for n, s in sizes.items()]


# Small specs of the mini model, one feature or two each.
MINI_SPECS = {
    "fsdp2": {"mesh": {"axes": axes(fsdp=2)},
              "data_parallel": {"shard_axes": ["fsdp"]}},
    "ddp2": {"mesh": {"axes": axes(dp=2)},
             "data_parallel": {"replicate_axes": ["dp"]}},
    "hsdp2x2-bf16": {"mesh": {"axes": axes(r=2, s=2)},
                     "data_parallel": {"replicate_axes": ["r"],
                                       "shard_axes": ["s"]},
                     "mixed_precision": BF16},
    "fsdp2-tp2": {"mesh": {"axes": axes(dp_shard=2, tp=2)},
                  "data_parallel": {"shard_axes": ["dp_shard"]},
                  "tensor_parallel": {"axis": "tp", "plan": TP_PLAN},
                  "mixed_precision": BF16},
    "fsdp3-fp8": {"mesh": {"axes": axes(fsdp=3)},
                  "data_parallel": {"shard_axes": ["fsdp"],
                                    "reshard_after_forward": "always"},
                  "mixed_precision": BF16,
                  "float8": {"all_gather": True, "scaling": "tensorwise",
                             "power_of_2_scales": True,
                             "modules": ["layers.*.feed_forward.*"]}},
    "fsdp2-sr": {"mesh": {"axes": axes(fsdp=2)},
                 "data_parallel": {"shard_axes": ["fsdp"],
                                   "reshard_after_forward": False,
                                   "units": "per_module"},
                 "mixed_precision": BF16,
                 "optimizer": {"name": "adamw", "lr": 1e-3,
                               "betas": [0.9, 0.999], "eps": 1e-8,
                               "weight_decay": 0.01,
                               "param_dtype": "bfloat16",
                               "stochastic_rounding": True, "seed": 7},
                 "gradient_accumulation_steps": 2},
    "managed-extra-order": {"world_size": 8,
                            "mesh": {"axes": axes(dp_replicate=2, dp_shard=2,
                                                  cp=2),
                                     "managed_axes": ["dp_replicate"],
                                     "device_order": [7, 6, 5, 4, 3, 2, 1,
                                                      0]},
                            "data_parallel": {"replicate_axes":
                                              ["dp_replicate"],
                                              "shard_axes": ["dp_shard"]},
                            "extra_axes": ["cp"]},
}


# Two linear modules: plans of a few KB for the plan and plan-set targets.
DUO = {"name": "duo", "modules": [
    {"name": "a", "kind": "linear",
     "parameters": [{"name": "weight", "shape": [32, 16]}]},
    {"name": "b", "kind": "linear",
     "parameters": [{"name": "weight", "shape": [16, 32]}]}]}
DUO_TP = [{"pattern": "a", "style": "colwise"},
          {"pattern": "b", "style": "rowwise"}]
DUO_SPECS = {
    "duo-fsdp2": {"mesh": {"axes": axes(fsdp=2)},
                  "data_parallel": {"shard_axes": ["fsdp"]}},
    "duo-fsdp3-fp8": {"mesh": {"axes": axes(fsdp=3)},
                      "data_parallel": {"shard_axes": ["fsdp"]},
                      "mixed_precision": BF16,
                      "float8": {"all_gather": True}},
    "duo-hsdp2x2-sr": {"mesh": {"axes": axes(r=2, s=2),
                                "managed_axes": ["r"]},
                       "data_parallel": {"replicate_axes": ["r"],
                                         "shard_axes": ["s"]},
                       "mixed_precision": BF16,
                       "optimizer": {"name": "adamw",
                                     "param_dtype": "bfloat16",
                                     "stochastic_rounding": True}},
    "duo-fsdp2-tp2": {"mesh": {"axes": axes(dp=2, tp=2)},
                      "data_parallel": {"shard_axes": ["dp"]},
                      "tensor_parallel": {"axis": "tp", "plan": DUO_TP}},
    "duo-ddp2-order": {"mesh": {"axes": axes(dp=2),
                                "device_order": [1, 0]},
                       "data_parallel": {"replicate_axes": ["dp"]},
                       "gradient_accumulation_steps": 2},
}


def spec_seeds(tmp):
    clear("spec", ["example", "test", "gen", "bytes"])
    # Inputs for fuzz-spec's generator (fuzz/SpecGenerator.h): any bytes
    # that do not start with '{'.
    import random
    rng = random.Random(12)
    for i in range(16):
        data = bytes([1 + i]) + bytes(rng.randrange(256) for _ in range(127))
        with open(f"{CORPUS}/spec/bytes-{i:02d}.bin", "wb") as f:
            f.write(data)
    # Preset models: resolved (and the tiny ones planned) as they are.
    for path in sorted(glob.glob("examples/specs/*.json") +
                       glob.glob("test/runtime/specs/*.json") +
                       glob.glob("test/planner/Inputs/plan/*.json") +
                       glob.glob("test/planner/Inputs/limits/*.json") +
                       glob.glob("test/trainer/specs/*.json")):
        try:
            doc = json.load(open(path))
        except ValueError:
            continue
        if "model" not in doc:
            continue  # a model, not a spec
        doc.pop("$schema", None)
        doc.pop("description", None)
        prefix = "example" if path.startswith("examples") else "test"
        name = f"{prefix}-{os.path.basename(path)}"
        model = doc.get("model", "")
        if model.endswith(".json"):
            # A model file: inline it after "---" (fuzz/fuzz-spec.cpp).
            model_path = os.path.join(os.path.dirname(path), model)
            if not os.path.exists(model_path):
                continue
            m = json.load(open(model_path))
            m.pop("$schema", None)
            if len(json.dumps(m)) > 9000:
                continue  # keep seeds small
            write("spec", name, compact(doc) + "---\n" + compact(m))
        else:
            write("spec", name, compact(doc))
    mini = mini_model()
    for name, spec in MINI_SPECS.items():
        doc = {"model": "mini.json"}
        doc.update(spec)
        write("spec", f"gen-{name}.json", compact(doc) + "---\n" + compact(mini))
        with open(f"{tmp}/{name}.json", "w") as f:
            json.dump(doc, f)
    for name, spec in DUO_SPECS.items():
        doc = {"model": "duo.json"}
        doc.update(spec)
        write("spec", f"gen-{name}.json", compact(doc) + "---\n" + compact(DUO))
        with open(f"{tmp}/{name}.json", "w") as f:
            json.dump(doc, f)
    with open(f"{tmp}/mini.json", "w") as f:
        json.dump(mini, f)
    with open(f"{tmp}/duo.json", "w") as f:
        json.dump(DUO, f)


def run(*args):
    subprocess.run([MESHPLAN, *args], check=True, stdout=subprocess.DEVNULL)


def plan_seeds(tmp):
    clear("plan", ["test", "gen"])
    clear("plan-set", ["test", "gen"])
    for d in sorted(glob.glob("test/planner/Inputs/verify/*")):
        ranks = sorted(glob.glob(f"{d}/rank*.json"))
        for r in ranks:
            shutil.copy(r, f"{CORPUS}/plan/test-verify-{os.path.basename(d)}-{os.path.basename(r)}")
        write("plan-set", f"test-verify-{os.path.basename(d)}.txt",
              "---\n".join(open(r).read() for r in ranks))
    # Two plans of the mini model (embedding, norms, sequence parallel,
    # float8), the rest of the duo model (a few KB each).
    for name in ("fsdp2-tp2", "fsdp3-fp8"):
        run("plan", "--spec", f"{tmp}/{name}.json", "--rank", "0", "-o",
            f"{tmp}/plans-{name}")
        shutil.copy(f"{tmp}/plans-{name}/rank0.json",
                    f"{CORPUS}/plan/gen-{name}-rank0.json")
    for name in DUO_SPECS:
        out = f"{tmp}/plans-{name}"
        run("plan", "--spec", f"{tmp}/{name}.json", "--all", "-o", out)
        ranks = sorted(glob.glob(f"{out}/rank*.json"),
                       key=lambda p: int(p.split("rank")[-1][:-5]))
        for r in (ranks[0], ranks[-1]):
            shutil.copy(r, f"{CORPUS}/plan/gen-{name}-{os.path.basename(r)}")
        if len(ranks) <= 4:
            write("plan-set", f"gen-{name}.txt",
                  "---\n".join(open(r).read() for r in ranks))


def checkpoint_seeds(tmp):
    clear("checkpoint", ["gen"])
    for name in ("duo-fsdp2", "duo-fsdp2-tp2"):
        run("plan", "--spec", f"{tmp}/{name}.json", "--rank", "0", "-o",
            f"{tmp}/one-{name}")
        subprocess.run(["python3", "test/checkpoint/make_safetensors.py",
                        f"{tmp}/one-{name}/rank0.json", "-o",
                        f"{tmp}/{name}.safetensors"], check=True)
        run("ckpt", "import", f"{tmp}/{name}.safetensors", "--spec",
            f"{tmp}/{name}.json", "-o", f"{tmp}/ckpt-{name}")
        shutil.copy(f"{tmp}/ckpt-{name}/checkpoint.json",
                    f"{CORPUS}/checkpoint/gen-{name}.json")


def dist_seeds(tmp):
    """The dialect's lit inputs, one seed per split-input-file chunk, with
    the comment lines (RUN, CHECK, expected-error) dropped; and the module
    the planner imports for the mini model, after import and after the last
    pass (--dump-ir)."""
    clear("dist", ["test", "gen"])
    import hashlib
    for path in sorted(glob.glob("test/Dialect/Dist/*.mlir") +
                       glob.glob("test/Transforms/*.mlir") +
                       glob.glob("test/Transforms/Inputs/*.mlir")):
        text = open(path).read()
        for i, chunk in enumerate(text.split("// -----")):
            lines = [l for l in chunk.splitlines()
                     if not l.lstrip().startswith("//")]
            body = "\n".join(lines).strip() + "\n"
            if len(body) < 8:
                continue
            base = os.path.basename(path)[:-5]
            if len(body) > 20000:
                continue
            write("dist", f"test-{base}-{i}.mlir", body)
    run("plan", "--spec", f"{tmp}/duo-fsdp2-tp2.json", "--rank", "0", "-o",
        f"{tmp}/dump-plan", "--dump-ir", f"{tmp}/dump")
    dumps = sorted(glob.glob(f"{tmp}/dump/*.mlir"))
    for path in (dumps[0], dumps[-1]):
        shutil.copy(path, f"{CORPUS}/dist/gen-duo-fsdp2-tp2-{os.path.basename(path)}")


with tempfile.TemporaryDirectory() as tmp:
    spec_seeds(tmp)
    dist_seeds(tmp)
    plan_seeds(tmp)
    checkpoint_seeds(tmp)
for target in ("spec", "plan", "plan-set", "checkpoint", "dist"):
    files = glob.glob(f"{CORPUS}/{target}/*")
    print(f"{target}: {len(files)} seeds, {sum(os.path.getsize(f) for f in files)} bytes")
