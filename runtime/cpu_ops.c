/* cpu_ops.c - the CPU reference kernels (see cpu_ops.h), instantiated for float and double
 * from cpu_ops_tmpl.h, plus the optimizer, gradient norm and learning-rate schedule. */
#include "cpu_ops.h"

#include <cblas.h>
#include <math.h>
#include <string.h>
#include <tgmath.h>

/* exp for the f32 kernels' inner loops: Cody-Waite reduction to |r| <= ln2/2 and a
 * degree-7 Taylor polynomial (truncation 6e-9, a few ulp in all), branch-free so loops
 * over it vectorise -- libm's expf does not.  Inputs below -87 give e^-87 (~1e-38)
 * instead of 0 and above 88 give e^88, which no kernel reaches; NaN stays NaN.  The file
 * is compiled with -fno-trapping-math (runtime/CMakeLists.txt), which lets GCC if-convert
 * the clamps; nothing here reads the floating-point exception flags. */
static inline float fast_expf(float x) {
    float c = x > 88.0f ? 88.0f : x;
    c = c < -87.0f ? -87.0f : c;
    float n = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = c - n * 0.693145751953125f - n * 1.428606765330187e-06f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 +
                      r * (1.0f / 720 + r * (1.0f / 5040)))))));
    union { int32_t i; float f; } sc;
    sc.i = ((int32_t)n + 127) << 23;
    float y = p * sc.f;
    return x != x ? x : y;
}

#define R        float
#define FN(name) name##_f32
#define GEMM     cblas_sgemm
#define FEXP(x)  fast_expf(x)
#include "cpu_ops_tmpl.h"
#undef R
#undef FN
#undef GEMM
#undef FEXP
#undef GELU_C

#define R        double
#define FN(name) name##_f64
#define GEMM     cblas_dgemm
#define FEXP(x)  exp(x)
#include "cpu_ops_tmpl.h"
#undef R
#undef FN
#undef GEMM
#undef FEXP
#undef GELU_C

/* ---- optimizer ------------------------------------------------------------------------ */

void mgc_cpu_adamw(float *param, const float *grad, float *m, float *v, int64_t n,
                   const mgc_adamw_cfg *cfg, int64_t step, double lr, double grad_scale,
                   int apply_decay) {
    double b1 = cfg->beta1, b2 = cfg->beta2;
    double c1 = 1.0 - pow(b1, (double)step), c2 = 1.0 - pow(b2, (double)step);
    double wd = apply_decay ? cfg->weight_decay : 0.0;
    for (int64_t i = 0; i < n; i++) {
        double g = (double)grad[i] * grad_scale;
        double mi = b1 * (double)m[i] + (1.0 - b1) * g;
        double vi = b2 * (double)v[i] + (1.0 - b2) * g * g;
        double p = (double)param[i];
        p -= lr * ((mi / c1) / (sqrt(vi / c2) + cfg->eps) + wd * p);
        m[i] = (float)mi;
        v[i] = (float)vi;
        param[i] = (float)p;
    }
}

double mgc_cpu_sumsq(const float *g, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)g[i] * (double)g[i];
    return s;
}

double mgc_cpu_clip_scale(double global_norm, double max_norm) {
    if (!(max_norm > 0)) return 1.0;
    double c = max_norm / (global_norm + 1e-6);
    return c < 1.0 ? c : 1.0;
}

double mgc_cpu_lr(const mgc_lr_sched *s, int64_t step) {
    if (s->warmup_steps > 0 && step <= s->warmup_steps)
        return s->max_lr * (double)step / (double)s->warmup_steps;
    if (s->decay == MGC_LR_CONSTANT) return s->max_lr;
    if (step >= s->decay_steps) return s->min_lr;
    if (s->decay == MGC_LR_WSD) { /* stable at max_lr, then the anneal (Megatron's WSD) */
        int64_t start = s->decay_steps - (s->wsd_steps > 0 ? s->wsd_steps : 1);
        if (step <= start) return s->max_lr;
        double r = (double)(step - start) / (double)(s->decay_steps - start), c;
        switch (s->wsd_shape) {
        case MGC_LR_WSD_LINEAR: c = 1.0 - r; break;
        case MGC_LR_WSD_COSINE: c = 0.5 * (cos(3.14159265358979323846 * r) + 1.0); break;
        case MGC_LR_WSD_MINUS_SQRT: c = 1.0 - sqrt(r); break;
        default: c = 2.0 * pow(0.5, r) - 1.0; break;
        }
        return s->min_lr + c * (s->max_lr - s->min_lr);
    }
    double ratio = (double)(step - s->warmup_steps) / (double)(s->decay_steps - s->warmup_steps);
    double coeff =
        s->decay == MGC_LR_LINEAR ? 1.0 - ratio : 0.5 * (cos(3.14159265358979323846 * ratio) + 1.0);
    return s->min_lr + coeff * (s->max_lr - s->min_lr);
}
