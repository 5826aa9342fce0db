/* cpu_ops.c - the CPU reference kernels (see cpu_ops.h), instantiated for float and double
 * from cpu_ops_tmpl.h, plus the optimizer, gradient norm and learning-rate schedule. */
#include "cpu_ops.h"

#include <cblas.h>
#include <math.h>
#include <tgmath.h>

#define R        float
#define FN(name) name##_f32
#define GEMM     cblas_sgemm
#include "cpu_ops_tmpl.h"
#undef R
#undef FN
#undef GEMM
#undef GELU_C

#define R        double
#define FN(name) name##_f64
#define GEMM     cblas_dgemm
#include "cpu_ops_tmpl.h"
#undef R
#undef FN
#undef GEMM
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
    double ratio = (double)(step - s->warmup_steps) / (double)(s->decay_steps - s->warmup_steps);
    double coeff =
        s->decay == MGC_LR_LINEAR ? 1.0 - ratio : 0.5 * (cos(3.14159265358979323846 * ratio) + 1.0);
    return s->min_lr + coeff * (s->max_lr - s->min_lr);
}
