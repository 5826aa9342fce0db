/* test_half.c - runtime/half.h against references computed here from the formats'
 * definitions in double arithmetic: every fp16 bit pattern decoded; fp32 -> fp16 on edge
 * cases and 2 million fresh random floats of every magnitude, by nearest search over the
 * fp16 values with ties to even; fp32 <-> bf16 likewise. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "half.h"
#include "testlib.h"

/* the value of fp16 bits h by the definition (NaN for NaN) */
static double f16_value(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0    ? ldexp(m, -24)
               : e == 31 ? (m ? NAN : INFINITY)
                         : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

/* fp32 -> fp16 by nearest search over the finite fp16 values, ties to even; |x| >= 65520 (half
 * way from 65504 to 2^16) is infinity */
static uint16_t f16_ref(float x) {
    uint16_t s = signbit(x) ? 0x8000u : 0u;
    double a = fabs((double)x);
    if (a >= 65520.0) return (uint16_t)(s | 0x7c00u);
    uint16_t lo = 0, hi = 0x7bff; /* largest k with value(k) <= a */
    while (lo < hi) {
        uint16_t mid = (uint16_t)((lo + hi + 1) / 2);
        if (f16_value(mid) <= a) lo = mid;
        else hi = (uint16_t)(mid - 1);
    }
    uint16_t k = lo;
    if (k == 0x7bff) return (uint16_t)(s | k); /* below 65520 */
    double d0 = a - f16_value(k), d1 = f16_value((uint16_t)(k + 1)) - a;
    if (d1 < d0 || (d1 == d0 && (k & 1))) k++;
    return (uint16_t)(s | k);
}

/* fp32 -> bf16 by definition: the nearest of the two bf16 neighbours, ties to even */
static uint16_t bf16_ref(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint16_t t = (uint16_t)(u >> 16); /* truncation: towards zero */
    uint32_t lo = (uint32_t)t << 16, hi = lo + 0x10000u;
    float flo, fhi;
    memcpy(&flo, &lo, 4);
    memcpy(&fhi, &hi, 4);
    double d0 = fabs((double)x - flo), d1 = fabs((double)fhi - x);
    if ((hi & 0x7f800000u) == 0x7f800000u) d1 = fabs((double)x) >= ldexp(0x1ffu, 119) ? 0 : INFINITY;
    return d1 < d0 || (d1 == d0 && (t & 1)) ? (uint16_t)(t + 1) : t;
}

static uint64_t rng_state;
static uint32_t rnd32(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 32);
}

int main(void) {
    rng_state = (uint64_t)time(NULL) * 2654435761u + 1u;
    /* every fp16 pattern decodes to its value, and encodes back to itself */
    int bad_dec = 0, bad_rt = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        double ref = f16_value((uint16_t)h);
        float got = mgc_f16_to_f32((uint16_t)h);
        if (isnan(ref) ? !isnan(got) : (double)got != ref || !signbit(got) != !signbit(ref)) bad_dec++;
        if (!isnan(ref) && mgc_f32_to_f16(got) != h) bad_rt++;
    }
    T_EQ_I64(bad_dec, 0);
    T_EQ_I64(bad_rt, 0);

    /* edges: zero, subnormal boundaries and ties, the largest finite, overflow, inf, NaN */
    const float edge[] = {0.0f,       -0.0f,        5.96e-8f,   2.98e-8f,     2.9802322e-8f,
                          8.940697e-8f, 6.1035156e-5f, 6.097555e-5f, 1.0f,       1.00048828125f,
                          1.000732421875f, 65504.0f,   65519.99f,   65520.0f,     65536.0f,
                          1e30f,      -1e30f,       INFINITY,   -INFINITY,    0.333333f};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) {
        T_EQ_U64(mgc_f32_to_f16(edge[i]), f16_ref(edge[i]));
        T_EQ_U64(mgc_f32_to_bf16(edge[i]), bf16_ref(edge[i]));
    }
    uint16_t qn = mgc_f32_to_f16(NAN), qb = mgc_f32_to_bf16(NAN);
    T_CHECK((qn & 0x7c00u) == 0x7c00u && (qn & 0x3ffu) != 0);
    T_CHECK(isnan(mgc_bf16_to_f32(qb)));

    /* fresh random floats of every exponent (fp16's range and beyond): encode by definition */
    int bad16 = 0, badbf = 0;
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = rnd32();
        if (i & 1) u = (u & 0x807fffffu) | ((uint32_t)(96 + rnd32() % 48) << 23); /* 2^-31 .. 2^16 */
        float x;
        memcpy(&x, &u, 4);
        if (isnan(x)) continue;
        if (mgc_f32_to_f16(x) != f16_ref(x)) bad16++;
        if (mgc_f32_to_bf16(x) != bf16_ref(x)) badbf++;
    }
    T_EQ_I64(bad16, 0);
    T_EQ_I64(badbf, 0);
    return t_summary("test_half");
}
