/* cpu_ops_api.h - per-type declarations of the CPU reference kernels.
 * Included by cpu_ops.h twice, with MGC_REAL = float / MGC_FN(x) = x##_f32 and with
 * MGC_REAL = double / MGC_FN(x) = x##_f64; include cpu_ops.h, not this file.
 * R below means MGC_REAL.  Shapes in comments; n = s*b rows. */
#if !defined(MGC_REAL) || !defined(MGC_FN)
#error "include cpu_ops.h"
#endif

/* ---- embedding ------------------------------------------------------------------------ */

/* out (s,b,h) = wte[tok - v0] when v0 <= tok < v0+V_l (a vocab-parallel shard), else 0;
 * plus wpe[p] (learned positions) when wpe is not NULL (pass it on one tensor rank), row (i, j)'s
 * position p = pos[i] (i when pos is NULL) minus docs[i*b + j] (its document's start,
 * reset_position_ids) when docs is not NULL. */
void MGC_FN(mgc_cpu_embedding_fwd)(MGC_REAL *out /* (s,b,h) */, const int32_t *tok /* (s,b) */,
                                   const MGC_REAL *wte /* (V_l,h) */, int64_t v0, int64_t V_l,
                                   const MGC_REAL *wpe /* (P,h) or NULL */,
                                   const int32_t *pos /* (s) or NULL */,
                                   const int32_t *docs /* (s,b) or NULL */, int64_t s, int64_t b,
                                   int64_t h);
/* dwte += scatter of dout over in-shard tokens; dwpe += per position (either may be NULL), rows
 * in order. */
void MGC_FN(mgc_cpu_embedding_bwd)(MGC_REAL *dwte /* (V_l,h) */, MGC_REAL *dwpe /* (P,h) */,
                                   const MGC_REAL *dout /* (s,b,h) */,
                                   const int32_t *tok /* (s,b) */, int64_t v0, int64_t V_l,
                                   const int32_t *pos /* (s) or NULL */,
                                   const int32_t *docs /* (s,b) or NULL */, int64_t s, int64_t b,
                                   int64_t h);

/* ---- norms ---------------------------------------------------------------------------- */

/* y = (x - mean) * rstd * w + bias, rstd = 1/sqrt(var + eps) (biased variance).
 * mean, rstd (n) are written when not NULL; bias may be NULL. */
void MGC_FN(mgc_cpu_layernorm_fwd)(MGC_REAL *y /* (n,h) */, MGC_REAL *mean, MGC_REAL *rstd,
                                   const MGC_REAL *x /* (n,h) */, const MGC_REAL *w /* (h) */,
                                   const MGC_REAL *bias /* (h) */, int64_t n, int64_t h,
                                   double eps);
/* dx written; dw, db accumulated (db may be NULL). Recomputes mean and rstd from x. */
void MGC_FN(mgc_cpu_layernorm_bwd)(MGC_REAL *dx /* (n,h) */, MGC_REAL *dw /* (h) */,
                                   MGC_REAL *db /* (h) */, const MGC_REAL *dy /* (n,h) */,
                                   const MGC_REAL *x, const MGC_REAL *w, int64_t n, int64_t h,
                                   double eps);
/* y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps); rstd (n) written when not NULL. */
void MGC_FN(mgc_cpu_rmsnorm_fwd)(MGC_REAL *y /* (n,h) */, MGC_REAL *rstd, const MGC_REAL *x,
                                 const MGC_REAL *w /* (h) */, int64_t n, int64_t h, double eps);
void MGC_FN(mgc_cpu_rmsnorm_bwd)(MGC_REAL *dx /* (n,h) */, MGC_REAL *dw /* (h) */,
                                 const MGC_REAL *dy, const MGC_REAL *x, const MGC_REAL *w,
                                 int64_t n, int64_t h, double eps);

/* ---- linear (BLAS) -------------------------------------------------------------------- */

/* y = x W^T + bias (bias may be NULL: row-parallel ranks other than 0). */
void MGC_FN(mgc_cpu_linear_fwd)(MGC_REAL *y /* (n,N) */, const MGC_REAL *x /* (n,K) */,
                                const MGC_REAL *W /* (N,K) */, const MGC_REAL *bias /* (N) */,
                                int64_t n, int64_t N, int64_t K);
