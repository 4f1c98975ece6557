// Python bindings of the CUDA op bodies (csrc/ops/verify_device.h) running the CUDA kernels
// under the emulator (cuda_emu.h) on CPU tensors: the same checks, messages, scratch layout,
// kernels and status handling as the real CUDA ops, minus the GPU. Built on demand by
// tests/cuda_emu/build.py; used by tests/test_cuda_emulation.py.
#include <torch/extension.h>

#include <optional>
#include <string>
#include <vector>

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
    const cudaError_t err = specdecode::kernels::cuda::launch_verify(problem, scratch, bytes, nullptr);
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

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "specdecode CUDA kernels under the CPU emulator (tests only)";
  m.def("verify_probs", &verify_probs);
  m.def("verify_logits", &verify_logits);
  m.def("verify_probs_philox", &verify_probs_philox);
  m.def("verify_logits_philox", &verify_logits_philox);
  m.def("sample_logits", &sample_logits);
  m.def("sample_logits_philox", &sample_logits_philox);
}
