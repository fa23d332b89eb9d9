#include "base/error.h"

#include <cstring>
#include <new>

namespace braid {

void failErrno(braidResult_t code, const std::string& what, int err) {
  throw Error(code, fmt::format("{}: {}", what, std::strerror(err)));
}

Error currentError(const std::string& where) {
  const std::string prefix = where.empty() ? "" : where + ": ";
  try {
    throw;
  } catch (const Error& e) {
    return e;
  } catch (const std::bad_alloc&) {
    return Error(braidSystemError, prefix + "out of memory");
  } catch (const std::exception& e) {
    return Error(braidInternalError, fmt::format("{}internal error: {}", prefix, e.what()));
  } catch (...) {
    return Error(braidInternalError, prefix + "internal error: an exception of unknown type");
  }
}

}  // namespace braid