/* dx = dy W (written). */
void MGC_FN(mgc_cpu_linear_dgrad)(MGC_REAL *dx /* (n,K) */, const MGC_REAL *dy /* (n,N) */,
                                  const MGC_REAL *W /* (N,K) */, int64_t n, int64_t N, int64_t K);
/* dW += dy^T x (GEMM with beta = 1); db += column sums of dy (db may be NULL). */
void MGC_FN(mgc_cpu_linear_wgrad)(MGC_REAL *dW /* (N,K) */, MGC_REAL *db /* (N) */,
                                  const MGC_REAL *dy /* (n,N) */, const MGC_REAL *x /* (n,K) */,
                                  int64_t n, int64_t N, int64_t K);
/* Grouped (MoE experts): rows are grouped by expert, counts[e] rows for expert e, e < E_l;
 * expert e's bias is row e of bias (E_l,N) (NULL: none), its gradient row e of db. */
void MGC_FN(mgc_cpu_grouped_linear_fwd)(MGC_REAL *y /* (rows,N) */,
                                        const MGC_REAL *x /* (rows,K) */,
                                        const MGC_REAL *W /* (E_l,N,K) */,
                                        const MGC_REAL *bias /* (E_l,N) or NULL */,
                                        const int32_t *counts /* (E_l) */, int64_t E_l, int64_t N,
                                        int64_t K);
void MGC_FN(mgc_cpu_grouped_linear_dgrad)(MGC_REAL *dx /* (rows,K) */, const MGC_REAL *dy,
                                          const MGC_REAL *W, const int32_t *counts, int64_t E_l,
                                          int64_t N, int64_t K);
void MGC_FN(mgc_cpu_grouped_linear_wgrad)(MGC_REAL *dW /* (E_l,N,K) */,
                                          MGC_REAL *db /* (E_l,N) += or NULL */, const MGC_REAL *dy,
                                          const MGC_REAL *x, const int32_t *counts, int64_t E_l,
                                          int64_t N, int64_t K);

/* ---- pointwise ------------------------------------------------------------------------ */

/* GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).  The
 * backward's dx may be dy (element by element, in place). */
void MGC_FN(mgc_cpu_gelu_fwd)(MGC_REAL *y, const MGC_REAL *x, int64_t n);
void MGC_FN(mgc_cpu_gelu_bwd)(MGC_REAL *dx, const MGC_REAL *dy, const MGC_REAL *x, int64_t n);
/* SwiGLU: x = [gate | up] along the last dim; y = silu(gate) * up. */
void MGC_FN(mgc_cpu_swiglu_fwd)(MGC_REAL *y /* (n,f) */, const MGC_REAL *x /* (n,2f) */, int64_t n,
                                int64_t f);
void MGC_FN(mgc_cpu_swiglu_bwd)(MGC_REAL *dx /* (n,2f) */, const MGC_REAL *dy /* (n,f) */,
                                const MGC_REAL *x /* (n,2f) */, int64_t n, int64_t f);
/* y = a + b; its backward is the identity for both inputs. */
void MGC_FN(mgc_cpu_add_fwd)(MGC_REAL *y, const MGC_REAL *a, const MGC_REAL *b, int64_t n);

/* ---- dropout (counter-based RNG: the mask is a function of (seed, stream, element)) ---- */

/* y = x * keep / (1-p), keep = word(seed, stream, elem0+i) >= threshold(p); mask (n) gets keep
 * when not NULL. p = 0 copies x (and writes an all-ones mask). */
void MGC_FN(mgc_cpu_dropout_fwd)(MGC_REAL *y, uint8_t *mask, const MGC_REAL *x, int64_t n, double p,
                                 const mgc_dropout_rng *rng);
/* dx = dy * keep / (1-p); keep read from mask, or regenerated from rng when mask is NULL. */
void MGC_FN(mgc_cpu_dropout_bwd)(MGC_REAL *dx, const MGC_REAL *dy, const uint8_t *mask, int64_t n,
                                 double p, const mgc_dropout_rng *rng);
/* y = residual + dropout(x) (the residual's gradient is dy; x's is dropout_bwd). */
void MGC_FN(mgc_cpu_dropout_add_fwd)(MGC_REAL *y, uint8_t *mask, const MGC_REAL *x,
                                     const MGC_REAL *residual, int64_t n, double p,
                                     const mgc_dropout_rng *rng);

/* ---- qkv split -------------------------------------------------------------------------- */

