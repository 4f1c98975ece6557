// All built-in CPU rules behind one switch. Each rule lives in its own header.
#pragma once

#include "kernels/block.h"
#include "kernels/greedy.h"
#include "kernels/token.h"
#include "kernels/top_beta.h"
#include "kernels/typical.h"

namespace specdecode {
namespace kernels {

template <class Dist>
inline RowResult verify_row(Rule rule, const RowArgs<Dist>& args) {
  switch (rule) {
    case Rule::kToken: return token_verify_row(args);
    case Rule::kBlock: return block_verify_row(args);
    case Rule::kGreedy: return greedy_verify_row(args);
    case Rule::kTypical: return typical_verify_row(args);
    case Rule::kTopBeta: return top_beta_verify_row(args);
  }
  return {0, kOk};
}

// A rule that reads q (the draft's distributions).
inline bool rule_needs_draft(Rule rule) { return rule == Rule::kToken || rule == Rule::kBlock; }

}  // namespace kernels
}  // namespace specdecode
