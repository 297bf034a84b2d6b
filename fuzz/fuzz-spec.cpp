//===- fuzz-spec.cpp - Spec + model reading, resolution and planning ------===//
//
// Input: a parallelism spec (docs/spec.md), optionally followed by a line
// "---" and a model document (docs/model.schema.json), which then replaces
// the spec's "model" as `meshplan plan --model FILE` does. Without one, the
// spec's model must be a preset (tiny, llama3-8b, ...): the target reads no
// files. An input that does not start with '{' is read by SpecGenerator.h
// instead, which makes both documents from its bytes.
//
// Checks, beyond the sanitizers:
//  - every refusal (parseSpec, parseModel, resolveSpec) has a message;
//  - a model prints (modelToJson) as a document that parses back the same;
//  - what resolveSpec accepts, the planner plans: the pipeline compiles it,
//    the template prepares, the first and last rank instantiate (or refuse
//    with a limit of docs/limits.md) into plans that validate and simulate
//    under the cost model (what `plan`, `explain` and `trace` do; a failure
//    there is meshplan's "internal error", exit 3), and on meshes of at
//    most 8 ranks the whole set verifies across ranks (what `plan --all`
//    checks before writing).
// Planning grows with the model, so it runs for models of at most 64
// parameter tensors (the tiny preset has 21); resolution runs for all.
//
//===----------------------------------------------------------------------===//

#include "FuzzSupport.h"
#include "SpecGenerator.h"

#include "meshplan/Frontend/Presets.h"
#include "meshplan/Frontend/Spec.h"
#include "meshplan/Pipeline/Pipeline.h"
#include "meshplan/Plan/Trace.h"
#include "meshplan/Plan/Verify.h"

using namespace meshplan;
using namespace meshplan::fuzz;

static constexpr size_t kMaxPlannedParams = 64;
static constexpr int64_t kMaxVerifiedRanks = 8;

static void planEverything(const frontend::ResolvedSpec &spec) {
  auto context = pipeline::makeContext();
  auto compiled = pipeline::compile(*context, spec);
  if (spec.pipeline) {
    // Resolved, not planned yet (issue 16): compile must say so, and
    // nothing else.
    check(!compiled && compiled.error().message.find("not planned yet") !=
                           std::string::npos,
          "a pipeline-parallel spec compiled, or failed otherwise");
    return;
  }
  check(bool(compiled), "the spec resolved but does not compile: " +
                            (compiled ? "" : compiled.error().message));
  auto prepared = plan::PreparedTemplate::prepare(compiled->program);
  check(bool(prepared), "the compiled template is invalid: " +
                            (prepared ? "" : prepared.error().message));
  const Mesh &mesh = prepared->mesh();
  for (int64_t position : {int64_t(0), mesh.size() - 1}) {
    int64_t rank = mesh.rankAt(position);
    auto planned = prepared->instantiate(rank);
    if (!planned) {
      // A limit the spec went past (a group of more than 2^20 listed
      // members) is the input's, reported with exit 2 by every command
      // that instantiates; anything else is the planner's.
      check(planned.error().message.find("(docs/limits.md)") !=
                std::string::npos,
            "rank " + std::to_string(rank) +
                " does not instantiate: " + planned.error().message);
      return;
    }
    auto valid = plan::validatePlan(*planned);
    check(bool(valid),
          "the plan of rank " + std::to_string(rank) +
              " does not validate: " + (valid ? "" : valid.error().message));
    auto schedule =
        plan::simulate(*planned, prepared->flops(), plan::CostModel{});
    check(bool(schedule), "the plan of rank " + std::to_string(rank) +
                              " does not simulate: " +
                              (schedule ? "" : schedule.error().message));
  }
  if (mesh.size() > kMaxVerifiedRanks)
    return;
  std::vector<plan::Plan> plans;
  for (int64_t rank : prepared->ranks()) {
    auto planned = prepared->instantiate(rank, /*withEstimates=*/false,
                                         /*verificationOnly=*/true);
    check(bool(planned), "rank " + std::to_string(rank) +
                             " does not instantiate for verification: " +
                             (planned ? "" : planned.error().message));
    plans.push_back(std::move(*planned));
  }
  auto report = plan::verifyPlans(plans);
  check(bool(report), "the planned set is unusable: " +
                          (report ? "" : report.error().message));
  check(report->ok(), "the planned set fails verification: " +
                          (report->ok() ? "" : report->failure->message));
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // Text ("{...}") is read as it is; other bytes choose a well-formed spec
  // and model (SpecGenerator.h), to reach the planner behind the reader.
  std::string generated;
  std::string_view text = asText(data, size);
  if (!text.empty() && text[0] != '{' && text[0] != ' ' && text[0] != '\n') {
    generated = SpecGenerator(data, size).generate();
    text = generated;
  }
  defectContext() = generated;
  auto documents = splitDocuments(text, 2);
  auto spec = frontend::parseSpec(documents[0]);
  if (!spec) {
    checkMessage(spec.error().message, "parseSpec");
    return 0;
  }
  std::shared_ptr<const frontend::Model> model;
  if (documents.size() == 2) {
    auto parsed = frontend::parseModel(documents[1]);
    if (!parsed) {
      checkMessage(parsed.error().message, "parseModel");
      return 0;
    }
    std::string printed = frontend::modelToJson(*parsed);
    auto again = frontend::parseModel(printed);
    check(bool(again), "modelToJson wrote a model parseModel refuses: " +
                           (again ? "" : again.error().message));
    check(frontend::modelToJson(*again) == printed,
          "parseModel(modelToJson(m)) differs from m");
    model = std::make_shared<const frontend::Model>(std::move(*parsed));
  } else {
    if (!frontend::findPreset(spec->model))
      return 0; // model files are not read here
    auto loaded = frontend::loadSpecModel(*spec, "");
    check(bool(loaded), "a preset does not load");
    model = std::move(*loaded);
  }
  auto resolved = frontend::resolveSpec(std::move(*spec), std::move(model));
  if (!resolved) {
    checkMessage(resolved.error().message, "resolveSpec");
    return 0;
  }
  if (resolved->params.size() <= kMaxPlannedParams)
    planEverything(*resolved);
  return 0;
}