/* The fused QKV projection is group-major: each row is [g][per query heads, k, v][d] for G
 * kv groups of `per` query heads (G = 1 is the kv-replicated tensor-parallel shard:
 * [per q heads, k, v]). Split into q (n,G*per,d), k and v (n,G,d). */
void MGC_FN(mgc_cpu_qkv_split_fwd)(MGC_REAL *q, MGC_REAL *k, MGC_REAL *v,
                                   const MGC_REAL *qkv /* (n,G*(per+2)*d) */, int64_t n, int64_t G,
                                   int64_t per, int64_t d);
/* The transpose: dqkv (written) gathers dq, dk, dv back into the group-major row. */
void MGC_FN(mgc_cpu_qkv_split_bwd)(MGC_REAL *dqkv, const MGC_REAL *dq, const MGC_REAL *dk,
                                   const MGC_REAL *dv, int64_t n, int64_t G, int64_t per,
                                   int64_t d);

/* ---- rotary embeddings ---------------------------------------------------------------- */

/* Rotates the first rot_dim (even, <= d) features of every head, non-interleaved halves
 * (Megatron/NeoX rotate_half): for i < rot_dim/2, angle = pos * theta^(-2i/rot_dim),
 * (x_i, x_{i+rot_dim/2}) -> (x_i cos - x_j sin, x_j cos + x_i sin); the rest pass through.
 * Angles in double in both variants. y may equal x (in place).  Row (i, bi)'s position is
 * pos[i] (i when pos is NULL) minus docs[i*b + bi] (its document's start, reset_position_ids)
 * when docs is not NULL. */
void MGC_FN(mgc_cpu_rope_fwd)(MGC_REAL *y /* (s,b,H,d) */, const MGC_REAL *x /* (s,b,H,d) */,
                              const int32_t *pos /* (s) or NULL */,
                              const int32_t *docs /* (s,b) or NULL */, int64_t s, int64_t b,
                              int64_t H, int64_t d, int64_t rot_dim, double theta);
/* dx = rotation by -angle of dy (dx may equal dy). */
void MGC_FN(mgc_cpu_rope_bwd)(MGC_REAL *dx, const MGC_REAL *dy, const int32_t *pos,
                              const int32_t *docs, int64_t s, int64_t b, int64_t H, int64_t d,
                              int64_t rot_dim, double theta);

/* ---- attention ------------------------------------------------------------------------ */

/* Scratch elements the attention kernels take as `work`: the score block of one head and
 * packed copies of its rows (2 sq sk + 4 sq d + 4 sk d). */
int64_t MGC_FN(mgc_cpu_attention_work)(int64_t sq, int64_t sk, int64_t d);

/* Attention with grouped-query heads: query head a_i uses kv head a_i / (A/G) (A % G == 0).
 * scores = scale q.k; causal: key j is visible to query i iff kpos[j] <= qpos[i]
 * (qpos (sq), kpos (sk), NULL = 0..); documents (docs (sq,b) int32, NULL: none): and only iff
 * kpos[j] >= docs[i*b + bi], the position query i's document starts at; sliding window (window
 * > 0, causal): and only iff kpos[j] > qpos[i] - window; probabilities softmax over the visible keys, saved as
 * lse (sq,b,A) = logsumexp of the scores; attention dropout p > 0 drops probabilities with
 * the RNG at the element mgc_dropout_rng numbers (global head and positions). A row with no visible
 * key gets out = 0 and lse = -inf. */
void MGC_FN(mgc_cpu_attention_fwd)(MGC_REAL *out /* (sq,b,A,d) */, MGC_REAL *lse /* (sq,b,A) */,
                                   const MGC_REAL *q /* (sq,b,A,d) */,
                                   const MGC_REAL *k /* (sk,b,G,d) */,
                                   const MGC_REAL *v /* (sk,b,G,d) */, int64_t sq, int64_t sk,
                                   int64_t b, int64_t A, int64_t G, int64_t d, double scale,
                                   int causal, const int32_t *qpos, const int32_t *kpos,
                                   const int32_t *docs /* (sq,b) or NULL */,
                                   int64_t window /* causal: the latest `window` keys; 0 all */,
                                   double dropout_p,
                                   const mgc_dropout_rng *rng,
                                   MGC_REAL *work /* (mgc_cpu_attention_work) */);
/* dq written; dk, dv written (summed over the query heads of their group, fixed order).
 * Recomputes probabilities from q, k, lse; D_i = rowsum(dout * out). */
