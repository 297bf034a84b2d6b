//===- LauncherEnvironmentTest.cpp - Who started this rank ----------------===//
//
// readLauncherEnvironment on hand-made environments: which launcher's
// variables win, the store and the keys' namespace each gives, and the
// refusals (the trainer's end-to-end ones: test/trainer/launchers.sh).
//
//===----------------------------------------------------------------------===//

#include "meshplan/Runtime/LauncherEnvironment.h"

#include <gtest/gtest.h>

#include <map>

using namespace meshplan;
using namespace meshplan::runtime;

namespace {

using Env = std::map<std::string, std::string>;

Result<LauncherEnvironment> read(const Env &env) {
  return readLauncherEnvironment([&](const char *name) -> const char * {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

bool present(const Env &env) {
  return launcherEnvironmentPresent([&](const char *name) -> const char * {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

std::string error(const Env &env) {
  auto r = read(env);
  return r ? "(no error)" : r.error().message;
}

} // namespace

TEST(LauncherEnvironment, MeshplanRun) {
  auto e = read({{"RANK", "3"},
                 {"WORLD_SIZE", "8"},
                 {"LOCAL_RANK", "1"},
                 {"GROUP_RANK", "1"},
                 {"MESHPLAN_STORE", "redis://10.0.0.1:6379"}});
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->worldSize, 8);
  EXPECT_EQ(e->localRank, 1);
  EXPECT_EQ(e->store.text(), "redis://10.0.0.1:6379");
  EXPECT_EQ(e->worldSizeVariable, "WORLD_SIZE");
  EXPECT_FALSE(e->job);
}

TEST(LauncherEnvironment, TorchrunUsesItsAgentsStore) {
  Env env = {{"RANK", "5"},
             {"WORLD_SIZE", "8"},
             {"LOCAL_RANK", "1"},
             {"GROUP_RANK", "1"},
             {"MASTER_ADDR", "node0"},
             {"MASTER_PORT", "29500"},
             {"TORCHELASTIC_USE_AGENT_STORE", "True"},
             {"TORCHELASTIC_RUN_ID", "abc/1"},
             {"TORCHELASTIC_RESTART_COUNT", "2"}};
  auto e = read(env);
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_EQ(e->launcher, "torchrun");
  EXPECT_EQ(e->store.kind, StoreAddress::Kind::Tcp);
  EXPECT_EQ(e->store.text(), "tcp://node0:29500");
  // A restarted attempt never meets the keys of the last one.
  EXPECT_EQ(e->job.value_or(""), "torchrun-abc_1-2");
  EXPECT_TRUE(present(env));
  // MESHPLAN_STORE and MESHPLAN_JOB still win.
  env["MESHPLAN_STORE"] = "file:/tmp/x";
  env["MESHPLAN_JOB"] = "mine";
  e = read(env);
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_EQ(e->store.text(), "file:/tmp/x");
  EXPECT_EQ(e->job.value_or(""), "mine");
}

TEST(LauncherEnvironment, Srun) {
  Env env = {{"SLURM_PROCID", "6"},  {"SLURM_NTASKS", "8"},
             {"SLURM_LOCALID", "2"}, {"SLURM_JOB_ID", "4242"},
             {"SLURM_STEP_ID", "3"}, {"MESHPLAN_STORE", "file:/shared/s"}};
  auto e = read(env);
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_EQ(e->launcher, "srun");
  EXPECT_EQ(e->rank, 6);
  EXPECT_EQ(e->worldSize, 8);
  EXPECT_EQ(e->localRank, 2);
  EXPECT_EQ(e->worldSizeVariable, "SLURM_NTASKS");
  EXPECT_EQ(e->job.value_or(""), "slurm-4242-3");
  env.erase("MESHPLAN_STORE");
  EXPECT_NE(error(env).find("MESHPLAN_STORE is not set: srun (SLURM_PROCID=6, "
                            "SLURM_NTASKS=8)"),
            std::string::npos)
      << error(env);
  // One task of one: a one-rank plan needs no store.
  EXPECT_TRUE(present(env));
  EXPECT_FALSE(present({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}));
}

TEST(LauncherEnvironment, AnAgentUnderSrunWins) {
  // `srun torchrun ...`: one task per node; the task's SLURM_PROCID is the
  // node's index, RANK the process's.
  auto e = read({{"RANK", "5"},
                 {"WORLD_SIZE", "8"},
                 {"GROUP_RANK", "1"},
                 {"SLURM_PROCID", "1"},
                 {"SLURM_NTASKS", "2"},
                 {"MESHPLAN_STORE", "file:/s"}});
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_EQ(e->rank, 5);
  EXPECT_EQ(e->worldSize, 8);
}

TEST(LauncherEnvironment, Refusals) {
  EXPECT_EQ(error({{"RANK", "1"},
                   {"WORLD_SIZE", "4"},
                   {"LOCAL_RANK", "1"},
                   {"SLURM_PROCID", "1"},
                   {"SLURM_NTASKS", "4"},
                   {"SLURM_LOCALID", "0"},
                   {"MESHPLAN_STORE", "file:/s"}}),
            "LOCAL_RANK=1 disagrees with srun's SLURM_LOCALID=0: two "
            "launchers describe this process; unset RANK, WORLD_SIZE and "
            "LOCAL_RANK to use srun's, or start the ranks with one launcher");
  EXPECT_EQ(error({{"RANK", "4"}, {"WORLD_SIZE", "4"}}),
            "RANK=4 is not below WORLD_SIZE=4");
  EXPECT_EQ(error({{"RANK", "-1"}, {"WORLD_SIZE", "4"}}),
            "RANK=\"-1\" is not a non-negative integer");
  EXPECT_EQ(error({{"WORLD_SIZE", "4"}}),
            "RANK is not set although WORLD_SIZE=4 is (torchrun and `meshplan "
            "run` set both)");
  EXPECT_NE(error({}).find("RANK is not set (start the job"),
            std::string::npos);
  EXPECT_NE(error({{"RANK", "0"},
                   {"WORLD_SIZE", "2"},
                   {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                   {"TORCHELASTIC_RUN_ID", "r"},
                   {"MASTER_ADDR", "h"},
                   {"MASTER_PORT", "x"}})
                .find("MASTER_PORT=\"x\" is not a non-negative integer"),
            std::string::npos);
}
