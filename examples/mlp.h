// A small multi-layer perceptron with its own forward and backward pass (fp32 arithmetic), and a
// deterministic synthetic classification task. Shared by examples/train_mlp, the dp tests and
// the overlap benchmark; it knows nothing of braid.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace mlp {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A number in [-1, 1) that depends only on (seed, index).
inline float uniform(uint64_t seed, uint64_t index) {
  const uint64_t bits = splitmix64(splitmix64(seed) ^ index) >> 40;  // 24 bits
  return static_cast<float>(bits) / static_cast<float>(1 << 23) - 1.0f;
}

// Sample i: features uniform in [-1, 1); its label is the class a fixed random linear teacher
// scores highest. Every rank computes the same sample i, so a global batch is just a range.
struct Task {
  int features = 16;
  int classes = 4;
  uint64_t seed = 1;

  void batch(uint64_t first, int count, float* x, int* labels) const {
    for (int s = 0; s < count; ++s) {
      float* row = x + static_cast<size_t>(s) * features;
      const uint64_t sample = first + s;
      for (int f = 0; f < features; ++f) row[f] = uniform(seed, sample * features + f);
      int best = 0;
      float bestScore = -INFINITY;
      for (int c = 0; c < classes; ++c) {
        float score = 0;
        for (int f = 0; f < features; ++f)
          score += uniform(~seed, static_cast<uint64_t>(c) * features + f) * row[f];
        if (score > bestScore) bestScore = score, best = c;
      }
      labels[s] = best;
    }
  }
};

// Layer l maps widths[l] inputs to widths[l + 1] outputs: weights stored [in][out], then a bias
// per output; ReLU between layers, softmax cross-entropy at the end.
class Model {
 public:
  explicit Model(std::vector<int> widths) : widths_(std::move(widths)), acts_(widths_.size()) {}

  int layers() const { return static_cast<int>(widths_.size()) - 1; }
  int inputs(int layer) const { return widths_[layer]; }
  int outputs(int layer) const { return widths_[layer + 1]; }
  size_t weightCount(int layer) const {
    return static_cast<size_t>(inputs(layer)) * outputs(layer);
  }

  // PyTorch's default for nn.Linear: uniform in +-1/sqrt(fan_in), here from (seed, layer).
  void initialize(uint64_t seed, int layer, std::span<float> weights,
                  std::span<float> biases) const {
    const float bound = 1.0f / std::sqrt(static_cast<float>(inputs(layer)));
    const uint64_t base = splitmix64(seed + 1000003ull * layer);
    for (size_t i = 0; i < weights.size(); ++i) weights[i] = bound * uniform(base, i);
    for (size_t i = 0; i < biases.size(); ++i) biases[i] = bound * uniform(~base, i);
  }

  // Mean cross-entropy over `batch` samples; keeps what backward() needs. weights[l] and
  // biases[l] are fp32 and must stay valid until backward() returns.
  double forward(std::span<const float* const> weights, std::span<const float* const> biases,
                 const float* x, const int* labels, int batch) {
    weights_.assign(weights.begin(), weights.end());
    labels_ = labels;
    batch_ = batch;
    acts_[0].assign(x, x + static_cast<size_t>(batch) * widths_[0]);
    for (int l = 0; l < layers(); ++l) {
      const int in = inputs(l), out = outputs(l);
      std::vector<float>& y = acts_[l + 1];
      y.resize(static_cast<size_t>(batch) * out);
      for (int s = 0; s < batch; ++s) {
        float* row = &y[static_cast<size_t>(s) * out];
        std::copy(biases[l], biases[l] + out, row);
        const float* a = &acts_[l][static_cast<size_t>(s) * in];
        for (int k = 0; k < in; ++k) {
          const float* w = weights[l] + static_cast<size_t>(k) * out;
          for (int o = 0; o < out; ++o) row[o] += a[k] * w[o];
        }
        if (l + 1 < layers())
          for (int o = 0; o < out; ++o) row[o] = std::max(row[o], 0.0f);
      }
    }
    // Softmax in place over the logits; the loss from the label's probability.
    const int classes = widths_.back();
    double loss = 0;
    for (int s = 0; s < batch; ++s) {
      float* p = &acts_.back()[static_cast<size_t>(s) * classes];
      const float top = *std::max_element(p, p + classes);
      float sum = 0;
      for (int c = 0; c < classes; ++c) sum += p[c] = std::exp(p[c] - top);
      for (int c = 0; c < classes; ++c) p[c] /= sum;
      loss -= std::log(std::max(p[labels[s]], 1e-30f));
    }
    return loss / batch;
  }

  // Gradients of gradScale x the mean loss. For each layer, last first, calls
  // onLayer(layer, dWeights, dBiases) as soon as they are computed, so a data-parallel trainer
  // can start reducing them while the earlier layers are still being worked on.
  template <typename OnLayer>
  void backward(float gradScale, OnLayer&& onLayer) {
    const int classes = widths_.back();
    std::vector<float> delta = acts_.back();  // softmax - onehot, scaled
    const float perSample = gradScale / static_cast<float>(batch_);
    for (int s = 0; s < batch_; ++s) {
      float* d = &delta[static_cast<size_t>(s) * classes];
      d[labels_[s]] -= 1.0f;
      for (int c = 0; c < classes; ++c) d[c] *= perSample;
    }
    std::vector<float> dWeights, dBiases, below;
    for (int l = layers() - 1; l >= 0; --l) {
      const int in = inputs(l), out = outputs(l);
      dWeights.assign(weightCount(l), 0.0f);
      dBiases.assign(out, 0.0f);
      for (int s = 0; s < batch_; ++s) {
        const float* d = &delta[static_cast<size_t>(s) * out];
        const float* a = &acts_[l][static_cast<size_t>(s) * in];
        for (int k = 0; k < in; ++k) {
          float* dw = &dWeights[static_cast<size_t>(k) * out];
          for (int o = 0; o < out; ++o) dw[o] += a[k] * d[o];
        }
        for (int o = 0; o < out; ++o) dBiases[o] += d[o];
      }
      onLayer(l, std::span<float>(dWeights), std::span<float>(dBiases));
      if (l == 0) break;
      below.assign(static_cast<size_t>(batch_) * in, 0.0f);
      for (int s = 0; s < batch_; ++s) {
        const float* d = &delta[static_cast<size_t>(s) * out];
        const float* a = &acts_[l][static_cast<size_t>(s) * in];
        float* b = &below[static_cast<size_t>(s) * in];
        for (int k = 0; k < in; ++k) {
          if (a[k] <= 0) continue;  // ReLU: no gradient where the unit was off
          const float* w = weights_[l] + static_cast<size_t>(k) * out;
          float sum = 0;
          for (int o = 0; o < out; ++o) sum += d[o] * w[o];
          b[k] = sum;
        }
      }
      delta.swap(below);
    }
  }

 private:
  std::vector<int> widths_;
  std::vector<std::vector<float>> acts_;  // inputs, hidden activations, softmax
  std::vector<const float*> weights_;
  const int* labels_ = nullptr;
  int batch_ = 0;
};

}  // namespace mlp
