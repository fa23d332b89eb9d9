#include "perf/report.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "perf/types.h"

namespace braid_perf {
namespace {

std::string rightTrimmed(std::string line) {
  line.erase(line.find_last_not_of(' ') + 1);
  return line;
}

std::string formatMeasurement(const Measurement& m) {
  const std::string wrong = m.wrong < 0 ? "N/A" : std::to_string(m.wrong);
  return fmt::format("  {:>7}  {:6.2f}  {:6.2f}  {:>5}", formatTime(m.timeUs), m.algbw, m.busbw,
                     wrong);
}

nlohmann::json measurementJson(const Measurement& m) {
  nlohmann::json j = {{"time_us", m.timeUs}, {"algbw_gbps", m.algbw}, {"busbw_gbps", m.busbw}};
  if (m.copyFraction >= 0) j["copy_fraction"] = m.copyFraction;
  j["wrong"] = m.wrong < 0 ? nlohmann::json(nullptr) : nlohmann::json(m.wrong);
  return j;
}

}  // namespace

std::string formatTime(double timeUs) {
  if (timeUs >= 10000.0) return fmt::format("{:7.0f}", timeUs);
  if (timeUs >= 100.0) return fmt::format("{:7.1f}", timeUs);
  return fmt::format("{:7.2f}", timeUs);
}

std::string formatRow(const Row& row) {
  return fmt::format("{:12}  {:12}  {:>8}  {:>6}  {:6}", row.bytes, row.count, row.type, row.redop,
                     row.root) +
         formatMeasurement(row.outOfPlace) + formatMeasurement(row.inPlace);
}

std::vector<std::string> columnHeader(bool predicted, bool copyFraction) {
  std::string names = fmt::format(
      "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6} {:>6}  {:>7}  {:>6}  {:>6} {:>6}",
      "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
      "busbw", "#wrong");
  std::string units = fmt::format(
      "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>5}  {:>7}  {:>6}  {:>6}  "
      "{:>5}",
      "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
      "");
  if (predicted) {
    names += fmt::format("  {:>9}", "predicted");
    units += fmt::format("  {:>9}", "(GB/s)");
  }
  if (copyFraction) {
    names += fmt::format("  {:>6}", "ofcopy");
    units += fmt::format("  {:>6}", "(%)");
  }
  return {rightTrimmed(names), rightTrimmed(units)};
}

Reporter::Reporter(std::FILE* out, const Options& options, RunInfo run)
    : out_(out), options_(options), run_(std::move(run)) {}

void Reporter::printHeader() {
  const Options& o = options_;
  fmt::print(out_, "# {} {} ({} {})\n", run_.tool, o.collective->name, run_.library,
             run_.braidVersion);
  fmt::print(out_,
             "# nThread {} nGpus {} nProcs {} nRanks {} minBytes {} maxBytes {} step: {}({}) "
             "warmup iters: "
             "{} iters: {} agg iters: {} validation: {} blocking: {} device: {} launch: {} "
             "registration: {}\n",
             o.threadsPerProcess, o.ranksPerThread, run_.processes, run_.nranks, o.minBytes,
             o.maxBytes, o.stepFactor > 1 ? o.stepFactor : o.stepBytes,
             o.stepFactor > 1 ? "factor" : "bytes", o.warmupIters, o.iters, o.aggIters,
             o.check ? 1 : 0, o.blocking ? 1 : 0, o.device, run_.launch, o.registration);
  if (o.blocking)
    fmt::print(out_, "# Blocking Enabled: NULL stream, every call completes before it returns\n");
  if (!run_.binding.empty()) fmt::print(out_, "# Binding: {}\n", run_.binding);
  if (run_.deviceCopyGBs > 0)
    fmt::print(out_,
               "# Device copy bandwidth: {:.1f} GB/s (reads and writes; ofcopy: the inputs read "
               "and outputs written by the ranks on that device per second, as a share of it)\n",
               run_.deviceCopyGBs);
  std::istringstream plan(run_.plan);
  for (std::string line; std::getline(plan, line);) fmt::print(out_, "# plan: {}\n", line);
  fmt::print(out_, "#\n# Using devices\n");
  for (const RankInfo& r : run_.ranks)
    fmt::print(out_, "#  Rank {:2} Pid {:6} on {:>10} device {}\n", r.rank, r.pid, r.host,
               o.device);
  fmt::print(out_, "#\n");
  fmt::print(out_, "{}\n",
             rightTrimmed(fmt::format("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           "
                                      "out-of-place                       in-place",
                                      "", "", "", "", "")));
  for (const std::string& line : columnHeader(run_.predicts, run_.deviceCopyGBs > 0))
    fmt::print(out_, "{}\n", line);
  std::fflush(out_);
}

void Reporter::progress(size_t bytes, const char* type, const char* redop) {
  if (!isatty(fileno(stderr))) return;
  fmt::print(stderr, "\r{}: measuring {} bytes {} {} ...\x1b[K", run_.tool, bytes, type, redop);
  std::fflush(stderr);
  progressShown_ = true;
}

void Reporter::addRow(const Row& row) {
  rows_.push_back(row);
  std::string line = formatRow(row);
  if (run_.predicts)
    line += row.predictedBusbw < 0 ? fmt::format("  {:>9}", "N/A")
                                   : fmt::format("  {:9.2f}", row.predictedBusbw);
  if (run_.deviceCopyGBs > 0)
    line += row.outOfPlace.copyFraction < 0
                ? fmt::format("  {:>6}", "N/A")
                : fmt::format("  {:6.1f}", 100 * row.outOfPlace.copyFraction);
  fmt::print(out_, "{}\n", line);
  std::fflush(out_);
}

int64_t Reporter::wrongTotal() const {
  int64_t total = 0;
  for (const Row& row : rows_)
    total += std::max<int64_t>(row.outOfPlace.wrong, 0) + std::max<int64_t>(row.inPlace.wrong, 0);
  return total;
}

// nccl-tests averages busbw over every measurement, out-of-place and in-place alike.
double Reporter::averageBusbw() const {
  double sum = 0;
  for (const Row& row : rows_) sum += row.outOfPlace.busbw + row.inPlace.busbw;
  return rows_.empty() ? 0.0 : sum / (2.0 * rows_.size());
}

void Reporter::finish() {
  if (progressShown_) fmt::print(stderr, "\r\x1b[K");  // the table is complete: clear the line
  const int64_t wrong = wrongTotal();
  fmt::print(out_, "# Out of bounds values : {} {}\n", wrong, wrong == 0 ? "OK" : "FAILED");
  fmt::print(out_, "# Avg bus bandwidth    : {:g}\n#\n", averageBusbw());
  std::fflush(out_);
  if (!options_.jsonPath.empty()) writeJson();
  if (!options_.csvPath.empty()) writeCsv();
}

// One line per row, each repeating the run's configuration, so files from several runs (tools,
// machines) concatenate into one table.
void Reporter::writeCsv() const {
  const Options& o = options_;
  std::ofstream file(o.csvPath);
  file << "tool,library,version,collective,nranks,processes,threads_per_process,launch,host,"
          "device,iters,warmup_iters,check,blocking,size_bytes,count,type,redop,root,"
          "oop_time_us,oop_algbw_gbps,oop_busbw_gbps,oop_wrong,"
          "ip_time_us,ip_algbw_gbps,ip_busbw_gbps,ip_wrong,predicted_busbw_gbps\n";
  const std::string host = run_.ranks.empty() ? "" : run_.ranks[0].host;
  const auto measurement = [](const Measurement& m) {
    return fmt::format("{},{},{},{}", m.timeUs, m.algbw, m.busbw,
                       m.wrong < 0 ? "" : std::to_string(m.wrong));
  };
  for (const Row& row : rows_) {
    file << fmt::format("{},{},{},{},{},{},{},\"{}\",{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
                        run_.tool, run_.library, run_.braidVersion, o.collective->name, run_.nranks,
                        run_.processes, o.threadsPerProcess, run_.launch, host, o.device, o.iters,
                        o.warmupIters, o.check ? 1 : 0, o.blocking ? 1 : 0, row.bytes, row.count,
                        row.type, row.redop, row.root, measurement(row.outOfPlace),
                        measurement(row.inPlace),
                        row.predictedBusbw < 0 ? "" : fmt::format("{}", row.predictedBusbw));
  }
  if (!file)
    throw RunError(fmt::format("could not write --csv {}: {}", o.csvPath, std::strerror(errno)));
}

void Reporter::writeJson() const {
  const Options& o = options_;
  nlohmann::json datatypes = nlohmann::json::array(), ops = nlohmann::json::array();
  for (braidDataType_t t : o.datatypes) datatypes.push_back(datatypeInfo(t).name);
  for (braidRedOp_t op : o.ops) ops.push_back(kOpNames[op]);
  nlohmann::json ranks = nlohmann::json::array();
  for (const RankInfo& r : run_.ranks)
    ranks.push_back({{"rank", r.rank}, {"pid", r.pid}, {"host", r.host}});
  nlohmann::json rows = nlohmann::json::array();
  for (const Row& row : rows_) {
    rows.push_back(
        {{"size_bytes", row.bytes},
         {"count", row.count},
         {"type", row.type},
         {"redop", row.redop},
         {"root", row.root},
         {"out_of_place", measurementJson(row.outOfPlace)},
         {"in_place", measurementJson(row.inPlace)},
         {"predicted_busbw_gbps",
          row.predictedBusbw < 0 ? nlohmann::json(nullptr) : nlohmann::json(row.predictedBusbw)}});
  }
  const nlohmann::json doc = {
      {"tool", run_.tool},
      {"braid_version", run_.braidVersion},
      {"collective", o.collective->name},
      {"config",
       {{"nranks", run_.nranks},
        {"processes", run_.processes},
        {"threads_per_process", o.threadsPerProcess},
        {"ranks_per_thread", o.ranksPerThread},
        {"device_copy_gbps", run_.deviceCopyGBs},
        {"launch", run_.launch},
        {"host", run_.ranks.empty() ? "" : run_.ranks[0].host},
        {"device", o.device},
        {"minbytes", o.minBytes},
        {"maxbytes", o.maxBytes},
        {"stepbytes", o.stepBytes},
        {"stepfactor", o.stepFactor},
        {"iters", o.iters},
        {"warmup_iters", o.warmupIters},
        {"agg_iters", o.aggIters},
        {"check", o.check},
        {"blocking", o.blocking},
        {"registration", o.registration},
        {"root", o.root},
        {"datatypes", datatypes},
        {"ops", ops}}},
      {"ranks", ranks},
      {"rows", rows},
      {"out_of_bounds_values", wrongTotal()},
      {"avg_busbw_gbps", averageBusbw()},
  };
  std::ofstream file(o.jsonPath);
  file << doc.dump(2) << "\n";
  if (!file)
    throw RunError(fmt::format("could not write --json {}: {}", o.jsonPath, std::strerror(errno)));
}

}  // namespace braid_perf
