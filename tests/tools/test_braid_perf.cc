// braid-perf: the checker's data (exact for every dtype x op, and it catches what it must), the
// nccl-tests table layout, the flags it refuses, and a real 2-process run whose table and JSON
// parse with nccl-tests' columns and agree with each other.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <pty.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "perf/collectives.h"
#include "perf/options.h"
#include "perf/report.h"
#include "perf/types.h"
#include "perf/values.h"

namespace braid_perf {
namespace {

// ---- the checker's data
// --------------------------------------------------------------------------

// Element types narrower than float32: reduced in float32, rounded back.
template <typename T>
constexpr bool kNarrowFloat = std::is_same_v<T, Bfloat16> || std::is_same_v<T, _Float16> ||
                              std::is_same_v<T, Fp8E4M3> || std::is_same_v<T, Fp8E5M2>;

// Reduces two values the way a device would for this element type: in the type itself for
// integers (two's complement), in float32 rounded back to the type for half, bfloat16 and fp8.
template <typename T>
T combine(T a, T b, braidRedOp_t op) {
  if constexpr (kNarrowFloat<T>) {
    const float x = static_cast<float>(elementToDouble(a)),
                y = static_cast<float>(elementToDouble(b));
    return elementFromDouble<T>(combine(x, y, op));
  } else {
    switch (op) {
      case braidProd: return static_cast<T>(a * b);
      case braidMax: return a > b ? a : b;
      case braidMin: return a < b ? a : b;
      default: return static_cast<T>(a + b);  // sum, and avg before its division
    }
  }
}

template <typename T>
constexpr bool kFloat = kNarrowFloat<T> || std::is_floating_point_v<T>;

// Reduces the ranks' inputs element by element in the given rank order with the type's own
// arithmetic, as an implementation might, independently of ValueModel::reduced. Avg as braid runs
// it: of integers, the sum divided; of floats, as NCCL, each input times 1/n in the type, summed.
template <typename T>
std::vector<T> referenceReduce(std::vector<std::vector<T>> inputs, braidRedOp_t op,
                               const std::vector<int>& order) {
  const int n = static_cast<int>(order.size());
  if constexpr (kFloat<T>) {
    if (op == braidAvg) {
      const T scale = elementFromDouble<T>(
          std::is_same_v<T, double> ? 1.0 / n : static_cast<double>(static_cast<float>(1.0 / n)));
      for (std::vector<T>& input : inputs)
        for (T& v : input) v = combine(v, scale, braidProd);
      op = braidSum;
    }
  }
  std::vector<T> acc = inputs[order[0]];
  for (size_t k = 1; k < order.size(); ++k)
    for (size_t i = 0; i < acc.size(); ++i) acc[i] = combine(acc[i], inputs[order[k]][i], op);
  if constexpr (!kFloat<T>)
    if (op == braidAvg)
      for (T& v : acc) v = static_cast<T>(v / static_cast<T>(n));
  return acc;
}

class ValueModelTest : public testing::TestWithParam<std::tuple<braidDataType_t, braidRedOp_t>> {};

TEST_P(ValueModelTest, ExactInEveryReductionOrder) {
  const auto [type, op] = GetParam();
  constexpr size_t kCount = 4099;
  for (int nranks : {1, 2, 3, 7, 16, 64}) {
    const ValueModel model(type, op, nranks, /*seed=*/nranks * 31 + 5);
    withElementType(type, [&](auto tag) {
      using T = typename decltype(tag)::type;
      std::vector<std::vector<T>> inputs(nranks, std::vector<T>(kCount));
      for (int r = 0; r < nranks; ++r) {
        fillElements(inputs[r].data(), kCount, type, [&](size_t i) { return model.input(r, i); });
        // Every input is exact in the type: converting back gives the model's value.
        ASSERT_EQ(countWrongElements(inputs[r].data(), kCount, type,
                                     [&](size_t i) { return model.input(r, i); }),
                  0u)
            << "rank " << r;
      }
      std::vector<int> forward(nranks), backward(nranks);
      for (int r = 0; r < nranks; ++r) forward[r] = r, backward[r] = nranks - 1 - r;
      for (const auto& order : {forward, backward}) {
        const std::vector<T> result = referenceReduce(inputs, op, order);
        EXPECT_EQ(countWrongElements(result.data(), kCount, type,
                                     [&](size_t i) { return model.reduced(i); }),
                  0u)
            << datatypeInfo(type).name << " " << kOpNames[op] << " nranks " << nranks;
      }
    });
  }
}

TEST_P(ValueModelTest, InputsVaryAcrossRanksAndElements) {
  const auto [type, op] = GetParam();
  const ValueModel model(type, op, 4, 1);
  int differentFromRank0 = 0, distinct = 0;
  for (size_t i = 1; i < 1000; ++i) {
    differentFromRank0 += model.input(1, i) != model.input(0, i);
    distinct += model.input(0, i) != model.input(0, i - 1);
  }
  EXPECT_GT(differentFromRank0, 300);  // a rank that sends its own data instead is caught
  EXPECT_GT(distinct, 300);            // so is a shifted or repeated block
}

TEST_P(ValueModelTest, PoisonAndSingleErrorsAreCounted) {
  const auto [type, op] = GetParam();
  constexpr size_t kCount = 1000;
  const ValueModel model(type, op, 3, 7);
  const auto expected = [&](size_t i) { return model.reduced(i); };
  std::vector<uint64_t> storage(kCount);  // 8 bytes per element covers every type
  void* buf = storage.data();
  poisonElements(buf, kCount, type);
  EXPECT_EQ(countWrongElements(buf, kCount, type, expected), kCount);
  fillElements(buf, kCount, type, [&](size_t i) { return expected(i).value; });
  EXPECT_EQ(countWrongElements(buf, kCount, type, expected), 0u);
  poisonElements(static_cast<char*>(buf) + 500 * datatypeInfo(type).size, 1, type);
  EXPECT_EQ(countWrongElements(buf, kCount, type, expected), 1u);
}

std::vector<std::tuple<braidDataType_t, braidRedOp_t>> everyTypeAndOp() {
  std::vector<std::tuple<braidDataType_t, braidRedOp_t>> all;
  for (const DatatypeInfo& info : kDatatypes)
    for (int op = 0; op < braidNumOps; ++op)
      all.emplace_back(info.type, static_cast<braidRedOp_t>(op));
  return all;
}

INSTANTIATE_TEST_SUITE_P(AllTypesAndOps, ValueModelTest, testing::ValuesIn(everyTypeAndOp()),
                         [](const auto& info) {
                           return std::string(datatypeInfo(std::get<0>(info.param)).name) + "_" +
                                  kOpNames[std::get<1>(info.param)];
                         });

// ---- layouts, sizes ----------------------------------------------------------------------------

TEST(Collectives, LayoutsFollowNcclTests) {
  // 10 elements over 3 ranks: the per-rank collectives round down to 3 per rank.
  const Layout allGather = findCollective("allgather")->layout(10, 3);
  EXPECT_EQ(allGather.sendCount, 3u);
  EXPECT_EQ(allGather.recvCount, 9u);
  EXPECT_EQ(allGather.paramCount, 3u);
  EXPECT_EQ(allGather.bytes(4), 36u);
  EXPECT_EQ(allGather.inPlaceExtent(2), 9u);
  const Layout reduceScatter = findCollective("reducescatter")->layout(10, 3);
  EXPECT_EQ(reduceScatter.sendCount, 9u);
  EXPECT_EQ(reduceScatter.recvCount, 3u);
  EXPECT_EQ(reduceScatter.recvInPlaceOffset, 3u);
  const Layout allToAll = findCollective("alltoall")->layout(10, 3);
  EXPECT_EQ(allToAll.paramCount, 3u);
  EXPECT_EQ(allToAll.bytes(2), 18u);
  EXPECT_EQ(findCollective("allreduce")->layout(10, 3).bytes(4), 40u);

  EXPECT_DOUBLE_EQ(findCollective("allreduce")->busFactor(4), 1.5);
  EXPECT_DOUBLE_EQ(findCollective("reducescatter")->busFactor(4), 0.75);
  EXPECT_DOUBLE_EQ(findCollective("allgather")->busFactor(4), 0.75);
  EXPECT_DOUBLE_EQ(findCollective("alltoall")->busFactor(4), 0.75);
  EXPECT_DOUBLE_EQ(findCollective("broadcast")->busFactor(4), 1.0);
  EXPECT_DOUBLE_EQ(findCollective("reduce")->busFactor(4), 1.0);
  EXPECT_DOUBLE_EQ(findCollective("sendrecv")->busFactor(4), 1.0);
  EXPECT_EQ(findCollective("gather"), nullptr);
}

TEST(Options, SizesParseLikeNcclTests) {
  EXPECT_EQ(parseSize("8", "-b"), 8u);
  EXPECT_EQ(parseSize("1K", "-b"), 1024u);
  EXPECT_EQ(parseSize("1.5k", "-b"), 1536u);
  EXPECT_EQ(parseSize("256M", "-e"), 256u << 20);
  EXPECT_EQ(parseSize("2G", "-e"), 2ull << 30);
  for (const char* bad : {"", "K", "1X", "-1", "1KB", "1 K", "nan"})
    EXPECT_THROW(parseSize(bad, "-b"), UsageError) << bad;
}

TEST(Options, SweepByFactorAndByStep) {
  Options o;
  o.minBytes = 8, o.maxBytes = 1000, o.stepFactor = 4;
  EXPECT_EQ(sweepSizes(o), (std::vector<size_t>{8, 32, 128, 512}));
  o.stepFactor = 1, o.stepBytes = 300;
  EXPECT_EQ(sweepSizes(o), (std::vector<size_t>{8, 308, 608, 908}));
}

// ---- the table
// -----------------------------------------------------------------------------------

TEST(Report, ColumnHeaderIsNcclTests) {
  EXPECT_EQ(columnHeader(),
            (std::vector<std::string>{
                "#       size         count      type   redop    root     time   algbw   busbw "
                "#wrong     time   algbw   busbw #wrong",
                "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)  "
                "          (us)  (GB/s)  (GB/s)"}));
  const std::vector<std::string> withPrediction = columnHeader(/*predicted=*/true);
  EXPECT_EQ(withPrediction[0], columnHeader()[0] + "  predicted");
  EXPECT_EQ(withPrediction[1], columnHeader()[1] + "            (GB/s)");
}

TEST(Report, RowIsNcclTestsPrintfLayout) {
  const Row row{1048576,
                262144,
                "float",
                "sum",
                -1,
                {123.456, 8.4934, 8.4934, 0},
                {12345.6, 84.934, 84.934, -1}};
  // nccl-tests' own format strings, with its time column rules.
  char expected[256];
  std::snprintf(expected, sizeof expected,
                "%12li  %12li  %8s  %6s  %6i  %7s  %6.2f  %6.2f  %5li  %7s  %6.2f  %6.2f  %5s",
                1048576L, 262144L, "float", "sum", -1, "  123.5", 8.4934, 8.4934, 0L, "  12346",
                84.934, 84.934, "N/A");
  EXPECT_EQ(formatRow(row), expected);
  EXPECT_EQ(formatTime(12.345), "  12.35");
  EXPECT_EQ(formatTime(123.45), "  123.5");
  EXPECT_EQ(formatTime(12345.6), "  12346");
}

// ---- the binary --------------------------------------------------------------------------------

struct PerfRun {
  int exitCode;
  std::string out;
  std::string err;
};

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A file name of this test process's own: ctest may run the tests of this binary in parallel.
std::string scratchPath(const std::string& name) {
  return testing::TempDir() + "braid_perf_" + std::to_string(getpid()) + "_" + name;
}

PerfRun runPerf(const std::string& args) {
  const std::string base = scratchPath("run");
  const std::string out = base + ".out", err = base + ".err";
  const std::string command =
      std::string(BRAID_PERF_PATH) + " " + args + " > " + out + " 2> " + err;
  const int status = std::system(command.c_str());
  PerfRun run{WIFEXITED(status) ? WEXITSTATUS(status) : -1, readFile(out), readFile(err)};
  std::remove(out.c_str());
  std::remove(err.c_str());
  return run;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> result;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) result.push_back(line);
  return result;
}

std::vector<std::string> fields(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> result;
  for (std::string f; in >> f;) result.push_back(f);
  return result;
}

TEST(BraidPerf, TwoProcessTableParsesWithNcclTestsColumns) {
  const std::string json = scratchPath("rows.json");
  const PerfRun run = runPerf("allreduce -b 8 -e 64K -f 4 --np 2 -c 1 -n 3 -w 1 --json " + json);
  ASSERT_EQ(run.exitCode, 0) << run.out << run.err;

  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header = columnHeader(/*predicted=*/true);
  size_t headerAt = 0;
  double avgBusbw = -1;
  bool sawOk = false;
  for (const std::string& line : lines(run.out)) {
    if (line == header[0]) headerAt = 1;
    if (line.rfind("# Out of bounds values : 0 OK", 0) == 0) sawOk = true;
    if (line.rfind("# Avg bus bandwidth    : ", 0) == 0) avgBusbw = std::stod(line.substr(25));
    if (!line.empty() && line[0] != '#') rows.push_back(fields(line));
  }
  ASSERT_EQ(headerAt, 1u) << run.out;
  EXPECT_TRUE(sawOk) << run.out;
  // 8, 32, ..., 32768 bytes: one row each.
  ASSERT_EQ(rows.size(), 7u) << run.out;
  double busbwSum = 0;
  size_t expectedSize = 8;
  for (const auto& f : rows) {
    // size count type redop root + 2 x (time algbw busbw #wrong) + braid's predicted busbw
    ASSERT_EQ(f.size(), 14u);
    EXPECT_GT(std::stod(f[13]), 0);
    EXPECT_EQ(std::stoul(f[0]), expectedSize);
    EXPECT_EQ(std::stoul(f[1]) * 4, expectedSize);
    EXPECT_EQ(f[2], "float");
    EXPECT_EQ(f[3], "sum");
    EXPECT_EQ(f[4], "-1");
    for (int half : {5, 9}) {
      const double timeUs = std::stod(f[half]), algbw = std::stod(f[half + 1]),
                   busbw = std::stod(f[half + 2]);
      EXPECT_GT(timeUs, 0);
      // algbw = size / time (GB = 1e9 B), within the rounding of the printed columns.
      EXPECT_NEAR(algbw, expectedSize / (timeUs * 1e3), 0.006 + algbw * 0.01);
      EXPECT_NEAR(busbw, algbw, 0.0051);  // 2(n-1)/n = 1 for two ranks
      EXPECT_EQ(f[half + 3], "0");
      busbwSum += busbw;
    }
    expectedSize *= 4;
  }
  EXPECT_NEAR(avgBusbw, busbwSum / 14, 0.01);

  const nlohmann::json doc = nlohmann::json::parse(readFile(json));
  std::remove(json.c_str());
  EXPECT_EQ(doc["collective"], "allreduce");
  EXPECT_EQ(doc["config"]["nranks"], 2);
  EXPECT_EQ(doc["config"]["processes"], 2);
  EXPECT_EQ(doc["config"]["iters"], 3);
  EXPECT_EQ(doc["ranks"].size(), 2u);
  EXPECT_EQ(doc["out_of_bounds_values"], 0);
  ASSERT_EQ(doc["rows"].size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(doc["rows"][i]["size_bytes"].get<size_t>(), std::stoul(rows[i][0]));
    EXPECT_EQ(doc["rows"][i]["count"].get<size_t>(), std::stoul(rows[i][1]));
    EXPECT_NEAR(doc["rows"][i]["out_of_place"]["busbw_gbps"].get<double>(), std::stod(rows[i][7]),
                0.0051);
    EXPECT_EQ(doc["rows"][i]["in_place"]["wrong"], 0);
  }
}

std::vector<std::string> splitCsv(const std::string& line) {
  std::vector<std::string> result;
  std::string field;
  bool quoted = false;
  for (char c : line) {
    if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      result.push_back(field);
      field.clear();
    } else {
      field += c;
    }
  }
  result.push_back(field);
  return result;
}

