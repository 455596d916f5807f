// The Hurwitz zeta recurrence zeta(s, q) = zeta(s, q + 1) + q^-s, shared by
// polygamma and zeta: CHLO sums their series from q with a fixed number of
// terms, which is right only for q above about 1 (garbage below about -7).
#pragma once

#include "lowering/builder.h"

namespace torch_pjrt::lowering::ops {

struct HurwitzShift {
  Value q;           // q moved up to [1, 2) where `active` (else unchanged)
  Value sum;         // the sum of the q^-s terms stepped over
  Value unfinished;  // still below 1 after 2^16 steps (q < -65535): the caller's NaN
};

// In a loop that runs as many steps as the most negative active element
// needs (CPU's zeta sums the same terms from q upward). float64 operands (the
// terms of a negative q cancel: CPU accumulates in double too).
HurwitzShift hurwitz_shift(Builder& b, const Value& s, const Value& q, const Value& active);

}  // namespace torch_pjrt::lowering::ops
