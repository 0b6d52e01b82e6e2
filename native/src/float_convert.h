// float16 / bfloat16 <-> float32 element conversions (IEEE 754 binary16; bfloat16 as the top half of a float32),
// shared by the panel kernels (widening stored weights), the MoE kernel and the EP glue (inputs and outputs).
#pragma once

#include <cstdint>

namespace ndp {

float HalfToFloat(uint16_t h);                // exact
uint16_t FloatToHalf(float f);                // round to nearest even; overflow to infinity
float BFloat16ToFloat(uint16_t b);            // exact
uint16_t FloatToBFloat16(float f);            // round to nearest even, NaN kept quiet

}  // namespace ndp
