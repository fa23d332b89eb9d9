#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "base/log.h"
#include "transport/local.h"

namespace braid {

std::string ShmSegment::name(uint64_t commNonce, int rank) {
  return fmt::format("/braid-{:016x}-{}", commNonce, rank);
}

std::shared_ptr<ShmSegment> ShmSegment::create(const std::string& name, size_t bytes, int rank) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) failErrno(braidSystemError, fmt::format("rank {}: shm_open({})", rank, name), errno);
  int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err != 0) {
    close(fd);
    shm_unlink(name.c_str());
    struct statvfs vfs = {};
    unsigned long long freeBytes = 0;
    if (statvfs("/dev/shm", &vfs) == 0)
      freeBytes = static_cast<unsigned long long>(vfs.f_bavail) * vfs.f_frsize;
    if (err == ENOSPC)
      fail(braidSystemError,
           "rank {}: /dev/shm is too small: the shared-memory transport needs {} bytes, {} are "
           "free (enlarge /dev/shm, e.g. docker --shm-size, or lower BRAID_BUFFSIZE)",
           rank, bytes, freeBytes);
    failErrno(braidSystemError,
              fmt::format("rank {}: reserving {} bytes for {}", rank, bytes, name), err);
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    int e = errno;
    shm_unlink(name.c_str());
    failErrno(braidSystemError, fmt::format("rank {}: mmap of {}", rank, name), e);
  }
  BRAID_INFO(log::kShm, "rank {}: created {} ({} bytes)", rank, name, bytes);
  return std::shared_ptr<ShmSegment>(
      new ShmSegment(name, static_cast<uint8_t*>(base), bytes, true));
}

std::shared_ptr<ShmSegment> ShmSegment::open(const std::string& name, int selfRank, int ownerRank) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0)
    failErrno(braidSystemError,
              fmt::format("rank {}: opening rank {}'s shared memory {}", selfRank, ownerRank, name),
              errno);
  struct stat st = {};
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    failErrno(braidSystemError, fmt::format("rank {}: fstat of {}", selfRank, name), e);
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED)
    failErrno(braidSystemError, fmt::format("rank {}: mmap of {}", selfRank, name), errno);
  return std::shared_ptr<ShmSegment>(
      new ShmSegment(name, static_cast<uint8_t*>(base), bytes, false));
}

void ShmSegment::unlink() {
  if (owner_ && !name_.empty()) {
    shm_unlink(name_.c_str());
    owner_ = false;
  }
}

ShmSegment::~ShmSegment() {
  unlink();
  munmap(base_, size_);
}

}  // namespace braid
