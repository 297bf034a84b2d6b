"""`meshplan ckpt import|export --format hf-llama` against transformers
(docs/checkpoint-format.md, "Hugging Face Llama").

A small random LlamaForCausalLM (the tiny preset's dims: dim 64, 2 layers, 4
heads, 2 kv heads, ffn 128, vocab 256; no download) is saved with
save_pretrained, tied and untied, whole and sharded; imported into an FSDP 2 x
TP 2 checkpoint; meshplan-train (4 processes under `meshplan run`) loads it
and prints the loss of its first step, which must be the transformers model's
loss on the same tokens; the export read back by transformers gives the
original tensors bit for bit. Bad HF input: one located line, exit 2,
nothing written.
"""

from __future__ import annotations

import json
import math
import pathlib
import re
import subprocess

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from common import BUILD_DIR, CLI, SOURCE_DIR  # noqa: E402

TRAIN = BUILD_DIR / "bin" / "meshplan-train"
LOSS = BUILD_DIR / "bin" / "meshplan-loss"
# FSDP over 2 x TP 2 with torchtitan's plan, fp32 (its model replaced by
# --model tiny).
SPEC = SOURCE_DIR / "test" / "trainer" / "specs" / "fsdp2-tp2-6l.json"
SEQ_LEN = 32


def hf_config(tied: bool, **extra):
    kwargs = dict(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
        rope_theta=500000.0, tie_word_embeddings=tied, max_position_embeddings=256,
    )
    kwargs.update(extra)
    return transformers.LlamaConfig(**kwargs)


def random_model(tied: bool, seed: int):
    """Weights large enough that attention and the RoPE pairing matter for
    the loss (transformers' 0.02 init leaves the logits near uniform, and a
    wrong q/k row order would hardly show)."""
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(hf_config(tied)).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.normal_(0, 1)
            else:
                p.normal_(0, 0.35)
    return model


def save(model, directory: pathlib.Path, **kwargs) -> pathlib.Path:
    model.save_pretrained(directory, safe_serialization=True, **kwargs)
    return directory


def ckpt(*args, check=True):
    return subprocess.run([str(CLI), "ckpt", *map(str, args)], capture_output=True,
                          text=True, check=check)


def import_hf(src, out):
    return ckpt("import", src, "--format", "hf-llama", "--spec", SPEC, "--model", "tiny",
                "-o", out, check=False)


def tokens_file(tmp: pathlib.Path) -> tuple[pathlib.Path, bytes]:
    """A data file of SEQ_LEN + 1 bytes: meshplan-train appends a newline,
    which leaves two windows (starting at byte 0 or 1); returns the text as
    the trainer sees it."""
    text = b"Meshplan loads Llama from HF ok!"
    assert len(text) == SEQ_LEN
    text += b"?"
    path = tmp / "data.txt"
    path.write_bytes(text)
    return path, text + b"\n"


def _mix(x: int) -> int:
    m = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


def trainer_windows(text: bytes, sequences: int, step: int = 1, seed: int = 0) -> list[list[int]]:
    """The token streams (SEQ_LEN + 1 bytes: tokens, then the last target)
    of the global batch of a step, as examples/trainer/Data.cpp picks them
    (one microbatch; data-parallel rank d reads sequences [d B, (d+1) B))."""
    windows = len(text) - SEQ_LEN
    out = []
    for index in range(sequences):
        key = _mix(_mix(_mix(seed) ^ step) ^ (0 << 32)) ^ index
        start = _mix(key) % windows
        out.append(list(text[start:start + SEQ_LEN + 1]))
    return out


def hf_loss(model, stream: list[int]) -> float:
    ids = torch.tensor([stream[:-1]])
    with torch.no_grad():
        logits = model(ids).logits.float()
    return torch.nn.functional.cross_entropy(logits[0], torch.tensor(stream[1:])).item()


