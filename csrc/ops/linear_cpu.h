// What bindings.cpp reports about the CPU fast path (linear_cpu.cpp).
#pragma once

namespace specdecode {
namespace ops {

// Whether skinny_linear's loop over output features runs in parallel (the file was compiled
// with OpenMP, as torch's at::parallel_for needs).
bool skinny_linear_is_parallel();

}  // namespace ops
}  // namespace specdecode