void MGC_FN(mgc_cpu_attention_bwd)(MGC_REAL *dq, MGC_REAL *dk, MGC_REAL *dv, const MGC_REAL *dout,
                                   const MGC_REAL *q, const MGC_REAL *k, const MGC_REAL *v,
                                   const MGC_REAL *out, const MGC_REAL *lse, int64_t sq, int64_t sk,
                                   int64_t b, int64_t A, int64_t G, int64_t d, double scale,
                                   int causal, const int32_t *qpos, const int32_t *kpos,
                                   const int32_t *docs /* (sq,b) or NULL */,
                                   int64_t window /* causal: the latest `window` keys; 0 all */,
                                   double dropout_p,
                                   const mgc_dropout_rng *rng,
                                   MGC_REAL *work /* (mgc_cpu_attention_work) */);

/* ---- vocab-parallel cross-entropy ------------------------------------------------------
 * logits (n,V_l) hold vocabulary columns [v0, v0+V_l). Phases, with TP all-reduces between:
 *   0 ce_max   -> mx (n)                          AR(max) over TP
 *   1 ce_sums  -> sumexp (n) = sum exp(l - mx), tgt (n) = logit of the label when the
 *                 label is in the shard else 0    AR(sum) over TP of both
 *   2 ce_finish-> lse = mx + log sumexp, loss[0] = sum_t mask_t (lse_t - tgt_t),
 *                 loss[1] = sum_t mask_t (mask NULL = all ones; token losses optional)
 * With tp = 1 the phases compose (mgc_cpu_ce_fwd does that).
 * Rows are `ld` apart; only the first V_l columns of a row take part: the columns
 * [V_l, ld) are vocabulary padding (rows past model.vocab_size), left out of the softmax and
 * given a zero gradient, so the padding -- which differs between tensor-parallel
 * degrees -- never changes the loss. */
void MGC_FN(mgc_cpu_ce_max)(MGC_REAL *mx /* (n) */, const MGC_REAL *logits /* (n,ld) */, int64_t n,
                            int64_t V_l, int64_t ld);
void MGC_FN(mgc_cpu_ce_sums)(MGC_REAL *sumexp /* (n) */, MGC_REAL *tgt /* (n) */,
                             const MGC_REAL *logits, const MGC_REAL *mx,
                             const int32_t *labels /* (n) */, int64_t v0, int64_t n, int64_t V_l,
                             int64_t ld);
void MGC_FN(mgc_cpu_ce_finish)(MGC_REAL *lse /* (n) */, MGC_REAL *loss /* (2) */,
                               MGC_REAL *token_loss /* (n) or NULL */, const MGC_REAL *mx,
                               const MGC_REAL *sumexp, const MGC_REAL *tgt,
                               const MGC_REAL *mask /* (n) or NULL */, int64_t n);
/* tp = 1: the three phases; work: 3n scratch elements. */
void MGC_FN(mgc_cpu_ce_fwd)(MGC_REAL *lse, MGC_REAL *loss /* (2) */, MGC_REAL *token_loss,
                            const MGC_REAL *logits, const int32_t *labels, const MGC_REAL *mask,
                            int64_t n, int64_t V, int64_t ld, MGC_REAL *work);
/* dlogits = (softmax - onehot(label)) * mask * dloss (dloss: d loss / d loss[0], e.g.
 * 1/count), from the saved lse (the global one). */
void MGC_FN(mgc_cpu_ce_bwd)(MGC_REAL *dlogits /* (n,V_l) */, const MGC_REAL *logits,
                            const MGC_REAL *lse, const int32_t *labels, const MGC_REAL *mask,
                            double dloss, int64_t v0, int64_t n, int64_t V_l, int64_t ld);

/* ---- mixture of experts --------------------------------------------------------------- */

/* Router: logits (n,E) -> probs (n,k), experts (n,k), counts (E) = assignments per expert.
 * Top-k by logit, descending, ties to the lower expert index (the score functions are
 * monotone, so this is the top-k of the scores); with `choice` (NULL: none) limited to groups
 * and/or chosen by the biased scores, descending by those (cpu_ops.h mgc_router_choice).
 * probs scaled by `scale` (topk scaling factor, 1 normally). z (if not NULL) gets
 * z_coeff * mean_t lse_t^2 over these n tokens. */
