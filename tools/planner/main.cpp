//===- main.cpp - The meshplan command-line tool --------------------------===//
//
// Subcommands: plan, explain, trace, verify, mesh, layout, redistribute, run
// (the launcher; its exit codes are the job's: docs/runtime.md), ckpt
// (offline checkpoint commands: docs/checkpoint-format.md). Every
// user error prints one line "meshplan: error: <flag>: <what is wrong>" on
// stderr, exits with code 2 and prints nothing on stdout. `verify` exits with 1
// (report on stderr) when a well-formed plan set fails verification.
//
//===----------------------------------------------------------------------===//

#include "CkptCommands.h"
#include "CommandLine.h"
#include "Commands.h"
#include "PlanCommands.h"
#include "Progress.h"
#include "RunCommand.h"
#include "TraceCommand.h"
#include "TuneCommand.h"

#include <iostream>

using namespace meshplan::cli;

static void addMeshFlags(CLI::App *cmd, MeshFlags &flags) {
  cmd->add_option("--mesh", flags.mesh,
                  "Mesh axes, major to minor: name=size,... (e.g. dp=2,tp=4)")
      ->required();
  cmd->add_option("--order", flags.order,
                  "Device order: the rank at each row-major position "
                  "(default 0,1,2,...)");
  cmd->add_option("--managed", flags.managed,
                  "Comma-separated axes whose live membership is supplied at "
                  "run time (fault-tolerant replicas)");
  cmd->add_option("--live", flags.live,
                  "Live members of a managed axis: axis=c0,c1,... (repeat "
                  "per axis)");
  cmd->add_option("--view", flags.view,
                  "View expression: slice(a,b), flatten(a,b as name), "
                  "unflatten(name as a:2,b:4), chained with '.'");
}

static void addSpecFlags(CLI::App *cmd, SpecFlags &flags) {
  cmd->add_option("--spec", flags.spec, "Parallelism spec (JSON; docs/spec.md)")
      ->required();
  cmd->add_option("--model", flags.model,
                  "Model: a preset (tiny, llama3-8b, llama3-70b, "
                  "llama3-405b) or a model JSON file; overrides the spec's");
  cmd->add_option("--world-size", flags.worldSize,
                  "The job's world size; the mesh must match it");
  cmd->add_option("--tokens-per-rank", flags.tokensPerRank,
                  "Tokens one data-parallel rank processes per microbatch "
                  "(local batch x sequence length; context parallelism "
                  "splits them), for the cost model; default: the spec's "
                  "batch split over the data-parallel ranks and "
                  "microbatches, else 8192")
      ->type_name("N");
  cmd->add_option("--global-batch-tokens", flags.globalBatchTokens,
                  "The global batch in tokens per optimizer step (as tune's "
                  "flag), split over the data-parallel ranks and "
                  "microbatches; overrides the spec's batch.global_tokens")
      ->type_name("N");
  cmd->add_option("--seq-len", flags.seqLen,
                  "Sequence length, for the cost model (default: the "
                  "spec's batch.sequence_length, else 8192)")
      ->type_name("N");
  addRenamedFlag(cmd, "--tokens",
                 "renamed: it meant the tokens per data-parallel rank per "
                 "microbatch here and the global batch in tune; use "
                 "--tokens-per-rank N (or --global-batch-tokens N for the "
                 "global batch)");
}

static void addCostFlags(CLI::App *cmd, CostFlags &flags) {
  cmd->add_option("--device", flags.device,
                  "The device of every rank, for the cost model and the "
                  "memory capacity: h100-sxm-80gb (default; h100), "
                  "h200-141gb (h200), a100-80gb (a100)")
      ->type_name("NAME");
  cmd->add_option("--device-memory", flags.deviceMemory,
                  "Bytes a rank's estimated peak may use, instead of the "
                  "device's memory less its 2 GiB reserve (docs/memory.md)")
      ->type_name("BYTES");
  cmd->add_option("--context-parallel", flags.contextParallel,
                  "The extra axis that splits each sequence (context "
                  "parallelism), or none; default: an extra axis named cp")
      ->type_name("AXIS");
}

