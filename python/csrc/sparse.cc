#include "sparse.h"

#include <vector>

#include "common.h"

namespace braid_torch {
namespace {

constexpr int64_t kMaxDims = 8;
// What a rank's sparse tensor is, to be gathered from every rank: [sparse dims, dense dims,
// entries, value type, dims, size 0, ..., size 7], sizes beyond the dims (or of a tensor of
// more) -1.
constexpr int64_t kEntriesWord = 2;
constexpr int64_t kSizesWord = 5;
constexpr int64_t kHeaderWords = kSizesWord + kMaxDims;

at::Tensor headerOf(const at::Tensor& t) {
  at::Tensor header = at::full({kHeaderWords}, -1, at::kLong);
  int64_t* words = header.data_ptr<int64_t>();
  words[0] = t.sparse_dim();
  words[1] = t.dense_dim();
  words[kEntriesWord] = t._nnz();
  words[3] = static_cast<int64_t>(t.scalar_type());
  words[4] = t.dim();
  for (int64_t d = 0; d < t.dim() && d < kMaxDims; ++d) words[kSizesWord + d] = t.size(d);
  return header;
}

// Every rank's `mine` (contiguous, the same sizes on every rank), stacked in rank order.
at::Tensor gathered(braidComm_t comm, int nranks, const at::Tensor& mine, const char* what) {
  std::vector<int64_t> shape{nranks};
  shape.insert(shape.end(), mine.sizes().begin(), mine.sizes().end());
  at::Tensor all = at::empty(shape, mine.options());
  check(comm,
        braidAllGather(mine.data_ptr(), all.data_ptr(), static_cast<size_t>(mine.numel()),
                       braidType(mine), comm, nullptr),
        what);
  return all;
}

// Every rank sees every header, so a rank whose tensor differs fails the call on every rank.
void checkAlike(const at::Tensor& headers, const at::Tensor& local) {
  TORCH_CHECK(local.dim() <= kMaxDims, "braid backend: sparse all_reduce of a tensor of ",
              local.dim(), " dimensions (expected at most ", kMaxDims, ")");
  at::Tensor shapes = headers.clone();
  shapes.select(1, kEntriesWord).zero_();
  for (int64_t r = 1; r < shapes.size(0); ++r)
    TORCH_CHECK(at::equal(shapes[r], shapes[0]), "braid backend: sparse all_reduce: rank ", r,
                "'s tensor is [sparse dims, dense dims, -, value type, dims, sizes...] ", shapes[r],
                " but rank 0's is ", shapes[0],
                " (expected the same sizes and type on every rank)");
}

}  // namespace

at::Tensor sparseSum(braidComm_t comm, int nranks, const at::Tensor& input) {
  const at::Tensor local = input.coalesce();
  const at::Tensor headers =
      gathered(comm, nranks, headerOf(local), "braidAllGather (sparse all_reduce's sizes)");
  checkAlike(headers, local);
  const at::Tensor entries = headers.select(1, kEntriesWord);
  const int64_t most = entries.max().item<int64_t>();
  if (most == 0) return local.clone();
  // Indices [sparse dims, entries] and values [entries, dense sizes...], padded to `most`.
  const int64_t mine = local._nnz();
  at::Tensor indices = at::zeros({local.sparse_dim(), most}, at::kLong);
  indices.narrow(1, 0, mine).copy_(local._indices());
  std::vector<int64_t> valueShape = local._values().sizes().vec();
  valueShape[0] = most;
  at::Tensor values = at::zeros(valueShape, local._values().options());
  values.narrow(0, 0, mine).copy_(local._values());
  const at::Tensor allIndices =
      gathered(comm, nranks, indices, "braidAllGather (sparse all_reduce's indices)");
  const at::Tensor allValues =
      gathered(comm, nranks, values, "braidAllGather (sparse all_reduce's values)");
  std::vector<at::Tensor> indexPieces, valuePieces;
  for (int r = 0; r < nranks; ++r) {
    const int64_t n = entries[r].item<int64_t>();
    indexPieces.push_back(allIndices[r].narrow(1, 0, n));
    valuePieces.push_back(allValues[r].narrow(0, 0, n));
  }
  return at::sparse_coo_tensor(at::cat(indexPieces, 1), at::cat(valuePieces, 0), local.sizes(),
                               local.options())
      .coalesce();
}

}  // namespace braid_torch
