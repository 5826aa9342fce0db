/* rng.c - Philox-4x32-10; see rng.h. */
#include "rng.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void mgc_rng_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

uint64_t mgc_rng_stream(int32_t layer, uint32_t site, uint32_t microbatch) {
    return ((uint64_t)(uint32_t)(layer + 1) << 40) | ((uint64_t)(site & 0xffu) << 32) | microbatch;
}

static void block(uint64_t seed, uint64_t stream, uint64_t blk, uint32_t out[4]) {
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t ctr[4] = {(uint32_t)blk, (uint32_t)(blk >> 32), (uint32_t)stream,
                       (uint32_t)(stream >> 32)};
    mgc_rng_philox4x32(ctr, key, out);
}

uint32_t mgc_rng_u32(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t w[4];
    block(seed, stream, index >> 2, w);
    return w[index & 3];
}

void mgc_rng_fill_u32(uint32_t *out, int64_t n, uint64_t seed, uint64_t stream, uint64_t elem0) {
    uint32_t w[4];
    uint64_t cur = UINT64_MAX;
    for (int64_t i = 0; i < n; i++) {
        uint64_t e = elem0 + (uint64_t)i;
        if ((e >> 2) != cur) {
            cur = e >> 2;
            block(seed, stream, cur, w);
        }
        out[i] = w[e & 3];
    }
}

uint32_t mgc_rng_drop_threshold(double p) {
    if (!(p > 0.0)) return 0;
    double t = p * 4294967296.0;
    if (t >= 4294967295.0) return 0xffffffffu;
    return (uint32_t)t;
}

uint64_t mgc_rng_name_hash(const char *name) {
    uint64_t h = 1469598103934665603ull;
    for (; name && *name; name++)
        h = (h ^ (unsigned char)*name) * 1099511628211ull;
    return h;
}