// Long because: main is the command line's table, one add_option per flag
// with its help text, in the order `meshplan --help` shows them; the
// commands themselves live in *Commands.cpp.
int main(int argc, char **argv) {
  CLI::App app{"meshplan: declarative parallelism planner (mesh and layout "
               "algebra)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "meshplan 0.1.0");

  MeshOptions meshOptions;
  CLI::App *meshCmd =
      app.add_subcommand("mesh", "Show a mesh view: coordinates, groups, "
                                 "communicator split keys");
  addMeshFlags(meshCmd, meshOptions.mesh);
  meshCmd->add_option("--rank", meshOptions.rank, "Show only this rank");
  meshCmd->add_flag("--groups", meshOptions.listGroups,
                    "Also list every group of every view axis");
  meshCmd->add_flag("--json", meshOptions.json, "Print JSON");

  LayoutOptions layoutOptions;
  CLI::App *layoutCmd = app.add_subcommand(
      "layout", "Show every rank's shard of a tensor under a layout");
  addMeshFlags(layoutCmd, layoutOptions.mesh);
  layoutCmd
      ->add_option("--shape", layoutOptions.shape,
                   "Global tensor shape (e.g. 15,5)")
      ->required();
  layoutCmd->add_option("--placements", layoutOptions.placements,
                        "DTensor placements, one per view axis: "
                        "SS(0,2),S(0) or _StridedShard(dim=0, sf=2), ...");
  layoutCmd->add_option("--layout", layoutOptions.layout,
                        "meshplan layout: [{tp,dp},{}] partial(sum)={x}");
  layoutCmd->add_option("--rank", layoutOptions.rank, "Show only this rank");
  layoutCmd->add_flag("--json", layoutOptions.json, "Print JSON");

  RedistributeOptions redistOptions;
  CLI::App *redistCmd = app.add_subcommand(
      "redistribute", "Plan the collectives from one layout to another");
  addMeshFlags(redistCmd, redistOptions.mesh);
  redistCmd->add_option("--shape", redistOptions.shape, "Global tensor shape")
      ->required();
  redistCmd
      ->add_option("--from", redistOptions.from, "Source placements or layout")
      ->required();
  redistCmd->add_option("--to", redistOptions.to, "Target placements or layout")
      ->required();
  redistCmd->add_option("--dtype", redistOptions.dtype,
                        "Element type for byte counts (default fp32)");
  redistCmd->add_flag("--json", redistOptions.json, "Print JSON");

  VerifyOptions verifyOptions;
  CLI::App *verifyCmd = app.add_subcommand(
      "verify", "Verify a directory of per-rank plans across ranks (exit 0: "
                "ok, 1: verification failed, 2: bad input)");
  verifyCmd
      ->add_option("dir", verifyOptions.dir,
                   "Plan directory: rankN.json files, optionally "
                   "index.json (docs/plan-format.md)")
      ->required();
  verifyCmd->add_option("--threads", verifyOptions.threads,
                        "Threads for reading plans (default: all cores)");
  verifyCmd->add_option("--progress", verifyOptions.progress, kProgressHelp);
  verifyCmd->add_flag("--json", verifyOptions.json,
                      "Print one JSON object: the counts, or the failure's "
                      "kind, rank, instruction and message (exit codes "
                      "unchanged; docs/plan-format.md)");

  PlanOptions planOptions;
  CLI::App *planCmd = app.add_subcommand(
      "plan", "Plan a training step: every rank's communicators, buffers "
              "and program, verified across ranks (exit 0: ok, 1: "
              "verification failed or the estimated peak memory exceeds "
              "the device, 2: bad input)");
  addSpecFlags(planCmd, planOptions.spec);
  planCmd->add_option("--rank", planOptions.rank, "Plan only this rank");
  planCmd->add_flag("--all", planOptions.all, "Plan every rank");
  planCmd
      ->add_option("-o,--output", planOptions.outDir,
                   "Output directory (rankN.json + index.json); "
                   "replaced only when everything succeeded; with --rank, "
                   "\"-\" writes the rank's plan to stdout")
      ->required();
  planCmd->add_flag("--no-verify", planOptions.noVerify,
                    "Skip the cross-rank verification (done by default up "
                    "to 4096 ranks)");
  planCmd->add_option("--dump-ir", planOptions.dumpIr,
                      "Write the IR after import and after every pass to "
                      "this directory (NN-<stage>.mlir)");
  planCmd->add_option("--progress", planOptions.progress, kProgressHelp);
  planCmd->add_flag("--timings", planOptions.timings,
                    "Print the time of import, every pass, export and "
                    "writing");
  planCmd->add_option("--threads", planOptions.threads,
                      "Threads writing plan files (default 2)");
  addCostFlags(planCmd, planOptions.cost);
  planCmd->add_flag("--allow-over-capacity", planOptions.allowOverCapacity,
                    "Write plans whose estimated peak memory exceeds the "
                    "device's capacity (refused with exit code 1 otherwise)");

  ExplainOptions explainOptions;
  CLI::App *explainCmd = app.add_subcommand(
      "explain", "Explain a plan: mesh and groups, collectives per step "
                 "with bytes, memory per rank, what float8 saves");
  addSpecFlags(explainCmd, explainOptions.spec);
  addCostFlags(explainCmd, explainOptions.cost);
  explainCmd->add_option("--rank", explainOptions.rank,
                         "The rank to describe (default 0)");
  explainCmd->add_flag("--json", explainOptions.json,
                       "Print the same facts as one JSON object "
                       "(pipeline::explanationJson)");

  TraceOptions traceOptions;
  ExecutedTraceOptions executedOptions;
  CLI::App *traceCmd = app.add_subcommand(
      "trace", "Write a Chrome/Perfetto trace of one rank's step under the "
               "cost model, or merge and summarize what a run recorded "
               "(--merge, --summary; docs/observability.md)");
  addSpecFlags(traceCmd, traceOptions.spec);
  addCostFlags(traceCmd, traceOptions.cost);
  // --spec is needed for the cost model's trace, optional with --merge
  // (it adds the prediction) and unused by --summary; checked below.
  traceCmd->get_option("--spec")->required(false);
  traceCmd->add_option("--rank", traceOptions.rank,
                       "The rank to trace (default 0)");
  traceCmd->add_option("-o,--output", traceOptions.output,
                       "Trace file (\"-\" writes it to stdout)");
  CLI::Option *mergeOpt = traceCmd->add_option(
      "--merge", executedOptions.merge,
      "Merge a run's executed-step traces (the rank<R>.json files, "
      "rank<R>.inc<I>.json in a fault-tolerant run, that "
      "meshplan-train --trace DIR wrote) into one Perfetto trace; with "
      "--spec, the cost model's prediction of the same plans beside them");
  CLI::Option *summaryOpt = traceCmd->add_option(
      "--summary", executedOptions.summary,
      "Print per rank and communicator the time in collectives, the exposed "
      "part, and the rank everyone waited for");
  mergeOpt->excludes(summaryOpt);

  RunOptions runOptions;
  CLI::App *runCmd = app.add_subcommand(
      "run", "Launch N processes of a program with RANK, WORLD_SIZE, ... and "
             "MESHPLAN_STORE set; prefix their output with [rank R]; stop "
             "all when one fails (usage: meshplan run -n N [options] -- "
             "PROGRAM [ARGS...])");
  runCmd
      ->add_option("-n,--nproc-per-node", runOptions.nprocPerNode,
                   "Processes to start on this node (1..4096)")
      ->type_name("N");
  runCmd
      ->add_option("--store", runOptions.store,
                   "file:DIR (an empty or new directory; default: a fresh "
                   "one under $TMPDIR, removed at exit) or "
                   "redis://HOST:PORT")
      ->type_name("ADDRESS");
  runCmd
      ->add_option("--timeout", runOptions.timeout,
                   "Collective timeout in seconds, exported as "
                   "MESHPLAN_TIMEOUT (the runtime's default is 60)")
      ->type_name("SECONDS");
  runCmd
      ->add_option("--nnodes", runOptions.nnodes,
                   "Nodes in the job (default 1; > 1 needs a redis store)")
      ->type_name("M");
  runCmd
      ->add_option("--node-rank", runOptions.nodeRank,
                   "This node's rank in [0, nnodes) (default 0)")
      ->type_name("K");
  runCmd
      ->add_option("--master-addr", runOptions.masterAddr,
                   "Exported as MASTER_ADDR, for torch's env:// rendezvous: "
                   "node 0's address, as torchrun's --master-addr (default "
                   "127.0.0.1 on one node; several: the caller's)")
      ->type_name("HOST");
  runCmd
      ->add_option("--master-port", runOptions.masterPort,
                   "Exported as MASTER_PORT (default: a free port on one "
                   "node; several: the caller's)")
      ->type_name("PORT");
  runCmd
      ->add_option("--grace", runOptions.grace,
                   "Seconds between SIGTERM and SIGKILL when stopping the "
                   "ranks (default 5)")
      ->type_name("SECONDS");
  runCmd->add_flag("--fault-tolerant", runOptions.faultTolerant,
                   "Restart a failed replica group's processes while the "
                   "others continue; membership in Redis (a private "
                   "redis-server, or --store redis://HOST:PORT)");
  runCmd
      ->add_option("--max-restarts", runOptions.maxRestarts,
                   "Restarts per replica group before it is given up "
                   "(--fault-tolerant; default 3)")
      ->type_name("K");
  runCmd
      ->add_option("--min-replicas", runOptions.minReplicas,
                   "Fewest live replica groups a quorum may have "
                   "(--fault-tolerant; default 1)")
      ->type_name("M");
  runCmd
      ->add_option("--heartbeat-ms", runOptions.heartbeatMs,
                   "Heartbeat expiry in milliseconds (--fault-tolerant; "
                   "default 2000)")
      ->type_name("MS");
  runCmd
      ->add_option("--job", runOptions.job,
                   "The job's name in the store (--fault-tolerant; default: "
                   "a fresh one; required with --nnodes > 1)")
      ->type_name("NAME");
  CLI::App *ckptCmd = app.add_subcommand(
      "ckpt", "Offline checkpoint commands: inspect, verify, reshard, "
              "export, import (docs/checkpoint-format.md)");
  ckptCmd->require_subcommand(1);
  CkptInspectOptions ckptInspectOptions;
  CLI::App *ckptInspectCmd = ckptCmd->add_subcommand(
      "inspect", "Show a checkpoint's tensors, chunks, sizes and what wrote "
                 "it");
  ckptInspectCmd->add_option("dir", ckptInspectOptions.dir, "Checkpoint")
      ->required();
  ckptInspectCmd->add_flag("--chunks", ckptInspectOptions.chunks,
                           "List every chunk under its tensor");
  ckptInspectCmd->add_flag("--json", ckptInspectOptions.json, "Print JSON");
  CkptVerifyOptions ckptVerifyOptions;
  CLI::App *ckptVerifyCmd = ckptCmd->add_subcommand(
      "verify", "Check every checksum and that the chunks tile every tensor "
                "exactly once (exit 0: ok, 1: a checksum fails, 2: bad "
                "input)");
  ckptVerifyCmd->add_option("dir", ckptVerifyOptions.dir, "Checkpoint")
      ->required();
  ckptVerifyCmd->add_option("--progress", ckptVerifyOptions.progress,
                            kProgressHelp);
  CkptReshardOptions ckptReshardOptions;
  CLI::App *ckptReshardCmd = ckptCmd->add_subcommand(
      "reshard", "Rewrite a checkpoint for the layout of another spec, "
                 "without a trainer");
  ckptReshardCmd->add_option("dir", ckptReshardOptions.dir, "Checkpoint")
      ->required();
  addSpecFlags(ckptReshardCmd, ckptReshardOptions.spec);
  ckptReshardCmd->add_option("--progress", ckptReshardOptions.progress,
                             kProgressHelp);
  ckptReshardCmd
      ->add_option("-o,--output", ckptReshardOptions.out,
                   "Output checkpoint (new, or an existing checkpoint, "
                   "replaced atomically)")
      ->required();
  ckptReshardCmd->add_flag(
      "--dtype-cast", ckptReshardOptions.cast.dtypeCast,
      "Convert tensors stored as another of float32, bfloat16, float16 to "
      "the plan's dtype (round to nearest even)");
  ckptReshardCmd->add_option(
      "--optimizer-state", ckptReshardOptions.cast.optimizerState,
      "keep (default: loaded, cast with --dtype-cast) or reset (zero, "
      "step 0)");
  CkptExportOptions ckptExportOptions;
  CLI::App *ckptExportCmd = ckptCmd->add_subcommand(
      "export", "Write a checkpoint's whole parameters as a safetensors file");
  ckptExportCmd->add_option("dir", ckptExportOptions.dir, "Checkpoint")
      ->required();
  ckptExportCmd->add_option("--progress", ckptExportOptions.progress,
                            kProgressHelp);
  ckptExportCmd
      ->add_option("-o,--output", ckptExportOptions.out,
                   "safetensors file (\"-\": stdout), or with --format "
                   "hf-llama a new directory")
      ->required();
  ckptExportCmd->add_option("--format", ckptExportOptions.format,
                            "safetensors (default: one file, meshplan's "
                            "names) or hf-llama (a transformers "
                            "LlamaForCausalLM directory)");
  ckptExportCmd->add_option("--model", ckptExportOptions.model,
                            "hf-llama: the model (preset or file; default: "
                            "the checkpoint's model)");
  ckptExportCmd->add_option("--max-shard-size", ckptExportOptions.maxShardSize,
                            "hf-llama: largest safetensors file before "
                            "sharding (default 5GB)");
  CkptImportOptions ckptImportOptions;
  CLI::App *ckptImportCmd = ckptCmd->add_subcommand(
      "import", "Make a checkpoint for a spec's layout from a safetensors "
                "file of its model's parameters (optimizer state zero, "
                "step 0)");
  ckptImportCmd
      ->add_option("file", ckptImportOptions.file,
                   "safetensors file, or with --format hf-llama a Hugging "
                   "Face Llama directory (or its model.safetensors or "
                   "index)")
      ->required();
  ckptImportCmd->add_option("--format", ckptImportOptions.format,
                            "safetensors (default: meshplan's names) or "
                            "hf-llama");
  ckptImportCmd->add_flag(
      "--dtype-cast", ckptImportOptions.dtypeCast,
      "Convert tensors stored as another of float32, bfloat16, float16 to "
      "the plan's dtype (round to nearest even)");
  addSpecFlags(ckptImportCmd, ckptImportOptions.spec);
  ckptImportCmd->add_option("--progress", ckptImportOptions.progress,
                            kProgressHelp);
  ckptImportCmd
      ->add_option("-o,--output", ckptImportOptions.out,
                   "Output checkpoint (new, or an existing checkpoint, "
                   "replaced atomically)")
      ->required();

  TuneOptions tuneOptions;
  CLI::App *tuneCmd = app.add_subcommand(
      "tune", "Search mesh factorizations and training options for the "
              "fastest spec that fits the device (docs/tune.md; exit 0: "
              "found, 1: nothing fits, 2: bad input)");
  tuneCmd
      ->add_option("--model", tuneOptions.model,
                   "Model: a preset (tiny, llama3-8b, llama3-70b, "
                   "llama3-405b) or a model JSON file")
      ->required();
  // --world-size is the name plan/explain/trace use for the same number.
  tuneCmd
      ->add_option("--world,--world-size", tuneOptions.world,
                   "Ranks (GPUs) in the job")
      ->required();
  addCostFlags(tuneCmd, tuneOptions.cost);
  tuneCmd
      ->add_option("--global-batch-tokens", tuneOptions.globalBatchTokens,
                   "Global batch in tokens per optimizer step (default: "
                   "one sequence per rank); -o writes it into the spec's "
                   "batch")
      ->type_name("N");
  addRenamedFlag(tuneCmd, "--tokens",
                 "renamed: it meant the global batch here and a rank's "
                 "tokens per microbatch in plan and explain; use "
                 "--global-batch-tokens N");
  tuneCmd->add_option("--seq-len", tuneOptions.seqLen,
                      "Sequence length (default 8192)");
  tuneCmd->add_option("--max-cp", tuneOptions.maxContextParallel,
                      "Largest context-parallel degree tried (default 8)");
  tuneCmd->add_option("--pp", tuneOptions.pipelineParallel,
                      "Pipeline-parallel degree: 0 searches them (default), "
                      "1 forbids pipelines, N > 1 tries only pp N");
  tuneCmd->add_option("--max-pp", tuneOptions.maxPipelineParallel,
                      "Largest pipeline-parallel degree searched (default "
                      "16)");
  tuneCmd->add_option("--top", tuneOptions.top,
                      "Candidates shown in the table (default 5)");
  tuneCmd->add_option("--confirm", tuneOptions.confirm,
                      "Best screened candidates planned for real (default "
                      "8; 0: all)");
  tuneCmd->add_option(
      "-o,--output", tuneOptions.output,
      "Write the winning spec here, with the batch it was tuned "
      "for (default: print it after the table; \"-\": print "
      "only the spec, the table on stderr)");
  tuneCmd->add_option("--progress", tuneOptions.progress, kProgressHelp);
  tuneCmd->add_flag("--json", tuneOptions.json,
                    "Print one JSON object: the search's counts, the ranked "
                    "candidates and the winning spec (docs/tune.md)");

  // PROGRAM and its arguments never reach CLI11, so their flags stay theirs.
  std::vector<char *> cliArgs =
      splitRunCommandLine(*runCmd, argc, argv, runOptions.program);

  if (auto exit = parseCommandLine(app, cliArgs, "meshplan", [&] {
        return app.get_subcommands().empty()
                   ? std::string(" (subcommands: plan, explain, trace, "
                                 "verify, mesh, layout, redistribute, run, "
                                 "ckpt, tune; see 'meshplan --help')")
                   : std::string();
      }))
    return *exit;

  try {
    std::string output;
    if (runCmd->parsed())
      return runLaunchCommand(runOptions);
    if (verifyCmd->parsed()) {
      VerifyOutput v = runVerifyCommand(verifyOptions);
      std::cout << v.out;
      std::cerr << v.err;
      return v.exitCode;
    }
    if (ckptCmd->parsed()) {
      CommandOutput c =
          ckptInspectCmd->parsed()   ? runCkptInspectCommand(ckptInspectOptions)
          : ckptVerifyCmd->parsed()  ? runCkptVerifyCommand(ckptVerifyOptions)
          : ckptReshardCmd->parsed() ? runCkptReshardCommand(ckptReshardOptions)
          : ckptExportCmd->parsed()  ? runCkptExportCommand(ckptExportOptions)
                                     : runCkptImportCommand(ckptImportOptions);
      std::cout << c.out;
      std::cerr << c.err;
      return c.exitCode;
    }
    if (tuneCmd->parsed()) {
      CommandOutput t = runTuneCommand(tuneOptions);
      std::cout << t.out;
      std::cerr << t.err;
      return t.exitCode;
    }
    if (planCmd->parsed()) {
      CommandOutput p = runPlanCommand(planOptions);
      std::cout << p.out;
      std::cerr << p.err;
      return p.exitCode;
    }
    if (explainCmd->parsed())
      output = runExplainCommand(explainOptions);
    else if (traceCmd->parsed() && (*mergeOpt || *summaryOpt)) {
      executedOptions.output = traceOptions.output;
      executedOptions.spec = traceOptions.spec;
      executedOptions.cost = traceOptions.cost;
      output = runExecutedTraceCommand(executedOptions);
    } else if (traceCmd->parsed()) {
      if (traceOptions.spec.spec.empty())
        throw CliError("--spec is required (or --merge DIR / --summary DIR "
                       "of a run's executed-step traces)");
      if (traceOptions.output.empty())
        throw CliError("--output is required");
      std::string summary;
      output = runTraceCommand(traceOptions, &summary);
      std::cerr << summary;
    } else if (meshCmd->parsed())
      output = runMeshCommand(meshOptions);
    else if (layoutCmd->parsed())
      output = runLayoutCommand(layoutOptions);
    else
      output = runRedistributeCommand(redistOptions);
    std::cout << output;
    return 0;
  } catch (const CliError &e) {
    std::cerr << "meshplan: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception &e) {
    std::cerr << "meshplan: internal error: " << e.what() << "\n";
    return 3;
  }
}
