#include "float_convert.h"

#include <cstring>

namespace ndp {

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF, bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exponent = 127 - 15 + 1;
      while (!(mantissa & 0x400)) {
        mantissa <<= 1;
        --exponent;
      }
      bits = sign | (exponent << 23) | ((mantissa & 0x3FF) << 13);
    }
  } else if (exponent == 0x1F) {
    bits = sign | 0x7F800000 | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t FloatToHalf(float f) {  // round to nearest even
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t abs = bits & 0x7FFFFFFF;
  if (abs >= 0x7F800000) return sign | (abs > 0x7F800000 ? 0x7E00 : 0x7C00);
  if (abs >= 0x477FF000) return sign | 0x7C00;  // overflow to infinity
  if (abs < 0x38800000) {                       // subnormal or zero
    if (abs < 0x33000000) return sign;
    const uint32_t shift = 113 - (abs >> 23), mantissa = (abs & 0x7FFFFF) | 0x800000;
    uint32_t value = mantissa >> (shift + 13);
    const uint32_t rest = mantissa & ((1u << (shift + 13)) - 1), half = 1u << (shift + 12);
    if (rest > half || (rest == half && (value & 1))) ++value;
    return sign | static_cast<uint16_t>(value);
  }
  uint32_t value = ((abs >> 13) - (112u << 10));
  const uint32_t rest = abs & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (value & 1))) ++value;
  return sign | static_cast<uint16_t>(value);
}

float BFloat16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t FloatToBFloat16(float f) {  // round to nearest even, NaN kept quiet
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace ndp
