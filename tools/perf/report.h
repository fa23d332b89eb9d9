// The nccl-tests table braid-perf prints on rank 0, and the same rows as JSON (--json).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "perf/options.h"

namespace braid_perf {

struct RankInfo {
  int rank;
  int pid;
  std::string host;
};

// How the ranks were started, for the header and the JSON configuration.
struct RunInfo {
  std::string launch;  // "fork", "threads" or "environment (<variable>)"
  int processes;
  int threadsPerProcess;
  int nranks;
  std::string braidVersion;  // the measured library's version (braid's, or a peer's)
  std::vector<RankInfo> ranks;
  // Who prints the table and what it measures: bench/peers reuse it for MPI and Gloo.
  std::string tool = "braid-perf";
  std::string library = "braid";
  bool predicts = false;  // rows carry the planner's predicted busbw (a last column)
  std::string plan;       // the communicator's plan, printed as "# plan:" lines in the header
  std::string binding;    // how ranks were placed on cores; empty: left to the kernel
  // A device-to-device copy's bandwidth on the first rank's GPU (reads and writes, GB/s); > 0:
  // rows carry the fraction of it reached (a column after the prediction).
  double deviceCopyGBs = 0;
};

struct Measurement {
  double timeUs;
  double algbw;  // GB/s, GB = 1e9 bytes
  double busbw;
  int64_t wrong;  // -1: not checked (printed N/A)
  // On a device: the fewest bytes the ranks sharing it must read and write (inputs once, outputs
  // once) per second, over its copy bandwidth; -1: not on a device.
  double copyFraction = -1;
};

struct Row {
  size_t bytes;
  size_t count;
  const char* type;
  const char* redop;
  int root;
  Measurement outOfPlace;
  Measurement inPlace;
  double predictedBusbw = -1;  // GB/s; -1: no prediction (printed N/A)
};

// nccl-tests' time column: 2 decimals below 100 us, 1 below 10 ms, none above.
std::string formatTime(double timeUs);
std::string formatRow(const Row& row);
// The two column-header lines (names, units), exactly as nccl-tests prints them, and braid's
// column of predicted busbw after them when `predicted`, then the out-of-place call's fraction of
// the device's copy bandwidth when `copyFraction`.
std::vector<std::string> columnHeader(bool predicted = false, bool copyFraction = false);

class Reporter {
 public:
  Reporter(std::FILE* out, const Options& options, RunInfo run);

  void printHeader();
  // "measuring <size> ..." on stderr, overwritten by the next, only when stderr is a terminal:
  // redirected output stays the table alone.
  void progress(size_t bytes, const char* type, const char* redop);
  void addRow(const Row& row);
  // Prints "# Out of bounds values" and "# Avg bus bandwidth"; writes --json and --csv if asked
  // (throws RunError if it cannot).
  void finish();

  int64_t wrongTotal() const;

 private:
  double averageBusbw() const;
  void writeJson() const;
  void writeCsv() const;

  std::FILE* out_;
  const Options& options_;
  RunInfo run_;
  std::vector<Row> rows_;
  bool progressShown_ = false;
};

}  // namespace braid_perf