TEST(BraidPerf, CsvHasEveryRowWithTheConfigurationAndNoProgressWhenRedirected) {
  const std::string csv = scratchPath("rows.csv");
  const PerfRun run = runPerf("allgather -b 64 -e 4K -f 8 --np 2 -c 1 -n 2 -w 1 -z 1 --csv " + csv);
  ASSERT_EQ(run.exitCode, 0) << run.out << run.err;
  EXPECT_EQ(run.err, "");  // stderr is a file here: no progress line

  std::vector<std::vector<std::string>> tableRows;
  for (const std::string& line : lines(run.out))
    if (!line.empty() && line[0] != '#') tableRows.push_back(fields(line));
  const std::vector<std::string> csvLines = lines(readFile(csv));
  std::remove(csv.c_str());
  ASSERT_EQ(csvLines.size(), 1 + tableRows.size()) << run.out;
  ASSERT_EQ(tableRows.size(), 3u);  // 64, 512, 4096 bytes
  const std::vector<std::string> header = splitCsv(csvLines[0]);
  ASSERT_EQ(header.size(), 28u);
  const auto column = [&](const std::string& name) {
    const size_t at = std::find(header.begin(), header.end(), name) - header.begin();
    EXPECT_LT(at, header.size()) << name;
    return at;
  };
  for (size_t i = 0; i < tableRows.size(); ++i) {
    const std::vector<std::string> f = splitCsv(csvLines[1 + i]);
    ASSERT_EQ(f.size(), header.size()) << csvLines[1 + i];
    EXPECT_EQ(f[column("tool")], "braid-perf");
    EXPECT_EQ(f[column("collective")], "allgather");
    EXPECT_EQ(f[column("nranks")], "2");
    EXPECT_EQ(f[column("launch")], "fork");
    EXPECT_EQ(f[column("iters")], "2");
    EXPECT_EQ(f[column("blocking")], "1");
    EXPECT_EQ(f[column("size_bytes")], tableRows[i][0]);
    EXPECT_EQ(f[column("count")], tableRows[i][1]);
    EXPECT_EQ(f[column("type")], "float");
    EXPECT_EQ(f[column("redop")], "none");
    // The table rounds what the CSV holds in full.
    EXPECT_NEAR(std::stod(f[column("oop_busbw_gbps")]), std::stod(tableRows[i][7]), 0.0051);
    EXPECT_NEAR(std::stod(f[column("ip_time_us")]), std::stod(tableRows[i][9]),
                0.006 + std::stod(tableRows[i][9]) * 0.001);
    EXPECT_EQ(f[column("oop_wrong")], "0");
    EXPECT_EQ(f[column("ip_wrong")], "0");
  }
}

