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
// per output; ReLU between layers, softmax cross-entropy at the end. A Model may also be a stage
// of a pipeline: layers [first, last) only, reading the previous stage's activations and, unless
// it ends the model, producing activations for the next stage instead of the loss.
class Model {
 public:
  explicit Model(std::vector<int> widths) : Model(widths, 0, static_cast<int>(widths.size()) - 1) {}
  Model(std::vector<int> widths, int first, int last)
      : widths_(std::move(widths)), first_(first), last_(last), acts_(last - first + 1) {}

  int layers() const { return static_cast<int>(widths_.size()) - 1; }  // of the whole model
  int firstLayer() const { return first_; }
  int lastLayer() const { return last_; }  // one past this stage's last layer
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

  // Mean cross-entropy over `batch` samples (0 for a stage that does not end the model, whose
  // activations output() then holds); keeps what backward() needs. weights[i] and biases[i] are
  // layer first + i's, fp32, and must stay valid until backward() returns. x: the model's input
  // or the previous stage's output().
  double forward(std::span<const float* const> weights, std::span<const float* const> biases,
                 const float* x, const int* labels, int batch) {
    weights_.assign(weights.begin(), weights.end());
    labels_ = labels;
    batch_ = batch;
    acts_[0].assign(x, x + static_cast<size_t>(batch) * widths_[first_]);
    for (int l = first_; l < last_; ++l) {
      const int in = inputs(l), out = outputs(l);
      std::vector<float>& y = acts_[l + 1 - first_];
      y.resize(static_cast<size_t>(batch) * out);
      for (int s = 0; s < batch; ++s) {
        float* row = &y[static_cast<size_t>(s) * out];
        std::copy(biases[l - first_], biases[l - first_] + out, row);
        const float* a = &acts_[l - first_][static_cast<size_t>(s) * in];
        for (int k = 0; k < in; ++k) {
          const float* w = weights[l - first_] + static_cast<size_t>(k) * out;
          for (int o = 0; o < out; ++o) row[o] += a[k] * w[o];
        }
        if (l + 1 < layers())
          for (int o = 0; o < out; ++o) row[o] = std::max(row[o], 0.0f);
      }
    }
    if (last_ < layers()) return 0;
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

  // A stage's activations after forward(): batch x widths[last] (after the ReLU).
  std::span<const float> output() const { return acts_.back(); }

  // Gradients of gradScale x the mean loss. For each layer, last first, calls
  // onLayer(layer, dWeights, dBiases) as soon as they are computed, so a data-parallel trainer
  // can start reducing them while the earlier layers are still being worked on. The last stage of
  // a pipeline passes inputGradient, as the other stages' backward() below does.
  template <typename OnLayer>
  void backward(float gradScale, OnLayer&& onLayer, float* inputGradient = nullptr) {
    const int classes = widths_.back();
    std::vector<float> delta = acts_.back();  // softmax - onehot, scaled
    const float perSample = gradScale / static_cast<float>(batch_);
    for (int s = 0; s < batch_; ++s) {
      float* d = &delta[static_cast<size_t>(s) * classes];
      d[labels_[s]] -= 1.0f;
      for (int c = 0; c < classes; ++c) d[c] *= perSample;
    }
    giveInputGradient(backwardFrom(std::move(delta), inputGradient != nullptr, onLayer),
                      inputGradient);
  }

  // A stage's backward: outputGradient is the next stage's inputGradient (batch x widths[last]);
  // inputGradient (batch x widths[first]), if not null, receives the gradient with respect to this
  // stage's input, already through the previous layer's ReLU (what the previous stage's last layer
  // needs).
  template <typename OnLayer>
  void backward(std::span<const float> outputGradient, float* inputGradient, OnLayer&& onLayer) {
    giveInputGradient(backwardFrom(std::vector<float>(outputGradient.begin(), outputGradient.end()),
                                   inputGradient != nullptr, onLayer),
                      inputGradient);
  }

 private:
  // delta: the gradient with respect to layer last - 1's output (before its ReLU). Returns the
  // gradient with respect to the stage's input if asked for (never the model's input's).
  template <typename OnLayer>
  std::vector<float> backwardFrom(std::vector<float> delta, bool inputGradient, OnLayer& onLayer) {
    std::vector<float> dWeights, dBiases, below;
    for (int l = last_ - 1; l >= first_; --l) {
      const int in = inputs(l), out = outputs(l);
      const std::vector<float>& input = acts_[l - first_];
      dWeights.assign(weightCount(l), 0.0f);
      dBiases.assign(out, 0.0f);
      for (int s = 0; s < batch_; ++s) {
        const float* d = &delta[static_cast<size_t>(s) * out];
        const float* a = &input[static_cast<size_t>(s) * in];
        for (int k = 0; k < in; ++k) {
          float* dw = &dWeights[static_cast<size_t>(k) * out];
          for (int o = 0; o < out; ++o) dw[o] += a[k] * d[o];
        }
        for (int o = 0; o < out; ++o) dBiases[o] += d[o];
      }
      onLayer(l, std::span<float>(dWeights), std::span<float>(dBiases));
      if (l == 0 || (l == first_ && !inputGradient)) break;
      below.assign(static_cast<size_t>(batch_) * in, 0.0f);
      for (int s = 0; s < batch_; ++s) {
        const float* d = &delta[static_cast<size_t>(s) * out];
        const float* a = &input[static_cast<size_t>(s) * in];
        float* b = &below[static_cast<size_t>(s) * in];
        for (int k = 0; k < in; ++k) {
          if (a[k] <= 0) continue;  // ReLU: no gradient where the unit was off
          const float* w = weights_[l - first_] + static_cast<size_t>(k) * out;
          float sum = 0;
          for (int o = 0; o < out; ++o) sum += d[o] * w[o];
          b[k] = sum;
        }
      }
      if (l == first_) return below;
      delta.swap(below);
    }
    return {};
  }

  // Copies only where the caller passed a buffer (a null one is a constant the compiler sees).
  static void giveInputGradient(const std::vector<float>& gradient, float* to) {
    if (to != nullptr) std::copy(gradient.begin(), gradient.end(), to);
  }

  std::vector<int> widths_;
  int first_, last_;
  std::vector<std::vector<float>> acts_;  // inputs, hidden activations, softmax
  std::vector<const float*> weights_;
  const int* labels_ = nullptr;
  int batch_ = 0;
};

}  // namespace mlp
