// Python bindings of the CUDA op bodies (csrc/ops/verify_device.h, tree_verify_device.h)
// running the CUDA kernels under the emulator (cuda_emu.h) on CPU tensors: the same checks, messages, scratch layout,
// kernels and status handling as the real CUDA ops, minus the GPU. Built on demand by
// tests/cuda_emu/build.py; used by tests/test_cuda_emulation.py.
#include <torch/extension.h>

#include <optional>
#include <string>
#include <vector>

#include "kernels/common.h"
#include "kernels/cuda/pipeline.cuh"
#include "ops/tree_verify_device.h"
#include "ops/verify_device.h"

namespace {

namespace ops = specdecode::ops;

struct EmuBackend {
  bool capture = false;  // pretend a CUDA graph is being captured (Philox ops skip the raise)
  void check_device(const char* name, const at::Tensor& t) const {
    TORCH_CHECK_VALUE(t.is_cpu(), name, ": the emulated CUDA kernels need CPU tensors");
  }
  int guard(const at::Tensor&) const { return 0; }
  cudaStream_t stream() const { return nullptr; }
  bool capturing() const { return capture; }
  void launch(const char* op, const specdecode::kernels::cuda::VerifyProblem& problem, void* scratch,
              size_t bytes) const {
    check(op, specdecode::kernels::cuda::launch_verify(problem, scratch, bytes, nullptr));
  }
  void launch_processed_probs(const char* op, const specdecode::kernels::cuda::ProcessedProbsProblem& problem,
                              void* scratch, size_t bytes) const {
    check(op, specdecode::kernels::cuda::launch_processed_probs(problem, scratch, bytes, nullptr));
  }
  void launch_tree(const char* op, const specdecode::kernels::cuda::TreeVerifyProblem& problem, void* scratch,
                   size_t bytes) const {
    check(op, specdecode::kernels::cuda::launch_verify_tree(problem, scratch, bytes, nullptr));
  }
  static void check(const char* op, cudaError_t err) {
    TORCH_CHECK(err == cudaSuccess, op, ": emulated launch failed with cudaError_t ", static_cast<int>(err));
  }
};

using Pair = std::tuple<at::Tensor, at::Tensor>;

Pair verify_probs(const at::Tensor& target, const std::optional<at::Tensor>& draft, const at::Tensor& tokens,
                  const at::Tensor& num, const at::Tensor& uniforms, const std::string& rule,
                  const std::vector<double>& params) {
  return ops::verify_probs_device(EmuBackend{}, target, draft, tokens, num, uniforms, ops::CoinTensors(), rule, params);
}

Pair verify_logits(const at::Tensor& target, const std::optional<at::Tensor>& draft, const at::Tensor& tokens,
                   const at::Tensor& num, const at::Tensor& uniforms, double temperature, int64_t top_k, double top_p,
                   double min_p, const std::string& rule, const std::vector<double>& params) {
  return ops::verify_logits_device(EmuBackend{}, target, draft, tokens, num, uniforms, ops::CoinTensors(), temperature,
                                   top_k, top_p, min_p, rule, params);
}

Pair verify_probs_philox(const at::Tensor& target, const std::optional<at::Tensor>& draft, const at::Tensor& tokens,
                         const at::Tensor& num, const at::Tensor& seed, const at::Tensor& offset,
                         const std::string& rule, const std::vector<double>& params, bool capturing) {
  return ops::verify_probs_philox_device(EmuBackend{capturing}, target, draft, tokens, num, seed, offset, rule, params);
}

Pair verify_logits_philox(const at::Tensor& target, const std::optional<at::Tensor>& draft, const at::Tensor& tokens,
                          const at::Tensor& num, const at::Tensor& seed, const at::Tensor& offset, double temperature,
                          int64_t top_k, double top_p, double min_p, const std::string& rule,
                          const std::vector<double>& params, bool capturing) {
  return ops::verify_logits_philox_device(EmuBackend{capturing}, target, draft, tokens, num, seed, offset, temperature,
                                          top_k, top_p, min_p, rule, params);
}

at::Tensor sample_logits(const at::Tensor& logits, const at::Tensor& uniforms, double temperature, int64_t top_k,
                         double top_p, double min_p) {
  return ops::sample_logits_device(EmuBackend{}, logits, uniforms, ops::CoinTensors(), temperature, top_k, top_p,
                                   min_p);
}

at::Tensor sample_logits_philox(const at::Tensor& logits, const at::Tensor& seed, const at::Tensor& offset,
                                double temperature, int64_t top_k, double top_p, double min_p, bool capturing) {
  return ops::sample_logits_philox_device(EmuBackend{capturing}, logits, seed, offset, temperature, top_k, top_p,
                                          min_p);
}

at::Tensor processed_probs(const at::Tensor& logits, double temperature, int64_t top_k, double top_p, double min_p) {
  return ops::processed_probs_device(EmuBackend{}, logits, temperature, top_k, top_p, min_p);
}

using Triple = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

Triple verify_tree(const at::Tensor& target, const std::optional<at::Tensor>& draft, const at::Tensor& tokens,
                   const at::Tensor& parents, const at::Tensor& num_nodes, const at::Tensor& uniforms,
                   double temperature, int64_t top_k, double top_p, double min_p, const std::string& rule,
                   const std::vector<double>& params) {
  return ops::verify_tree_device(EmuBackend{}, target, draft, tokens, parents, num_nodes, uniforms, ops::CoinTensors(),
                                 temperature, top_k, top_p, min_p, rule, params);
}

Triple verify_tree_philox(const at::Tensor& target, const std::optional<at::Tensor>& draft, const at::Tensor& tokens,
                          const at::Tensor& parents, const at::Tensor& num_nodes, const at::Tensor& seed,
                          const at::Tensor& offset, double temperature, int64_t top_k, double top_p, double min_p,
                          const std::string& rule, const std::vector<double>& params, bool capturing) {
  return ops::verify_tree_philox_device(EmuBackend{capturing}, target, draft, tokens, parents, num_nodes, seed, offset,
                                        temperature, top_k, top_p, min_p, rule, params);
}

// The device search for min-p's logit threshold, and an independent oracle: plain bisection over
// the ordered float keys with the CPU's fast_exp_nonpositive (kernels/common.h).
float min_p_threshold(float max_logit, float inv_temp, float min_e) {
  return specdecode::kernels::cuda::min_p_logit_threshold(max_logit, inv_temp, min_e);
}

float min_p_threshold_oracle(float max_logit, float inv_temp, float min_e) {
  auto key = [](float v) {
    if (v == 0.0f) v = 0.0f;
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  };
  auto value = [](uint32_t k) {
    const uint32_t bits = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float v;
    std::memcpy(&v, &bits, 4);
    return v;
  };
  auto keeps = [&](uint32_t k) {
    const float z = (value(k) - max_logit) * inv_temp;  // built with -ffp-contract=off
    return specdecode::kernels::fast_exp_nonpositive(z) >= min_e;
  };
  uint32_t lo = key(-INFINITY), hi = key(max_logit);
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (keeps(mid)) hi = mid;
    else lo = mid;
  }
  return value(hi);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "specdecode CUDA kernels under the CPU emulator (tests only)";
  m.def("verify_probs", &verify_probs);
  m.def("verify_logits", &verify_logits);
  m.def("verify_probs_philox", &verify_probs_philox);
  m.def("verify_logits_philox", &verify_logits_philox);
  m.def("sample_logits", &sample_logits);
  m.def("sample_logits_philox", &sample_logits_philox);
  m.def("processed_probs", &processed_probs);
  m.def("verify_tree", &verify_tree);
  m.def("verify_tree_philox", &verify_tree_philox);
  m.def("min_p_threshold", &min_p_threshold);
  m.def("min_p_threshold_oracle", &min_p_threshold_oracle);
}
