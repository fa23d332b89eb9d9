// The bootstrap's ids derived from the environment: the job's secret seed, and bytes derived from
// a seed, the same on every rank that derives them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace braid::bootstrap_detail {

// FNV-1a 64 over the lane number and the seed, one lane per 8 bytes. Not cryptographic: an
// environment-derived secret only keeps strangers and other jobs out, and is as guessable as the
// job id it comes from.
void deriveBytes(const std::string& seed, uint8_t* out, size_t bytes);

// The same on every rank of one job, different between jobs.
std::string secretSeedFromEnv(const std::string& hostPort);

}  // namespace braid::bootstrap_detail
