#include "base/params.h"

#include <cstdlib>
#include <string>

#include "base/error.h"

namespace braid::param {
namespace {

std::string parse(const char* env, const char* raw, const std::string&) {
  return raw;
}

int64_t parse(const char* env, const char* raw, int64_t) {
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(raw, &end, 0);
  if (errno != 0 || end == raw || *end != '\0')
    fail(braidInvalidArgument, "environment variable {}='{}' is not an integer", env, raw);
  return value;
}

double parse(const char* env, const char* raw, double) {
  char* end = nullptr;
  errno = 0;
  double value = std::strtod(raw, &end);
  if (errno != 0 || end == raw || *end != '\0' || !(value >= 0))
    fail(braidInvalidArgument, "environment variable {}='{}' is not a non-negative number", env,
         raw);
  return value;
}

bool isSet(const char* env) {
  const char* raw = std::getenv(env);
  return raw != nullptr && *raw != '\0';
}

template <typename T>
T readEnv(const char* env, const T& def) {
  return isSet(env) ? parse(env, std::getenv(env), def) : def;
}

std::string show(const std::string& v) {
  return v;
}
std::string show(int64_t v) {
  return std::to_string(v);
}
std::string show(double v) {
  return fmt::format("{}", v);
}

}  // namespace

#define BRAID_DEFINE_PARAM(name, env, type, def, help) \
  const type& name() {                                 \
    static const type value = readEnv<type>(env, def); \
    return value;                                      \
  }                                                    \
  type name##Now() {                                   \
    return readEnv<type>(env, def);                    \
  }                                                    \
  bool name##IsSet() {                                 \
    return isSet(env);                                 \
  }
BRAID_PARAMS(BRAID_DEFINE_PARAM)
#undef BRAID_DEFINE_PARAM

std::vector<Description> describeAll() {
  std::vector<Description> all;
#define BRAID_DESCRIBE_PARAM(name, env, type, def, help) \
  all.push_back({env, show(type(def)), show(name()), help});
  BRAID_PARAMS(BRAID_DESCRIBE_PARAM)
#undef BRAID_DESCRIBE_PARAM
  return all;
}

int64_t fifoBytes() {
  return BuffSize() != 0 ? BuffSize() : int64_t{1} << 20;
}

}  // namespace braid::param
