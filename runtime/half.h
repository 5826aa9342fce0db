/* half.h - host-side conversions between fp32 and the two 16-bit storage types (bf16, fp16),
 * bit for bit what the CUDA kernels do (kernels/mgc_common.cuh): round to nearest even;
 * fp16 overflows to infinity and keeps subnormals; NaN stays NaN (quiet).  Header-only. */
#ifndef MGC_HALF_H
#define MGC_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint16_t mgc_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float mgc_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t mgc_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a >= 0x47800000u) return (uint16_t)(sign | 0x7c00u); /* >= 65536: infinity */
    if (a >= 0x38800000u) {                                  /* a normal fp16 (>= 2^-14) */
        uint32_t r = a - 0x38000000u;                        /* exponent rebased 127 -> 15 */
        r += 0x0fffu + ((r >> 13) & 1u);                     /* nearest even; may carry to inf */
        return (uint16_t)(sign | (r >> 13));
    }
    uint32_t e = a >> 23;
    if (e < 102) return sign; /* below 2^-25: rounds to zero */
    uint32_t m = (a & 0x7fffffu) | 0x800000u, s = 126 - e; /* subnormal: m * 2^-s units of 2^-24 */
    uint32_t hm = m >> s, rem = m & ((1u << s) - 1u), halfway = 1u << (s - 1);
    if (rem > halfway || (rem == halfway && (hm & 1u))) hm++;
    return (uint16_t)(sign | hm);
}

static inline float mgc_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0) {
        if (!m) {
            u = sign;
        } else { /* subnormal: normalise */
            e = 113;
            while (!(m & 0x400u)) {
                m <<= 1;
                e--;
            }
            u = sign | (e << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (e == 31) {
        u = sign | 0x7f800000u | (m << 13);
    } else {
        u = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif /* MGC_HALF_H */
