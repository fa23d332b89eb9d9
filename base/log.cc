#include "base/log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <sstream>
#include <string>

#include "base/params.h"

namespace braid::log {
namespace {

Level parseLevel(const std::string& name) {
  if (name == "NONE") return Level::None;
  if (name == "INFO") return Level::Info;
  if (name == "TRACE") return Level::Trace;
  return Level::Warn;
}

unsigned subsysBit(const std::string& name) {
  static const struct {
    const char* name;
    unsigned bit;
  } kNames[] = {{"INIT", kInit}, {"COLL", kColl},           {"P2P", kP2p}, {"SHM", kShm},
                {"NET", kNet},   {"BOOTSTRAP", kBootstrap}, {"ENV", kEnv}, {"ALL", kAll}};
  for (const auto& n : kNames)
    if (name == n.name) return n.bit;
  return 0;
}

unsigned parseSubsys(const std::string& list) {
  bool exclude = !list.empty() && list[0] == '^';
  unsigned mask = 0;
  std::stringstream in(exclude ? list.substr(1) : list);
  for (std::string item; std::getline(in, item, ',');) mask |= subsysBit(item);
  return exclude ? ~mask : mask;
}

std::string hostName() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return host;
}

FILE* openSink(const std::string& path) {
  if (path.empty()) return stderr;
  FILE* f = std::fopen(expandPath(path).c_str(), "a");
  return f != nullptr ? f : stderr;
}

// Never destroyed: threads such as the bootstrap root may log while the process exits.
std::mutex& sinkMutex() {
  static std::mutex& mutex = *new std::mutex;
  return mutex;
}

// Where lines go; under sinkMutex().
FILE*& sink() {
  static FILE* file = openSink(param::DebugFile());
  return file;
}

thread_local int tRank = -1;

const char* levelName(Level level) {
  switch (level) {
    case Level::Warn: return "WARN";
    case Level::Info: return "INFO";
    case Level::Trace: return "TRACE";
    default: return "";
  }
}

}  // namespace

std::string expandPath(const std::string& pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      char c = pattern[++i];
      if (c == 'h')
        out += hostName();
      else if (c == 'p')
        out += std::to_string(getpid());
      else
        out += c;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

Settings& settings() {
  static Settings s{parseLevel(param::Debug()), parseSubsys(param::DebugSubsys())};
  return s;
}

void rereadSettings() {
  Settings& s = settings();
  s.level.store(parseLevel(param::DebugNow()));
  s.subsys.store(parseSubsys(param::DebugSubsysNow()));
  std::lock_guard<std::mutex> lock(sinkMutex());
  FILE*& file = sink();
  if (file != stderr) std::fclose(file);
  file = openSink(param::DebugFileNow());
}

void setThreadRank(int rank) {
  tRank = rank;
}

void write(Level level, unsigned, const std::string& message) {
  // Never destroyed: threads such as the bootstrap root may log while the process exits.
  static const std::string& host = *new std::string(hostName());
  std::string rank = tRank >= 0 ? fmt::format(" [{}]", tRank) : std::string();
  std::string line =
      fmt::format("{}:{}:{}{} BRAID {} {}\n", host, getpid(),
                  static_cast<long>(syscall(SYS_gettid)), rank, levelName(level), message);
  std::lock_guard<std::mutex> lock(sinkMutex());
  std::fputs(line.c_str(), sink());
  std::fflush(sink());
}

}  // namespace braid::log