// Runs braid-perf with stderr on a pseudo-terminal (stdout discarded); returns what the terminal
// showed, or stops after 120 seconds.
std::string stderrOnTerminal(const char* collective) {
  int master = -1;
  const pid_t pid = forkpty(&master, nullptr, nullptr, nullptr);
  if (pid == 0) {
    freopen("/dev/null", "w", stdout);
    execl(BRAID_PERF_PATH, "braid-perf", collective, "-b", "8", "-e", "64", "-f", "8", "--np", "2",
          "-n", "1", "-w", "0", "-T", "60", static_cast<char*>(nullptr));
    _exit(127);
  }
  std::string shown;
  if (pid < 0) return shown;
  char chunk[256];
  pollfd readable{master, POLLIN, 0};
  while (poll(&readable, 1, 120 * 1000) > 0) {
    const ssize_t n = read(master, chunk, sizeof chunk);
    if (n <= 0) break;  // EIO once the child has closed the terminal
    shown.append(chunk, n);
  }
  close(master);
  kill(pid, SIGKILL);  // no-op when it has exited
  waitpid(pid, nullptr, 0);
  return shown;
}

TEST(BraidPerf, ProgressLineOnlyOnATerminal) {
  const std::string shown = stderrOnTerminal("allreduce");
  EXPECT_NE(shown.find("braid-perf: measuring 8 bytes float sum"), std::string::npos) << shown;
  EXPECT_NE(shown.find("braid-perf: measuring 64 bytes float sum"), std::string::npos) << shown;
}

