// Reading rank, size and local rank from torchrun's, Open MPI's and Slurm's variables.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "base/error.h"
#include "core/launch_env.h"

namespace braid {
namespace {

using Env = std::map<std::string, std::string>;

std::optional<LaunchEnv> readFrom(const Env& env) {
  return readLaunchEnv([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

// The braidInvalidArgument message reading `env` gives; fails the test if it reads fine.
std::string errorFrom(const Env& env) {
  try {
    readFrom(env);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), braidInvalidArgument) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(LaunchEnv, NothingSetIsNoLauncher) {
  EXPECT_FALSE(readFrom({}).has_value());
  EXPECT_FALSE(readFrom({{"SLURM_JOB_ID", "5"}, {"MASTER_ADDR", "h"}}).has_value());
}

TEST(LaunchEnv, Torchrun) {
  auto env = readFrom(
      {{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}});
  ASSERT_TRUE(env.has_value());
  EXPECT_EQ(env->rank, 5);
  EXPECT_EQ(env->size, 8);
  EXPECT_EQ(env->localRank, 1);
  EXPECT_EQ(env->localSize, 4);
  EXPECT_EQ(env->source, "torchrun");
}

TEST(LaunchEnv, OpenMpi) {
  auto env = readFrom({{"OMPI_COMM_WORLD_RANK", "2"},
                       {"OMPI_COMM_WORLD_SIZE", "3"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}});
  ASSERT_TRUE(env.has_value());
  EXPECT_EQ(env->rank, 2);
  EXPECT_EQ(env->size, 3);
  EXPECT_EQ(env->localRank, 0);
  EXPECT_EQ(env->localSize, 1);
  EXPECT_EQ(env->source, "Open MPI");
}

TEST(LaunchEnv, SlurmLocalSizeComesFromTasksPerNode) {
  // Nodes 0-2 run 2 tasks each, node 3 runs 1: 7 tasks; task 6 is alone on node 3.
  Env slurm = {{"SLURM_PROCID", "6"},
               {"SLURM_NTASKS", "7"},
               {"SLURM_LOCALID", "0"},
               {"SLURM_NODEID", "3"},
               {"SLURM_TASKS_PER_NODE", "2(x3),1"}};
  auto env = readFrom(slurm);
  ASSERT_TRUE(env.has_value());
  EXPECT_EQ(env->rank, 6);
  EXPECT_EQ(env->size, 7);
  EXPECT_EQ(env->localRank, 0);
  EXPECT_EQ(env->localSize, 1);
  EXPECT_EQ(env->source, "Slurm");

  slurm["SLURM_NODEID"] = "2";
  slurm["SLURM_PROCID"] = "5";
  slurm["SLURM_LOCALID"] = "1";
  EXPECT_EQ(readFrom(slurm)->localSize, 2);

  slurm.erase("SLURM_TASKS_PER_NODE");
  EXPECT_EQ(readFrom(slurm)->localSize, -1);
}

TEST(LaunchEnv, TorchrunWinsOverMpiAndMpiOverSlurm) {
  Env all = {{"RANK", "1"},
             {"WORLD_SIZE", "2"},
             {"OMPI_COMM_WORLD_RANK", "3"},
             {"OMPI_COMM_WORLD_SIZE", "4"},
             {"SLURM_PROCID", "0"},
             {"SLURM_NTASKS", "1"}};
  EXPECT_EQ(readFrom(all)->source, "torchrun");
  all.erase("RANK");
  all.erase("WORLD_SIZE");
  EXPECT_EQ(readFrom(all)->source, "Open MPI");
  EXPECT_EQ(readFrom(all)->rank, 3);
  EXPECT_EQ(readFrom(all)->localRank, -1);
}

TEST(LaunchEnv, MalformedValuesNameTheVariable) {
  EXPECT_NE(errorFrom({{"RANK", "one"}, {"WORLD_SIZE", "2"}}).find("RANK='one'"),
            std::string::npos);
  EXPECT_NE(errorFrom({{"RANK", "0"}, {"WORLD_SIZE", "-2"}}).find("WORLD_SIZE='-2'"),
            std::string::npos);
  EXPECT_NE(errorFrom({{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}}).find("WORLD_SIZE"),
            std::string::npos);
  EXPECT_NE(errorFrom({{"RANK", "4"}, {"WORLD_SIZE", "4"}}).find("RANK=4 is not below"),
            std::string::npos);
  EXPECT_NE(errorFrom({{"RANK", "0"}, {"WORLD_SIZE", "0"}}).find("WORLD_SIZE=0"),
            std::string::npos);
  EXPECT_NE(errorFrom({{"RANK", "0"}}).find("WORLD_SIZE is not"), std::string::npos);
  EXPECT_NE(
      errorFrom({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "x1"}}).find("LOCAL_RANK='x1'"),
      std::string::npos);
  EXPECT_NE(
      errorFrom(
          {{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}})
          .find("LOCAL_RANK=2"),
      std::string::npos);
  EXPECT_NE(errorFrom({{"SLURM_PROCID", "0"},
                       {"SLURM_NTASKS", "2"},
                       {"SLURM_NODEID", "0"},
                       {"SLURM_TASKS_PER_NODE", "2(3)"}})
                .find("SLURM_TASKS_PER_NODE"),
            std::string::npos);
  EXPECT_NE(errorFrom({{"SLURM_PROCID", "0"},
                       {"SLURM_NTASKS", "2"},
                       {"SLURM_NODEID", "1"},
                       {"SLURM_TASKS_PER_NODE", "2"}})
                .find("SLURM_NODEID is 1"),
            std::string::npos);
}

}  // namespace
}  // namespace braid