void MGC_FN(mgc_cpu_moe_route_fwd)(MGC_REAL *probs /* (n,k) */, int32_t *experts /* (n,k) */,
                                   int32_t *counts /* (E) */, MGC_REAL *z,
                                   const MGC_REAL *logits /* (n,E) */, int64_t n, int64_t E,
                                   int64_t k, mgc_router_score score,
                                   const mgc_router_choice *choice, double scale, double z_coeff);
/* Aux (load-balancing) loss from the (globally summed) counts:
 *   aux = coeff * E / (k T^2) * sum_i (sum_t p_{t,i}) c_i
 * with p the full-distribution scores (softmax over E; sigmoid normalised over E) of these
 * n tokens and T the total token count the counts cover. C > 1 (the sequence-wise loss,
 * moe.aux_loss_scope sequence): counts (C, E) are per sequence, token t (rows of C tokens,
 * one a sequence) is weighed by its sequence's row c_{t mod C}, and the factor is
 * coeff E C / (k T^2): the mean over the C sequences of their own losses. */
MGC_REAL MGC_FN(mgc_cpu_moe_aux_loss)(const MGC_REAL *logits /* (n,E) */,
                                      const int32_t *counts /* (C,E) */, int64_t n, int64_t E,
                                      int64_t k, int64_t T, int64_t C, mgc_router_score score,
                                      double coeff);
/* dlogits (written) = d/dlogits [ sum dprobs.probs + daux * aux + dz * z ]. */
void MGC_FN(mgc_cpu_moe_route_bwd)(MGC_REAL *dlogits /* (n,E) */,
                                   const MGC_REAL *dprobs /* (n,k) */, const MGC_REAL *logits,
                                   const int32_t *experts, const int32_t *counts /* (C,E) */,
                                   int64_t n, int64_t E, int64_t k, int64_t T, int64_t C,
                                   mgc_router_score score, double scale, double aux_coeff,
                                   double daux, double z_coeff, double dz);
/* The dispatch map: assignment a = t*k + j (token t, choice j) goes to expert experts[a].
 * Rows are ordered by expert, then token, then choice. capacity <= 0: dropless; else each
 * expert keeps at most `capacity` assignments chosen by `policy` (probs: highest prob,
 * ties to the lower assignment index; position: lowest assignment index).
 * Writes row_src (R) = assignment of each row, row_of (n*k) = row of each assignment or
 * -1 when dropped, counts (E) = rows per expert; returns R (<= n*k). */
int64_t MGC_FN(mgc_cpu_moe_dispatch_map)(int32_t *row_src /* (n*k) */, int32_t *row_of /* (n*k) */,
                                         int32_t *counts /* (E) */,
                                         const int32_t *experts /* (n,k) */,
                                         const MGC_REAL *probs /* (n,k) */, int64_t n, int64_t k,
                                         int64_t E, int64_t capacity, mgc_drop_policy policy);
/* rows[r] = x[row_src[r] / k]. */
void MGC_FN(mgc_cpu_moe_permute)(MGC_REAL *rows /* (R,h) */, const MGC_REAL *x /* (n,h) */,
                                 const int32_t *row_src, int64_t R, int64_t k, int64_t h);
/* dx[t] = sum_j drows[row_of[t*k+j]] (j ascending; dropped assignments add nothing). */
void MGC_FN(mgc_cpu_moe_permute_bwd)(MGC_REAL *dx /* (n,h) */, const MGC_REAL *drows /* (R,h) */,
                                     const int32_t *row_of, int64_t n, int64_t k, int64_t h);
/* y[t] = sum_j probs[t,j] * rows[row_of[t*k+j]] (j ascending; dropped: 0). */
void MGC_FN(mgc_cpu_moe_combine)(MGC_REAL *y /* (n,h) */, const MGC_REAL *rows /* (R,h) */,
                                 const MGC_REAL *probs /* (n,k) */, const int32_t *row_of,
                                 int64_t n, int64_t k, int64_t h);
/* drows[r] = probs[a] dy[t]; dprobs[a] = dy[t] . rows[r] (0 when dropped); rows (R) are all
 * written because every row has a source assignment. */
void MGC_FN(mgc_cpu_moe_combine_bwd)(MGC_REAL *drows /* (R,h) */, MGC_REAL *dprobs /* (n,k) */,
                                     const MGC_REAL *dy /* (n,h) */, const MGC_REAL *rows,
                                     const MGC_REAL *probs, const int32_t *row_of, int64_t n,
                                     int64_t k, int64_t h);