TEST(BraidPerf, UncheckedAndUndefinedInPlaceSayNA) {
  const PerfRun run = runPerf("sendrecv -b 64 -e 64 --np 2 -c 0 -n 1 -w 0");
  ASSERT_EQ(run.exitCode, 0) << run.out << run.err;
  std::vector<std::string> row;
  for (const std::string& line : lines(run.out))
    if (!line.empty() && line[0] != '#') row = fields(line);
  ASSERT_EQ(row.size(), 14u) << run.out;
  EXPECT_EQ(row[8], "N/A");
  EXPECT_EQ(row[12], "N/A");
}

// A free TCP port on the loopback interface, for a rendezvous address.
// A port P below the ephemeral range (32768 and up on Linux) with P and P + 1 free: torchrun's
// MASTER_PORT, and braid's rendezvous at MASTER_PORT + 1, which no connection or listener that
// another test opens meanwhile can take as its ephemeral port.
int freeLoopbackPort() {
  auto freePort = [](int port) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    close(fd);
    return free;
  };
  for (int tries = 0, port = 20000 + getpid() % 12000; tries < 12000; ++tries) {
    port = port >= 31998 ? 20000 : port + 2;
    if (freePort(port) && freePort(port + 1)) return port;
  }
  return -1;
}

TEST(BraidPerf, UnderTorchrunEnvironmentEachProcessIsARank) {
  const int port = freeLoopbackPort();
  ASSERT_GT(port, 0);
  const std::string base = scratchPath("env");  // before fork: the name holds the pid
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("WORLD_SIZE", "2", 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      const std::string out = base + std::to_string(rank);
      freopen((out + ".out").c_str(), "w", stdout);
      freopen((out + ".err").c_str(), "w", stderr);
      // -T bounds the wait below: braid-perf stops itself.
      execl(BRAID_PERF_PATH, "braid-perf", "reduce", "-b", "8", "-e", "4K", "-f", "8", "-r", "1",
            "-n", "1", "-w", "0", "-T", "60", static_cast<char*>(nullptr));
      _exit(127);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  const std::string rank0 = readFile(base + "0.out");
  EXPECT_NE(rank0.find("nRanks 2"), std::string::npos) << rank0;
  EXPECT_NE(rank0.find("launch: environment (RANK)"), std::string::npos) << rank0;
  EXPECT_NE(rank0.find("# Out of bounds values : 0 OK"), std::string::npos) << rank0;
  EXPECT_EQ(readFile(base + "1.out"), "");  // only rank 0 prints
  for (const char* file : {"0.out", "0.err", "1.out", "1.err"}) std::remove((base + file).c_str());
}

// --env prints the parameter table: DESIGN.md's variables with the values this process would use.
TEST(BraidPerf, EnvPrintsTheTunablesInUse) {
  setenv("BRAID_TIMEOUT", "1234", 1);
  const PerfRun run = runPerf("--env");
  unsetenv("BRAID_TIMEOUT");
  ASSERT_EQ(run.exitCode, 0) << run.err;
  std::map<std::string, std::string> lineOf;
  for (const std::string& line : lines(run.out))
    if (line.rfind("BRAID_", 0) == 0) lineOf[fields(line)[0]] = line;
  for (const char* name : {"BRAID_DEBUG", "BRAID_DEBUG_SUBSYS", "BRAID_DEBUG_FILE", "BRAID_TIMEOUT",
                           "BRAID_BUFFSIZE", "BRAID_SOCKET_IFNAME", "BRAID_PLAN_FILE"})
    EXPECT_EQ(lineOf.count(name), 1u) << name << " missing from\n" << run.out;
  EXPECT_EQ(fields(lineOf["BRAID_DEBUG"])[1], "'WARN'");
  EXPECT_EQ(fields(lineOf["BRAID_TIMEOUT"])[1], "'1234'");
  EXPECT_NE(lineOf["BRAID_TIMEOUT"].find("(default '600000')"), std::string::npos)
      << lineOf["BRAID_TIMEOUT"];

  setenv("BRAID_TIMEOUT", "soon", 1);
  const PerfRun bad = runPerf("--env");
  unsetenv("BRAID_TIMEOUT");
  EXPECT_EQ(bad.exitCode, 2);
  EXPECT_NE(bad.err.find("braid-perf: environment variable BRAID_TIMEOUT='soon' is not an integer"),
            std::string::npos)
      << bad.err;
}

// --device cuda: ranks as threads on the GPU, buffers in its memory; where no GPU can be used,
// the run fails (exit 3) in one line with the communicator's reason.
TEST(BraidPerf, DeviceCudaRunsOrSaysWhyNot) {
  const PerfRun run = runPerf("allreduce --device cuda -t 2 -b 8 -e 64K -f 8");
  if (run.exitCode == 0) {
    EXPECT_NE(run.out.find("Out of bounds values : 0 OK"), std::string::npos) << run.out;
    return;
  }
  EXPECT_EQ(run.exitCode, 3) << run.err;
  EXPECT_NE(run.err.find("device 'cuda' was requested but no CUDA device can be used here"),
            std::string::npos)
      << run.err;
}

// -g: each thread drives several ranks (nccl-tests' GPUs per thread), their calls in one group;
// with -t 2 -g 2 four ranks in two threads, every element of every rank checked, and rooted and
// personalized collectives too. The ranks' count and the rows come out as with a rank per thread.
TEST(BraidPerf, SeveralRanksPerThreadRunInGroups) {
  for (const char* collective : {"allreduce", "reducescatter", "broadcast -r 3", "alltoall"}) {
    const PerfRun run =
        runPerf(std::string(collective) + " -t 2 -g 2 -b 64 -e 64K -f 32 -n 2 -w 1");
    ASSERT_EQ(run.exitCode, 0) << collective << "\n" << run.out << run.err;
    EXPECT_NE(run.out.find("# nThread 2 nGpus 2 nProcs 1 nRanks 4 "), std::string::npos) << run.out;
    EXPECT_NE(run.out.find("#  Rank  3 Pid"), std::string::npos) << run.out;
    EXPECT_NE(run.out.find("Out of bounds values : 0 OK"), std::string::npos) << run.out;
    int rows = 0;
    for (const std::string& line : lines(run.out))
      if (!line.empty() && line[0] != '#') {
        ++rows;
        const std::vector<std::string> f = fields(line);
        ASSERT_GE(f.size(), 9u) << line;
        EXPECT_EQ(f[8], "0") << collective << ": out-of-place wrong elements: " << line;
      }
    EXPECT_EQ(rows, 3) << run.out;  // 64, 2048, 65536 bytes
  }
}

TEST(BraidPerf, BadFlagsExitTwoWithOneLine) {
  for (const char* args : {"",
                           "gather",
                           "allreduce -d foo",
                           "allreduce -o xor",
                           "allreduce -b 1K -e 8",
                           "allreduce -b 2 -e 8",
                           "allreduce -d double -b 4 -e 8",
                           "allreduce -b 1X",
                           "allreduce -t 0",
                           "allreduce --np 0",
                           "allreduce -g 0",
                           "allreduce -n 0",
                           "allreduce -c 2",
                           "allreduce --bogus",
                           "broadcast -r 2 --np 2",
                           "allreduce --device gpu",
                           "allreduce -f 1 -i 0",
                           "allreduce -R 3",
                           "allreduce -R 2",
                           "allreduce --device cuda -R 2 -g 2"}) {
    const PerfRun run = runPerf(args);
    EXPECT_EQ(run.exitCode, 2) << args << "\n" << run.err;
    EXPECT_EQ(run.out, "") << args;
    const std::vector<std::string> errLines = lines(run.err);
    ASSERT_EQ(errLines.size(), 1u) << args << "\n" << run.err;
    EXPECT_EQ(errLines[0].rfind("braid-perf: ", 0), 0u) << errLines[0];
  }
}

}  // namespace
}  // namespace braid_perf
