"""meshplan.Spec, plan, verify, explain and tune against the C++ planner."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

import meshplan
from common import CLI, EXAMPLES, SOURCE_DIR, fsdp_spec


def test_spec_from_file_and_dict_agree():
    from_file = meshplan.spec(EXAMPLES / "fsdp-tp.json")
    from_dict = meshplan.spec(json.loads(from_file.text), base_dir=EXAMPLES)
    assert from_file.model == from_dict.model == "llama3-8b"
    assert from_file.world_size == 8
    assert from_file.mesh == "dp_shard=4,tp=2"
    assert [u["name"] for u in from_file.units] == [u["name"] for u in from_dict.units]
    assert from_file.params[0]["name"] == "tok_embeddings.weight"


def test_plan_matches_the_cli_byte_for_byte(tmp_path):
    # The CLI and the package call the same planner: the same plan files.
    spec = EXAMPLES / "fsdp-tp.json"
    subprocess.run(
        [CLI, "plan", "--spec", spec, "--all", "-o", tmp_path / "plans"],
        check=True,
        capture_output=True,
    )
    plans = meshplan.plan(spec)
    assert len(plans) == 8
    for p in plans:
        assert p.to_json() == (tmp_path / "plans" / f"rank{p.rank}.json").read_text()
    assert meshplan.plan(spec, 5) == plans[5]
    assert meshplan.load_plans(str(tmp_path / "plans"))[5] == plans[5]


def test_verify_proves_agreement_and_finds_divergence():
    plans = meshplan.plan(EXAMPLES / "fsdp-tp.json")
    result = meshplan.verify(plans)
    assert result and result.failure is None
    assert result.stats["ranks"] == 8 and result.stats["collectives"] > 0
    # Rank 1's plan of another spec on the same mesh: its collectives differ.
    other = meshplan.spec(EXAMPLES / "fsdp-tp.json")
    doc = json.loads(other.text)
    doc["data_parallel"]["reshard_after_forward"] = False
    other_plans = meshplan.plan(meshplan.spec(doc, base_dir=EXAMPLES))
    mixed = [other_plans[1] if p.rank == 1 else p for p in plans]
    result = meshplan.verify(mixed)
    assert not result
    assert result.failure["kind"] in ("divergence", "deadlock")
    assert result.failure["message"]
    with pytest.raises(meshplan.PlanError):
        meshplan.verify(plans[:3])  # ranks missing


def test_plan_round_trips_through_json_and_files(tmp_path):
    p = meshplan.plan(fsdp_spec(2), 1)
    assert meshplan.Plan.from_json(p.to_json()) == p
    p.save(str(tmp_path / "rank1.json"))
    assert meshplan.Plan.load(str(tmp_path / "rank1.json")) == p
    assert not list(tmp_path.glob("*.tmp"))
    assert p.rank == 1 and p.world_size == 2
    assert {b["kind"] for b in p.buffers} >= {"param_shard", "gradient", "optimizer_state"}
    assert p.optimizer["name"] == "adamw"
    assert ("backward", "layers.0") in p.units


def test_explain_is_the_cli_json():
    spec = EXAMPLES / "fsdp-tp.json"
    ours = meshplan.plan(spec, 3).explain()
    cli = subprocess.run(
        [CLI, "explain", "--spec", spec, "--rank", "3", "--json"],
        check=True,
        capture_output=True,
        text=True,
    )
    assert ours == json.loads(cli.stdout)
    assert ours["rank"] == 3 and ours["memory"]["capacity"]["fits"]
    small = meshplan.plan(spec, 3).explain(device="h200", device_memory=1 << 30)
    assert not small["memory"]["capacity"]["fits"]


def test_plan_charges_the_work_the_cli_charges(tmp_path):
    # One rule for the cost model's work (frontend::microbatchWork): the
    # spec's "batch" unless a keyword overrides it, as `meshplan explain`.
    doc = json.loads(meshplan.spec(EXAMPLES / "fsdp-tp.json").text)
    doc["batch"] = {"global_tokens": 4 * 2048, "sequence_length": 1024}
    path = tmp_path / "batch.json"
    path.write_text(json.dumps(doc))

    def cli(*flags):
        run = subprocess.run(
            [CLI, "explain", "--spec", path, "--rank", "3", "--json", *flags],
            check=True,
            capture_output=True,
            text=True,
        )
        return json.loads(run.stdout)

    def tokens(explained):
        return explained["memory"]["activations"]["tokens_per_rank"]

    ours = meshplan.plan(path, 3).explain()
    assert ours == cli() and tokens(ours) == 2048  # 8192 over 4 dp ranks
    ours = meshplan.plan(path, 3, tokens_per_rank=512).explain()
    assert ours == cli("--tokens-per-rank", "512") and tokens(ours) == 512
    ours = meshplan.plan(path, 3, global_batch_tokens=16384, seq_len=512).explain()
    assert ours == cli("--global-batch-tokens", "16384", "--seq-len", "512")
    assert tokens(ours) == 4096
    # Without a batch in the spec: 8192 tokens of sequences of 8192.
    assert tokens(meshplan.plan(EXAMPLES / "fsdp-tp.json", 3).explain()) == 8192


def test_explain_of_a_pipeline_lays_out_every_stage():
    # plan(spec, rank) plans the rank's pp coordinate only; explain plans
    # the others for the per-stage table, as `meshplan explain` does.
    spec = SOURCE_DIR / "test" / "planner" / "Inputs" / "pipeline" / "tiny-1f1b-pp4.json"
    ours = meshplan.plan(spec, 0).explain()
    cli = subprocess.run(
        [CLI, "explain", "--spec", spec, "--rank", "0", "--json"],
        check=True,
        capture_output=True,
        text=True,
    )
    assert ours == json.loads(cli.stdout)
    assert len(ours["pipeline"]["ranks"]) == ours["pipeline"]["size"] == 4


def test_tune_candidates_plan():
    candidates = meshplan.tune("tiny", 8, confirm=2)
    assert candidates
    steps = [c["step_seconds"] for c in candidates]
    assert steps == sorted(steps)
    best = candidates[0]
    assert best["fits"] and best["spec"].world_size == 8
    plans = meshplan.plan(best["spec"])
    assert meshplan.verify(plans)


@pytest.mark.parametrize(
    "doc, pointer, words",
    [
        ({"model": "tiny", "mesh": {"axes": [{"name": "dp", "size": 0}]}}, "/mesh/axes/0/size", ""),
        ({"model": "no-such-model", "mesh": {"axes": [{"name": "dp", "size": 2}]},
          "data_parallel": {"shard_axes": ["dp"]}}, "/model", "no-such-model"),
        ({"model": "tiny", "mesh": {"axes": [{"name": "dp", "size": 2}]},
          "data_parallel": {"shard_axes": ["xx"]}}, "/data_parallel/shard_axes/0", "xx"),
    ],
)
def test_spec_errors_carry_the_json_pointer(doc, pointer, words):
    with pytest.raises(meshplan.SpecError) as e:
        meshplan.spec(doc)
    assert e.value.pointer == pointer, str(e.value)
    assert words in str(e.value)


def test_spec_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": "tiny", "mesh": ')
    with pytest.raises(meshplan.SpecError) as e:
        meshplan.spec(bad)
    assert str(bad) in str(e.value)
    with pytest.raises(meshplan.SpecError) as e:
        meshplan.spec(tmp_path / "missing.json")
    assert "missing.json" in str(e.value)
    with pytest.raises(meshplan.SpecError) as e:
        meshplan.spec(fsdp_spec(2), world_size=4)
    with pytest.raises(meshplan.SpecError, match="rank: 9"):
        meshplan.plan(fsdp_spec(2), 9)
    with pytest.raises(meshplan.SpecError, match="tokens_per_rank: must be > 0, not 0"):
        meshplan.plan(fsdp_spec(2), 0, tokens_per_rank=0)
    with pytest.raises(meshplan.SpecError, match="seq_len: must be > 0"):
        meshplan.plan(fsdp_spec(2), 0, seq_len=-1)
    with pytest.raises(meshplan.SpecError, match="give it or global_batch_tokens, not both"):
        meshplan.plan(fsdp_spec(2), 0, tokens_per_rank=8, global_batch_tokens=64)
    with pytest.raises(meshplan.SpecError, match="global_batch_tokens: 105 tokens do not split"):
        meshplan.plan(fsdp_spec(2), 0, global_batch_tokens=105, seq_len=10)
    # The keyword's old name says what replaced it (the CLI refuses --tokens).
    with pytest.raises(TypeError, match="tokens_per_rank="):
        meshplan.plan(fsdp_spec(2), 0, tokens=8192)
    with pytest.raises(TypeError, match="global_batch_tokens="):
        meshplan.tune("tiny", 8, tokens_per_step=8192)
    with pytest.raises(TypeError, match="'tokenz'"):
        meshplan.plan(fsdp_spec(2), 0, tokenz=1)


def test_corrupt_plans_raise_plan_error(tmp_path):
    p = json.loads(meshplan.plan(fsdp_spec(2), 0).to_json())
    p["program"][3]["comm"] = "c9"
    with pytest.raises(meshplan.PlanError) as e:
        meshplan.Plan.from_json(json.dumps(p))
    assert e.value.pointer == "/program/3/comm"
    truncated = tmp_path / "rank0.json"
    truncated.write_text(meshplan.plan(fsdp_spec(2), 0).to_json()[:500])
    with pytest.raises(meshplan.PlanError, match="rank0.json"):
        meshplan.Plan.load(str(truncated))
    read = meshplan.Plan.from_json(meshplan.plan(fsdp_spec(2), 0).to_json())
    with pytest.raises(meshplan.Error, match="explain needs"):
        read.explain()


def test_type_stubs_are_installed():
    stub = os.path.join(os.path.dirname(meshplan.__file__), "_meshplan.pyi")
    text = open(stub).read()
    assert "class Session" in text and "def step(self)" in text
    assert os.path.exists(os.path.join(os.path.dirname(meshplan.__file__), "py.typed"))
