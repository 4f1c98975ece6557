// The pybind11 extension module specdecode._C. Loading it runs the static TORCH_LIBRARY
// registrations of every op in this shared library; it also reports what was built.
#include <pybind11/pybind11.h>
#include <torch/version.h>

#include "kernels/logit_loops.h"
#include "ops/linear_cpu.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "specdecode compiled ops (registered under torch.ops.specdecode)";
  m.def("build_info", [] {
    py::dict info;
#ifdef SPECDECODE_WITH_CUDA
    info["cuda"] = true;
#else
    info["cuda"] = false;
#endif
    info["compiler"] = SPECDECODE_CXX_COMPILER;
    info["torch_build_version"] = TORCH_VERSION;
    info["cxx11_abi"] = static_cast<bool>(_GLIBCXX_USE_CXX11_ABI);
    // The instruction set the CPU logit loops run with in this process (SPECDECODE_CPU_ISA
    // can narrow it; see kernels/logit_loops.h).
    info["cpu_isa"] = specdecode::kernels::logit_loops_isa();
    // Whether the CPU fast path's skinny_linear runs its loop on torch's threads (OpenMP).
    info["skinny_linear_parallel"] = specdecode::ops::skinny_linear_is_parallel();
    return info;
  });
}