def meshplan_loss(checkpoint: pathlib.Path, data: pathlib.Path) -> float:
    run = subprocess.run(
        [str(CLI), "run", "--timeout", "120", "-n", "4", "--", str(TRAIN), "--spec", str(SPEC),
         "--model", "tiny", "--steps", "1", "--batch", "2", "--seq-len", str(SEQ_LEN),
         "--data", str(data), "--load-checkpoint", str(checkpoint)],
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    found = re.search(r"step 1/1 loss (\d+\.\d+)", run.stdout)
    assert found, run.stdout
    return float(found.group(1))


def assert_same_tensors(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert torch.equal(a[name].view(torch.uint8) if a[name].dtype.is_floating_point else a[name],
                           b[name].view(torch.uint8) if b[name].dtype.is_floating_point else b[name]), name


@pytest.mark.parametrize("tied,shard", [(False, None), (True, None), (False, "40KB")])
def test_import_computes_the_transformers_loss_and_exports_back(tmp_path, tied, shard):
    model = random_model(tied, seed=7 if tied else 3)
    src = save(model, tmp_path / "hf", **({"max_shard_size": shard} if shard else {}))
    if shard:
        assert (src / "model.safetensors.index.json").exists()
        assert len(list(src.glob("model-*-of-*.safetensors"))) > 1
    out = tmp_path / "ckpt"
    imported = import_hf(src, out)
    assert imported.returncode == 0, imported.stderr
    assert "(hf-llama" + (", tied embeddings" if tied else "") + ")" in imported.stdout
    verified = ckpt("verify", out)
    assert verified.stdout.startswith(f"verified {out}:")
    inspect = ckpt("inspect", out).stdout
    assert "from:       " + str(src) + " (hf-llama; " in inspect

    # The same loss on the same tokens, to the 4 decimals meshplan-train
    # prints (its fp32 forward under FSDP 2 x TP 2 with sequence parallelism
    # and a vocabulary-parallel cross-entropy).
    data, text = tokens_file(tmp_path)
    stream = list(text[:SEQ_LEN + 1])
    (tmp_path / "stream.bin").write_bytes(bytes(stream))
    reference = hf_loss(model, stream)
    # meshplan-train's step loss: the mean over its global batch (2 data-
    # parallel ranks x 2 sequences, each window 0 or 1 of the text).
    batch = trainer_windows(text, 4)
    batch_reference = sum(hf_loss(model, w) for w in batch) / len(batch)
    # Non-vacuous: far from uniform logits, and HF's q/k rows read without
    # the inverse permutation give another loss.
    assert abs(reference - math.log(256)) > 0.5
    wrong = random_model(tied, seed=7 if tied else 3)
    hd = 16
    with torch.no_grad():
        for layer in wrong.model.layers:
            for proj, heads in ((layer.self_attn.q_proj, 4), (layer.self_attn.k_proj, 2)):
                rows = [h * hd + (w % 2) * (hd // 2) + w // 2
                        for h in range(heads) for w in range(hd)]
                proj.weight.copy_(proj.weight[rows])
    assert abs(hf_loss(wrong, stream) - reference) > 1e-2
    loss = meshplan_loss(out, data)
    assert abs(loss - batch_reference) <= 1e-4, (loss, batch_reference)
    # To fp32 noise: meshplan-loss runs the same model code on the whole
    # tensors in one process and prints 9 digits.
    precise = subprocess.run([str(LOSS), out, "--heads", "4", "--kv-heads", "2", "--tokens",
                              tmp_path / "stream.bin"], capture_output=True, text=True)
    assert precise.returncode == 0, precise.stderr
    value = float(precise.stdout.split()[1])
    print(f"loss: transformers {reference:.9g}, meshplan-loss {value:.9g}, "
          f"batch: transformers {batch_reference:.9g}, meshplan-train (FSDP 2 x TP 2) "
          f"{loss:.4f}; HF rows not unpermuted "
          f"{hf_loss(wrong, stream):.9g}")
    assert abs(value - reference) <= 1e-5 * reference, (value, reference)

    # Export and reload: transformers gets back the tensors it saved.
    exported = tmp_path / "export"
    flags = ["--max-shard-size", shard] if shard else []
    done = ckpt("export", out, "--format", "hf-llama", "-o", exported, *flags)
    assert f"({'tied' if tied else 'untied'} embeddings" in done.stdout
    original = {}
    for f in sorted(src.glob("*.safetensors")):
        original.update(safetensors_torch.load_file(f))
    again = {}
    for f in sorted(exported.glob("*.safetensors")):
        again.update(safetensors_torch.load_file(f))
    assert_same_tensors(original, again)
    assert (exported / "model.safetensors.index.json").exists() == bool(shard)
    reloaded = transformers.LlamaForCausalLM.from_pretrained(exported).eval()
    assert reloaded.config.tie_word_embeddings == tied
    assert_same_tensors(dict(model.state_dict()), dict(reloaded.state_dict()))
    assert hf_loss(reloaded, stream) == reference


def first_error_line(run) -> str:
    assert run.returncode == 2, (run.returncode, run.stdout, run.stderr)
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    return lines[0]


def edit_config(directory: pathlib.Path, **changes):
    path = directory / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None and key in config:
            del config[key]
        else:
            config[key] = value
    path.write_text(json.dumps(config))


def test_bad_hf_input_is_one_located_line_and_writes_nothing(tmp_path):
    model = random_model(False, seed=1)
    base = save(model, tmp_path / "base")
    sharded = save(model, tmp_path / "sharded", max_shard_size="40KB")
    tensors = safetensors_torch.load_file(base / "model.safetensors")

    def variant(name, tensors_of=None, **config):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text((base / "config.json").read_text())
        safetensors_torch.save_file(tensors_of if tensors_of is not None else tensors,
                                    d / "model.safetensors", metadata={"format": "pt"})
        if config:
            edit_config(d, **config)
        return d

    cases = []
    missing = dict(tensors)
    del missing["model.layers.1.mlp.up_proj.weight"]
    cases.append((variant("missing", missing),
                  r'missing/model\.safetensors: no tensor "model\.layers\.1\.mlp\.up_proj\.weight" '
                  r"\(meshplan's layers\.1\.feed_forward\.w3\.weight\)"))
    extra = dict(tensors)
    extra["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.zeros(8)
    cases.append((variant("extra", extra),
                  r'extra/model\.safetensors: tensor "model\.layers\.0\.self_attn\.rotary_emb\.inv_freq" '
                  r"is not a tensor of LlamaForCausalLM"))
    shape = dict(tensors)
    shape["model.norm.weight"] = torch.ones(32)
    cases.append((variant("shape", shape),
                  r'shape/model\.safetensors: tensor "model\.norm\.weight" \(meshplan\'s norm\.weight\) '
                  r"has shape \[32\] in the file but \[64\] in the plan of model tiny"))
    cases.append((variant("kvheads", num_key_value_heads=4),
                  r"kvheads/config\.json: /num_key_value_heads: 4, but the model's n_kv_heads is 2"))
    cases.append((variant("theta", rope_parameters={"rope_theta": 10000.0, "rope_type": "default"}),
                  r"theta/config\.json: /rope_parameters/rope_theta: 10000\.0, but meshplan's Llama "
                  r"rotates with theta 500000\.0"))
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    cases.append((variant("llama3", rope_parameters=None, rope_theta=500000.0, rope_scaling=llama3),
                  r'llama3/config\.json: /rope_scaling: \{.*"rope_type":"llama3".*\}: meshplan\'s Llama '
                  r"implements plain RoPE only"))
    cases.append((variant("llama3v5", rope_parameters=dict(llama3, rope_theta=500000.0)),
                  r'llama3v5/config\.json: /rope_parameters/rope_type: "llama3": meshplan\'s Llama '
                  r"implements plain RoPE only"))
    cases.append((variant("eps", rms_norm_eps=1e-6),
                  r"eps/config\.json: /rms_norm_eps: 1e-06, but meshplan's Llama normalizes with eps"))
    tied = dict(tensors)
    cases.append((variant("tiedlm", tied, tie_word_embeddings=True),
                  r'tiedlm/model\.safetensors: tensor "lm_head\.weight", but .*tiedlm/config\.json says '
                  r"tie_word_embeddings: true"))
    untied = dict(tensors)
    del untied["lm_head.weight"]
    cases.append((variant("nolm", untied),
                  r'nolm/model\.safetensors: no tensor "lm_head\.weight" \(meshplan\'s output\.weight\); '
                  r".*says tie_word_embeddings: false"))
    noconfig = variant("noconfig")
    (noconfig / "config.json").unlink()
    cases.append((noconfig, r"noconfig/config\.json: missing"))

    # Broken indexes.
    def broken_index(name, edit):
        d = tmp_path / name
        d.mkdir()
        for f in sharded.iterdir():
            (d / f.name).write_bytes(f.read_bytes())
        index = d / "model.safetensors.index.json"
        index.write_text(edit(index.read_text()))
        return d

    cases.append((broken_index("badjson", lambda t: t[:-3]),
                  r"badjson/model\.safetensors\.index\.json: line \d+, column \d+"))
    cases.append((broken_index("nofile", lambda t: t.replace("model-00001-of", "model-00099-of")),
                  r"nofile/model-00099-of-\d+\.safetensors: missing, but .*index\.json maps tensors to it"))

    def move_one(t):
        doc = json.loads(t)
        name = "model.norm.weight"
        files = sorted(set(doc["weight_map"].values()))
        doc["weight_map"][name] = next(f for f in files if f != doc["weight_map"][name])
        return json.dumps(doc)

    cases.append((broken_index("moved", move_one),
                  r'moved/model-\d+-of-\d+\.safetensors: tensor "model\.norm\.weight" is mapped to '
                  r"model-\d+-of-\d+\.safetensors by"))

    def drop_one(t):
        doc = json.loads(t)
        del doc["weight_map"]["model.norm.weight"]
        return json.dumps(doc)

    cases.append((broken_index("unlisted", drop_one),
                  # Its shard names it but the index does not; or, when it
                  # was alone in its shard, the index no longer names the
                  # shard and the tensor is missing.
                  r'unlisted/(model-\d+-of-\d+\.safetensors: tensor "model\.norm\.weight" is not in '
                  r'|model\.safetensors\.index\.json: no tensor "model\.norm\.weight")'))
    cases.append((broken_index("escape", lambda t: t.replace('"model-00001-of', '"../model-00001-of')),
                  r'escape/model\.safetensors\.index\.json: /weight_map/.*: "\.\./model-00001-of-\d+\.'
                  r'safetensors" is not a file name in the index\'s directory'))

    for i, (src, pattern) in enumerate(cases):
        out = tmp_path / f"out{i}"
        line = first_error_line(import_hf(src, out))
        assert line.startswith("meshplan: error: "), line
        assert re.search(pattern, line), (pattern, line)
        assert not out.exists() and not (tmp_path / f".out{i}.partial").exists()


def test_export_refuses_an_existing_directory_and_bad_sizes(tmp_path):
    src = save(random_model(True, seed=2), tmp_path / "hf")
    out = tmp_path / "ckpt"
    assert import_hf(src, out).returncode == 0
    (tmp_path / "taken").mkdir()
    line = first_error_line(ckpt("export", out, "--format", "hf-llama", "-o", tmp_path / "taken",
                                 check=False))
    assert line.endswith("taken: exists; not replacing it")
    line = first_error_line(ckpt("export", out, "--format", "hf-llama", "-o", tmp_path / "x",
                                 "--max-shard-size", "12XB", check=False))
    assert '--max-shard-size: "12XB": expected a size' in line
    assert not (tmp_path / "x").exists()
