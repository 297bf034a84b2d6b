//===- Schema.cpp - The key tables behind the spec and model parsers ------===//
//
// The one definition of which keys each object accepts. docs/spec.md and the
// JSON Schemas in docs/ describe these tables; unittests/Frontend/SchemaTest
// checks the schemas against them.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Frontend/Schema.h"
#include "meshplan/Frontend/Model.h"
#include "meshplan/Frontend/Spec.h"

#include <cassert>

namespace meshplan::frontend {

template <size_t N>
static std::vector<std::string_view>
names(const std::array<std::string_view, N> &array) {
  return std::vector<std::string_view>(array.begin(), array.end());
}

using T = JsonType;

/// The schedules core builds, by their spec spelling (core's
/// pipelineScheduleKindName, which parsePipelineScheduleKind reads back).
static std::vector<std::string_view> pipelineScheduleNames() {
  std::vector<std::string_view> out;
  for (PipelineScheduleKind kind :
       {PipelineScheduleKind::GPipe, PipelineScheduleKind::OneFOneB,
        PipelineScheduleKind::Interleaved1F1B,
        PipelineScheduleKind::ZeroBubbleV})
    out.push_back(pipelineScheduleKindName(kind));
  return out;
}

const std::vector<SectionRule> &specSections() {
  static const std::vector<SectionRule> sections = {
      {"",
       {
           {.name = "$schema", .type = T::String},
           {.name = "description", .type = T::String},
           {.name = "model", .type = T::String, .required = true},
           {.name = "world_size", .type = T::Integer},
           {.name = "mesh",
            .type = T::Object,
            .required = true,
            .section = "mesh"},
           {.name = "data_parallel",
            .type = T::Object,
            .section = "data_parallel"},
           {.name = "tensor_parallel",
            .type = T::Object,
            .section = "tensor_parallel"},
           {.name = "extra_axes", .type = T::Array, .items = T::String},
           {.name = "pipeline_parallel",
            .type = T::Object,
            .section = "pipeline_parallel"},
           {.name = "mixed_precision",
            .type = T::Object,
            .section = "mixed_precision"},
           {.name = "float8", .type = T::Object, .section = "float8"},
           {.name = "optimizer", .type = T::Object, .section = "optimizer"},
           {.name = "gradient_accumulation_steps", .type = T::Integer},
           {.name = "gradient_accumulation",
            .type = T::Object,
            .section = "gradient_accumulation"},
           {.name = "activation_checkpointing",
            .type = T::String,
            .values = names(kActivationCheckpointingNames),
            .noun = "policy"},
           {.name = "batch", .type = T::Object, .section = "batch"},
       }},
      {"batch",
       {
           {.name = "global_tokens", .type = T::Integer, .required = true},
           {.name = "sequence_length", .type = T::Integer, .required = true},
       }},
      {"gradient_accumulation",
       {
           {.name = "steps", .type = T::Integer},
           {.name = "reduce",
            .type = T::String,
            .values = names(kAccumulationReduceNames),
            .noun = "mode"},
       }},
      {"mesh",
       {
           {.name = "axes",
            .type = T::Array,
            .required = true,
            .items = T::Object,
            .section = "mesh_axis"},
           {.name = "device_order", .type = T::Array, .items = T::Integer},
           {.name = "managed_axes", .type = T::Array, .items = T::String},
       }},
      {"mesh_axis",
       {
           {.name = "name", .type = T::String, .required = true},
           {.name = "size", .type = T::Integer, .required = true},
       }},
      {"data_parallel",
       {
           {.name = "replicate_axes", .type = T::Array, .items = T::String},
           {.name = "shard_axes", .type = T::Array, .items = T::String},
           {.name = "reshard_after_forward",
            .type = T::String,
            .values = names(kReshardPolicyNames),
            .noun = "policy"},
           {.name = "units", .type = T::Array, .items = T::Array},
       }},
      {"tensor_parallel",
       {
           {.name = "axis", .type = T::String, .required = true},
           {.name = "plan",
            .type = T::Array,
            .required = true,
            .items = T::Object,
            .section = "tp_rule"},
       }},
      {"pipeline_parallel",
       {
           {.name = "axis", .type = T::String, .required = true},
           {.name = "schedule",
            .type = T::String,
            .required = true,
            .values = pipelineScheduleNames()},
           {.name = "microbatches", .type = T::Integer, .required = true},
           {.name = "stages_per_rank", .type = T::Integer},
           {.name = "split", .type = T::Array, .items = T::Array},
       }},
      {"tp_rule",
       {
           {.name = "pattern", .type = T::String, .required = true},
           {.name = "style",
            .type = T::String,
            .required = true,
            .values = names(kTPStyleNames)},
       }},
      {"mixed_precision",
       {
           {.name = "param_dtype",
            .type = T::String,
            .values = names(kComputeDTypeNames),
            .noun = "dtype"},
           {.name = "reduce_dtype",
            .type = T::String,
            .values = names(kComputeDTypeNames),
            .noun = "dtype"},
       }},
      {"float8",
       {
           {.name = "enabled", .type = T::Boolean},
           {.name = "all_gather", .type = T::Boolean},
           {.name = "modules", .type = T::Array, .items = T::String},
           {.name = "exclude", .type = T::Array, .items = T::String},
           {.name = "scaling",
            .type = T::String,
            .values = names(kFloat8ScalingNames)},
           {.name = "power_of_2_scales", .type = T::Boolean},
       }},
      {"optimizer",
       {
           {.name = "name",
            .type = T::String,
            .values = names(kOptimizerNames),
            .noun = "optimizer"},
           {.name = "lr", .type = T::Number},
           {.name = "betas", .type = T::Array, .items = T::Number, .length = 2},
           {.name = "eps", .type = T::Number},
           {.name = "weight_decay", .type = T::Number},
           {.name = "param_dtype",
            .type = T::String,
            .values = names(kOptimizerDTypeNames),
            .noun = "dtype"},
           {.name = "stochastic_rounding", .type = T::Boolean},
           {.name = "seed", .type = T::Integer},
           {.name = "lr_schedule", .type = T::Object, .section = "lr_schedule"},
           {.name = "max_norm", .type = T::Number},
           {.name = "norm_type", .type = T::Number},
           {.name = "no_decay", .type = T::Array, .items = T::String},
       }},
      {"lr_schedule",
       {
           {.name = "warmup_steps", .type = T::Integer},
           {.name = "decay_ratio", .type = T::Number},
           {.name = "decay_type",
            .type = T::String,
            .values = names(kLrDecayTypeNames),
            .noun = "decay type"},
           {.name = "min_lr_factor", .type = T::Number},
           {.name = "total_steps", .type = T::Integer},
       }},
  };
  return sections;
}

const std::vector<KeyAlternative> &specKeyAlternatives() {
  static const std::vector<KeyAlternative> alternatives = {
      {"data_parallel", "reshard_after_forward", T::Boolean},
      {"data_parallel", "units", T::String, names(kUnitGroupingNames)},
      {"pipeline_parallel", "split", T::String, names(kPipelineSplitNames)},
      {"optimizer", "norm_type", T::String, {"inf"}},
  };
  return alternatives;
}

const std::vector<SectionRule> &modelSections() {
  static const std::vector<SectionRule> sections = {
      {"",
       {
           {.name = "$schema", .type = T::String},
           {.name = "name", .type = T::String, .required = true},
           {.name = "description", .type = T::String},
           {.name = "modules",
            .type = T::Array,
            .required = true,
            .items = T::Object,
            .section = "module"},
       }},
      {"module",
       {
           {.name = "name", .type = T::String, .required = true},
           {.name = "kind",
            .type = T::String,
            .required = true,
            .values = names(kModuleKindNames)},
           {.name = "parameters",
            .type = T::Array,
            .items = T::Object,
            .section = "parameter"},
           {.name = "children",
            .type = T::Array,
            .items = T::Object,
            .section = "module"},
           {.name = "n_heads", .type = T::Integer},
           {.name = "n_kv_heads", .type = T::Integer},
       }},
      {"parameter",
       {
           {.name = "name", .type = T::String, .required = true},
           {.name = "shape",
            .type = T::Array,
            .required = true,
            .items = T::Integer},
           {.name = "dtype", .type = T::String, .values = names(kDTypeNames)},
       }},
  };
  return sections;
}

const SectionRule &findSection(const std::vector<SectionRule> &sections,
                               std::string_view name) {
  for (const SectionRule &section : sections)
    if (section.name == name)
      return section;
  assert(false && "unknown section");
  return sections.front();
}

} // namespace meshplan::frontend
