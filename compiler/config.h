/* config.h - the checked model/run configuration and the schema that defines it.
 *
 * Every YAML key mgc understands is one row of MGC_CONFIG_KEYS below: its
 * dotted path, type, C field, default, range and documentation.  That one
 * table drives parsing, type and range checks, "did you mean" for unknown
 * keys, `--set` overrides, `mgc schema` (the JSON Schema in docs/) and the
 * key reference in docs/model-yaml.md.  Adding a key is adding a row.
 *
 * Use:
 *     mgc_config *c = mgc_config_new();
 *     mgc_config_load_file(c, "model.yaml", &diags);      // parse + schema checks
 *     mgc_config_set(c, "parallel.tensor=2", "--set #1", &diags); // overrides
 *     mgc_config_finalize(c, &diags);                      // defaults + consistency rules
 *     if (diags.errors == 0) ... c->model.hidden_size ...
 *     mgc_config_free(c);
 */
#ifndef MGC_CONFIG_H
#define MGC_CONFIG_H

#include <stdint.h>

#include "diag.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- enumerations ------------------------------------------------------ */

typedef enum { MGC_NORM_LAYERNORM, MGC_NORM_RMSNORM } mgc_norm;
typedef enum { MGC_ACT_GELU, MGC_ACT_SWIGLU } mgc_act;
typedef enum { MGC_POS_LEARNED, MGC_POS_ROTARY, MGC_POS_NONE } mgc_pos;
typedef enum { MGC_SCORE_SOFTMAX, MGC_SCORE_SIGMOID, MGC_SCORE_PRESOFTMAX } mgc_score;
typedef enum { MGC_DROP_PROBS, MGC_DROP_POSITION } mgc_drop_policy;
typedef enum { MGC_AUX_MICROBATCH, MGC_AUX_SEQUENCE } mgc_aux_scope;
typedef enum { MGC_ROUTER_DT_COMPUTE, MGC_ROUTER_DT_FP32 } mgc_router_dtype;
typedef enum { MGC_LOGITS_DT_FP32, MGC_LOGITS_DT_COMPUTE } mgc_logits_dtype;
typedef enum { MGC_SCHED_GPIPE, MGC_SCHED_1F1B, MGC_SCHED_INTERLEAVED } mgc_sched;
typedef enum { MGC_PREC_FP32, MGC_PREC_BF16, MGC_PREC_FP16 } mgc_precision;
typedef enum { MGC_RECOMPUTE_NONE, MGC_RECOMPUTE_SELECTIVE, MGC_RECOMPUTE_FULL } mgc_recompute;
typedef enum { MGC_RECOMPUTE_UNIFORM, MGC_RECOMPUTE_BLOCK } mgc_recompute_method;
typedef enum { MGC_OPT_ADAMW } mgc_optimizer;
typedef enum { MGC_DECAY_COSINE, MGC_DECAY_LINEAR, MGC_DECAY_CONSTANT, MGC_DECAY_WSD } mgc_decay;
typedef enum { MGC_WSD_EXPONENTIAL, MGC_WSD_LINEAR, MGC_WSD_COSINE, MGC_WSD_MINUS_SQRT } mgc_wsd;
typedef enum { MGC_DATA_SYNTHETIC, MGC_DATA_MEGATRON } mgc_data_format;

extern const char *const mgc_enum_norm[];
extern const char *const mgc_enum_act[];
extern const char *const mgc_enum_pos[];
extern const char *const mgc_enum_score[];
extern const char *const mgc_enum_drop_policy[];
extern const char *const mgc_enum_aux_scope[];
extern const char *const mgc_enum_router_dtype[];
extern const char *const mgc_enum_logits_dtype[];
extern const char *const mgc_enum_sched[];
extern const char *const mgc_enum_precision[];
extern const char *const mgc_enum_recompute[];
extern const char *const mgc_enum_recompute_method[];
/* training.recompute_modules: the names, and their bits in mgc_config_recompute_modules */
extern const char *const mgc_recompute_module_names[]; /* "norm", "activation", "dropout", "mlp", "moe" */
#define MGC_RECOMPUTE_MOD_NORM 1u
#define MGC_RECOMPUTE_MOD_ACTIVATION 2u
#define MGC_RECOMPUTE_MOD_DROPOUT 4u
#define MGC_RECOMPUTE_MOD_MLP 8u /* a dense layer's MLP half, from its input */
#define MGC_RECOMPUTE_MOD_MOE 16u /* an MoE layer's MoE half, from its input */
extern const char *const mgc_enum_optimizer[];
extern const char *const mgc_enum_decay[];
extern const char *const mgc_enum_wsd[];
extern const char *const mgc_enum_data_format[];

/* ---- value types -------------------------------------------------------- */

typedef enum mgc_type {
    MGC_T_INT,         /* int64_t */
    MGC_T_FLOAT,       /* double */
    MGC_T_BOOL,        /* int, 0 or 1 */
    MGC_T_ENUM,        /* int, index into the key's name table */
    MGC_T_STRING,      /* char *, owned by the config */
    MGC_T_INT_LIST,    /* mgc_int_list */
    MGC_T_STRING_LIST, /* mgc_str_list */
    MGC_T_BLEND,       /* mgc_blend: list of {path, weight} or of paths */
} mgc_type;

typedef struct mgc_int_list {
    int64_t *v;   /* (n) values */
    mgc_loc *loc; /* (n) where each item was written */
    int n;
} mgc_int_list;

typedef struct mgc_str_list {
    char **v;     /* (n) strings owned by the config */
    mgc_loc *loc; /* (n) where each item was written */
    int n;
} mgc_str_list;

typedef struct mgc_blend {
    char **path;    /* (n) dataset prefixes (without .bin/.idx) */
    double *weight; /* (n) relative weights, > 0; 1.0 when not given */
    mgc_loc *loc;   /* (n) */
    int n;
} mgc_blend;

/* Key flags. */
#define MGC_KF_REQUIRED 1u /* no default: the user must give it */
#define MGC_KF_DERIVED  2u /* default computed from other keys (see deftext) */
#define MGC_KF_OPTIONAL 4u /* absent means "off"; see deftext */

#define MGC_I64_MAX_EXACT 9007199254740992.0 /* 2^53: limits are kept as doubles */

/* The schema.  X(ID, "path", TYPE, field, default, min, max, enum_table,
 * flags, "default text or NULL", "documentation")
 * min/max are inclusive bounds for INT/FLOAT/INT_LIST items; for FLOAT a
 * negative `min` flag is not used: exclusive lower bounds are written as the
 * smallest positive double we accept.  Paths are "section.key". */
#define MGC_CONFIG_KEYS(X)                                                                                   \
    /* model: architecture */                                                                                \
    X(MODEL_NAME, "model.name", STRING, model.name, 0, 0, 0, NULL, 0, "\"\"",                               \
      "Free-form model name shown in reports.")                                                              \
    X(MODEL_VOCAB_SIZE, "model.vocab_size", INT, model.vocab_size, 0, 1, 2147483647.0, NULL,                 \
      MGC_KF_REQUIRED, NULL, "Tokenizer vocabulary size before padding.")                                   \
    X(MODEL_VOCAB_DIVISOR, "model.make_vocab_size_divisible_by", INT, model.vocab_divisor, 128, 1, 1048576,  \
      NULL, 0, NULL,                                                                                         \
      "The vocabulary is padded to a multiple of this times parallel.tensor (Megatron's rule).")            \
    X(MODEL_SEQ_LENGTH, "model.seq_length", INT, model.seq_length, 0, 1, 16777216, NULL, MGC_KF_REQUIRED,     \
      NULL, "Training sequence length in tokens.")                                                           \
    X(MODEL_MAX_POS, "model.max_position_embeddings", INT, model.max_position_embeddings, 0, 1, 16777216,    \
      NULL, MGC_KF_DERIVED, "model.seq_length",                                                              \
      "Rows of the learned position table; must be at least seq_length.")                                   \
    X(MODEL_HIDDEN, "model.hidden_size", INT, model.hidden_size, 0, 1, 1048576, NULL, MGC_KF_REQUIRED, NULL, \
      "Width of the residual stream (h).")                                                                   \
    X(MODEL_LAYERS, "model.num_layers", INT, model.num_layers, 0, 1, 65536, NULL, MGC_KF_REQUIRED, NULL,     \
      "Number of transformer layers (L).")                                                                   \
    X(MODEL_HEADS, "model.num_attention_heads", INT, model.num_heads, 0, 1, 65536, NULL, MGC_KF_REQUIRED,    \
      NULL, "Number of query heads (a).")                                                                    \
    X(MODEL_QUERY_GROUPS, "model.num_query_groups", INT, model.num_query_groups, 0, 1, 65536, NULL,          \
      MGC_KF_DERIVED, "model.num_attention_heads",                                                           \
      "Key/value heads (g): equal to heads for MHA, fewer for GQA, 1 for MQA.")                              \
    X(MODEL_HEAD_DIM, "model.head_dim", INT, model.head_dim, 0, 1, 65536, NULL, MGC_KF_DERIVED,              \
      "hidden_size / num_attention_heads",                                                                   \
      "Channels per attention head (d, Megatron's kv_channels); mgc's CUDA kernels take a multiple of 8 "    \
      "from 8 to 256.")                                                                                      \
    X(MODEL_FFN, "model.ffn_hidden_size", INT, model.ffn_hidden_size, 0, 1, 16777216, NULL, MGC_KF_DERIVED,  \
      "4 * hidden_size (gelu); floor(8 * hidden_size / 3 / 64) * 64 (swiglu)",                                \
      "Inner width of the dense MLP (f).")                                                                   \
    X(MODEL_NORM, "model.normalization", ENUM, model.normalization, MGC_NORM_LAYERNORM, 0, 0, mgc_enum_norm,  \
      0, NULL, "Normalization layer.")                                                                       \
    X(MODEL_NORM_EPS, "model.norm_eps", FLOAT, model.norm_eps, 1e-5, 1e-30, 1.0, NULL, 0, NULL,              \
      "Epsilon added to the variance in LayerNorm/RMSNorm.")                                                 \
    X(MODEL_ACT, "model.activation", ENUM, model.activation, MGC_ACT_GELU, 0, 0, mgc_enum_act, 0, NULL,      \
      "MLP activation: gelu (tanh approximation, 2 matrices) or swiglu (gated, 3 matrices).")               \
    X(MODEL_POS, "model.position_embedding", ENUM, model.position_embedding, MGC_POS_LEARNED, 0, 0,          \
      mgc_enum_pos, 0, NULL, "Position encoding: a learned table, rotary (RoPE), or none.")                   \
    X(MODEL_ROPE_BASE, "model.rotary_base", FLOAT, model.rotary_base, 10000, 1.0, 1e12, NULL, 0, NULL,       \
      "RoPE theta.")                                                                                         \
    X(MODEL_ROPE_PERCENT, "model.rotary_percent", FLOAT, model.rotary_percent, 1.0, 1e-6, 1.0, NULL, 0,      \
      NULL, "Fraction of each head's channels that are rotated.")                                            \
    X(MODEL_BIAS, "model.add_bias_linear", BOOL, model.add_bias_linear, 1, 0, 0, NULL, 0, NULL,              \
      "Biases on every linear layer (GPT-2 style); false for LLaMA style.")                                  \
    X(MODEL_QKV_BIAS, "model.add_qkv_bias", BOOL, model.add_qkv_bias, 0, 0, 0, NULL, MGC_KF_DERIVED,         \
      "model.add_bias_linear", "Bias on the QKV projection alone (Qwen style).")                              \
    X(MODEL_WINDOW, "model.window_size", INT, model.window_size, 0, 0, 16777216, NULL, 0, NULL,               \
      "Sliding-window attention: each query sees the window_size latest positions, itself included "     \
      "(Mistral's sliding_window; Megatron's --window-size L,0 is L + 1); 0: every earlier position.")     \
    X(MODEL_WINDOW_LAYERS, "model.window_layers", INT_LIST, model.window_layers, 0, 0, 65535, NULL,           \
      MGC_KF_OPTIONAL, "every layer",                                                                        \
      "0-based list of the layers with the sliding window (interleaved local and global attention); the "  \
      "others see every earlier position.")                                                                  \
    X(MODEL_QK_NORM, "model.qk_layernorm", BOOL, model.qk_layernorm, 0, 0, 0, NULL, 0, NULL,                \
      "Normalize each head's queries and keys before rotary (the model's normalization over head_dim, one "  \
      "weight shared by the heads; Qwen3, Megatron's --qk-layernorm).")                                      \
    X(MODEL_TIE, "model.tie_embeddings", BOOL, model.tie_embeddings, 1, 0, 0, NULL, 0, NULL,                 \
      "Share the input embedding with the output layer.")                                                    \
    X(MODEL_HIDDEN_DROPOUT, "model.hidden_dropout", FLOAT, model.hidden_dropout, 0.1, 0, 0.999, NULL, 0,     \
      NULL, "Dropout after the attention and MLP blocks and on the embedding.")                             \
    X(MODEL_ATTN_DROPOUT, "model.attention_dropout", FLOAT, model.attention_dropout, 0.1, 0, 0.999, NULL, 0, \
      NULL, "Dropout on attention probabilities.")                                                          \
    X(MODEL_INIT_STD, "model.init_method_std", FLOAT, model.init_std, 0.02, 1e-12, 10, NULL, 0, NULL,        \
      "Standard deviation of the normal weight initialisation.")                                             \
    /* moe: mixture of experts */                                                                            \
    X(MOE_EXPERTS, "moe.num_experts", INT, moe.num_experts, 0, 0, 65536, NULL, 0, NULL,                      \
      "Routed experts per MoE layer; 0 makes a dense model; mgc's CUDA kernels take up to 1024.")            \
    X(MOE_TOPK, "moe.top_k", INT, moe.top_k, 2, 1, 65536, NULL, 0, NULL,                                    \
      "Experts each token is routed to; mgc's CUDA kernels take up to 64.")                                 \
    X(MOE_FFN, "moe.ffn_hidden_size", INT, moe.ffn_hidden_size, 0, 1, 16777216, NULL, MGC_KF_DERIVED,        \
      "model.ffn_hidden_size", "Inner width of each routed expert.")                                         \
    X(MOE_SHARED, "moe.shared_experts", INT, moe.shared_experts, 0, 0, 1024, NULL, 0, NULL,                  \
      "Shared experts every token passes through.")                                                         \
    X(MOE_SHARED_FFN, "moe.shared_expert_ffn_hidden_size", INT, moe.shared_ffn_hidden_size, 0, 1, 16777216,  \
      NULL, MGC_KF_DERIVED, "moe.ffn_hidden_size", "Inner width of each shared expert.")                     \
    X(MOE_LAYER_FREQ, "moe.layer_freq", INT, moe.layer_freq, 1, 1, 65536, NULL, 0, NULL,                     \
      "Every n-th layer (counting from the first after first_dense_layers) is MoE.")                         \
    X(MOE_FIRST_DENSE, "moe.first_dense_layers", INT, moe.first_dense_layers, 0, 0, 65536, NULL, 0, NULL,    \
      "The first k layers stay dense.")                                                                     \
    X(MOE_LAYERS, "moe.layers", INT_LIST, moe.layers, 0, 0, 65535, NULL, MGC_KF_OPTIONAL,                    \
      "from layer_freq and first_dense_layers",                                                              \
      "Explicit 0-based list of MoE layers; replaces layer_freq and first_dense_layers.")                   \
    X(MOE_SCORE, "moe.router_score", ENUM, moe.router_score, MGC_SCORE_SOFTMAX, 0, 0, mgc_enum_score, 0,     \
      NULL,                                                                                                  \
      "Router score function: softmax over the top-k logits (the chosen weights sum to 1; Mixtral), "       \
      "sigmoid (normalised over the top k), or presoftmax: softmax over every expert, the top-k "            \
      "probabilities as they are (Megatron's --moe-router-pre-softmax; norm_topk_prob false).")              \
    X(MOE_AUX, "moe.aux_loss_coeff", FLOAT, moe.aux_loss_coeff, 0, 0, 1000, NULL, 0, NULL,                   \
      "Load-balancing loss coefficient (Switch-style).")                                                    \
    X(MOE_AUX_SCOPE, "moe.aux_loss_scope", ENUM, moe.aux_loss_scope, MGC_AUX_MICROBATCH, 0, 0,              \
      mgc_enum_aux_scope, 0, NULL,                                                                           \
      "What the load-balancing loss balances: each microbatch's tokens (Megatron's aux_loss), or each "      \
      "sequence's (Megatron's seq_aux_loss; DeepSeek-V3's sequence-wise balance loss).")                    \
    X(MOE_ROUTER_DTYPE, "moe.router_dtype", ENUM, moe.router_dtype, MGC_ROUTER_DT_COMPUTE, 0, 0,             \
      mgc_enum_router_dtype, 0, NULL,                                                                        \
      "The router's logits: in the compute dtype (training.precision), or fp32 from the same 16-bit "       \
      "weights and inputs, so that scores, top-k choices and router losses see no 16-bit rounding "         \
      "(Megatron's --moe-router-dtype fp32; their gradient stays in the compute dtype).")                  \
    X(MOE_ZLOSS, "moe.z_loss_coeff", FLOAT, moe.z_loss_coeff, 0, 0, 1000, NULL, 0, NULL,                     \
      "Router z-loss coefficient (ST-MoE).")                                                                 \
    X(MOE_TOPK_SCALE, "moe.router_topk_scaling_factor", FLOAT, moe.router_topk_scaling_factor, 1.0, 1e-6,    \
      1000, NULL, 0, NULL,                                                                                   \
      "Multiplies the chosen experts' weights after the score function (Megatron's "                          \
      "--moe-router-topk-scaling-factor; DeepSeek's routed_scaling_factor).")                                 \
    X(MOE_GROUPS, "moe.router_num_groups", INT, moe.router_num_groups, 0, 0, 1024, NULL, 0, NULL,           \
      "Group-limited routing (DeepSeek-V3's device-limited top-k; Megatron's --moe-router-num-groups): "    \
      "the experts in this many equal groups, of which each token may use router_group_topk; 0 off.")      \
    X(MOE_GROUP_TOPK, "moe.router_group_topk", INT, moe.router_group_topk, 0, 0, 1024, NULL, 0, NULL,       \
      "Groups a token may use under group-limited routing: those with the largest sums of their top "       \
      "top_k / router_group_topk scores (Megatron's --moe-router-group-topk).")                              \
    X(MOE_BIAS_RATE, "moe.expert_bias_update_rate", FLOAT, moe.expert_bias_update_rate, 0, 0, 1, NULL, 0,   \
      NULL,                                                                                                  \
      "Aux-loss-free load balancing (DeepSeek-V3; Megatron's --moe-router-enable-expert-bias with "          \
      "--moe-router-bias-update-rate, 1e-3 there): each expert's bias, added to the sigmoid scores for "     \
      "choosing only, moves by this rate towards balance after every step; 0 off.")                          \
    X(MOE_CAPACITY, "moe.capacity_factor", FLOAT, moe.capacity_factor, 0, 1e-6, 1000, NULL, MGC_KF_OPTIONAL, \
      "unset: dropless", "Expert capacity = ceil(tokens * top_k / experts * factor); tokens beyond it are dropped.") \
    X(MOE_DROP_POLICY, "moe.drop_policy", ENUM, moe.drop_policy, MGC_DROP_PROBS, 0, 0, mgc_enum_drop_policy,  \
      0, NULL, "Which tokens an over-full expert drops: lowest router probability, or latest position.")     \
    /* parallel: degrees and schedule */                                                                     \
    X(PAR_WORLD, "parallel.world_size", INT, parallel.world_size, 0, 1, 16777216, NULL, MGC_KF_DERIVED,      \
      "tensor * context * pipeline * data", "Total ranks (GPUs); data parallel is derived from it when data is not given.") \
    X(PAR_TP, "parallel.tensor", INT, parallel.tensor, 1, 1, 1048576, NULL, 0, NULL,                          \
      "Tensor-parallel degree.")                                                                             \
    X(PAR_SP, "parallel.sequence_parallel", BOOL, parallel.sequence_parallel, 0, 0, 0, NULL, 0, NULL,        \
      "Shard norms, dropout and residuals along the sequence inside the tensor group.")                      \
    X(PAR_PP, "parallel.pipeline", INT, parallel.pipeline, 1, 1, 1048576, NULL, 0, NULL,                      \
      "Pipeline-parallel degree (stages).")                                                                 \
    X(PAR_VP, "parallel.virtual_stages", INT, parallel.virtual_stages, 1, 1, 65536, NULL, MGC_KF_DERIVED,    \
      "1, or len(pipeline_layout) / pipeline", "Model chunks per pipeline rank (interleaved schedule).")      \
    X(PAR_LAYOUT, "parallel.pipeline_layout", STRING_LIST, parallel.pipeline_layout, 0, 0, 0, NULL,          \
      MGC_KF_OPTIONAL, "even split",                                                                         \
      "Explicit layout: one string per virtual stage, of `E` (embedding), `t` (a layer, `t*4` for four) and `L` (loss).") \
    X(PAR_DP, "parallel.data", INT, parallel.data, 1, 1, 16777216, NULL, MGC_KF_DERIVED,                     \
      "world_size / (tensor * context * pipeline), else 1", "Data-parallel degree.")                          \
    X(PAR_CP, "parallel.context", INT, parallel.context, 1, 1, 1048576, NULL, 0, NULL,                        \
      "Context-parallel degree (sequence split for attention).")                                            \
    X(PAR_EP, "parallel.expert", INT, parallel.expert, 1, 1, 1048576, NULL, 0, NULL,                          \
      "Expert-parallel degree.")                                                                             \
    X(PAR_ETP, "parallel.expert_tensor", INT, parallel.expert_tensor, 1, 1, 1048576, NULL, MGC_KF_DERIVED,   \
      "parallel.tensor", "Tensor-parallel degree inside each expert.")                                       \
    X(PAR_SCHEDULE, "parallel.schedule", ENUM, parallel.schedule, MGC_SCHED_1F1B, 0, 0, mgc_enum_sched,      \
      MGC_KF_DERIVED, "interleaved-1f1b when virtual_stages > 1, else 1f1b", "Pipeline schedule.")            \
    X(PAR_MB_GROUP, "parallel.microbatch_group_size", INT, parallel.microbatch_group_size, 1, 1, 1048576,    \
      NULL, MGC_KF_DERIVED, "parallel.pipeline",                                                             \
      "Interleaved schedule: microbatches issued per model chunk before moving to the next.")                \
    X(PAR_DISTOPT, "parallel.distributed_optimizer", BOOL, parallel.distributed_optimizer, 0, 0, 0, NULL, 0, \
      NULL, "Shard fp32 master weights and Adam moments over data x context ranks (ZeRO-1).")                \
    X(PAR_BUCKET, "parallel.grad_bucket_size", INT, parallel.grad_bucket_size, 0, 0, 1099511627776.0, NULL,   \
      0, NULL,                                                                                               \
      "Parameters per data-parallel gradient bucket (each is reduced as soon as the backward has finished it); 0: Megatron's max(40M, 1M * data * context).") \
    /* training */                                                                                           \
    X(TRAIN_MBS, "training.micro_batch_size", INT, training.micro_batch_size, 1, 1, 1073741824, NULL, 0,    \
      NULL, "Sequences per microbatch per data-parallel rank.")                                              \
    X(TRAIN_GBS, "training.global_batch_size", INT, training.global_batch_size, 1, 1, 1099511627776.0, NULL, \
      MGC_KF_DERIVED, "micro_batch_size * data * gradient_accumulation_steps", "Sequences per optimizer step.") \
    X(TRAIN_ACCUM, "training.gradient_accumulation_steps", INT, training.grad_accum, 1, 1, 1073741824, NULL, \
      MGC_KF_DERIVED, "global_batch_size / (micro_batch_size * data), else 1",                               \
      "Microbatches per step per data-parallel rank (the pipeline's microbatch count).")                    \
    X(TRAIN_PRECISION, "training.precision", ENUM, training.precision, MGC_PREC_BF16, 0, 0,                  \
      mgc_enum_precision, 0, NULL, "Weights and activations dtype; master weights and moments are fp32.")   \
    X(TRAIN_RECOMPUTE, "training.recompute", ENUM, training.recompute, MGC_RECOMPUTE_NONE, 0, 0,             \
      mgc_enum_recompute, 0, NULL,                                                                           \
      "Activation recompute: selective (attention core) or full (each layer from its input).")              \
    X(TRAIN_RECOMPUTE_METHOD, "training.recompute_method", ENUM, training.recompute_method,                 \
      MGC_RECOMPUTE_UNIFORM, 0, 0, mgc_enum_recompute_method, 0, NULL,                                      \
      "Full recompute: uniform (every layer, recompute_num_layers consecutive layers of a pipeline chunk re-run together from the first one's input) or block (only the first recompute_num_layers layers of each pipeline chunk, each from its input; the others keep their activations).") \
    X(TRAIN_RECOMPUTE_NUM_LAYERS, "training.recompute_num_layers", INT, training.recompute_num_layers, 1, 1, \
      65536, NULL, 0, NULL,                                                                                  \
      "Full recompute: layers per recomputed group (uniform) or recomputed layers per pipeline chunk (block).") \
    X(TRAIN_RECOMPUTE_MODULES, "training.recompute_modules", STRING_LIST, training.recompute_modules, 0, 0, 0, \
      NULL, MGC_KF_OPTIONAL, "none",                                                                         \
      "Also recomputed in the backward, whatever training.recompute says: `norm` (each layer's norm outputs, from the stashed norm input), `activation` (each layer's GELU or SwiGLU output, from the stashed GEMM output) and `dropout` (the hidden dropout masks, drawn again from the random stream), element-wise work for less stash; `mlp` and `moe` (each dense, resp. MoE, layer's second half -- pre-MLP norm, MLP or MoE block with its router and token exchange, residual add -- re-run from its input, which alone is stashed).") \
    X(TRAIN_LOSS_CHUNKS, "training.loss_chunks", INT, training.loss_chunks, 0, 0, 1048576, NULL, 0, NULL,   \
      "Row chunks of the output layer and cross-entropy, each run with its backward at the start of the backward pass, so one chunk's logits exist at a time; each chunk must hold a multiple of 64 rows (sequence positions x micro batch); 0: the fewest chunks of at most 1 GiB of logits, 1: none.") \
    X(TRAIN_LOGITS_DTYPE, "training.logits_dtype", ENUM, training.logits_dtype, MGC_LOGITS_DT_FP32, 0, 0,   \
      mgc_enum_logits_dtype, 0, NULL,                                                                       \
      "The output layer's logits, which the cross-entropy reads: fp32 from the 16-bit GEMM (no rounding of them; twice the bytes), or in the compute dtype (training.precision), as Megatron and PyTorch's autocast keep them (fp16 logits must stay below 65504); the cross-entropy computes in fp32 either way.") \
    X(TRAIN_ITERS, "training.iterations", INT, training.iterations, 1000, 1, 1125899906842624.0, NULL, 0,    \
      NULL, "Optimizer steps to train.")                                                                     \
    X(TRAIN_SEED, "training.seed", INT, training.seed, 1234, 0, MGC_I64_MAX_EXACT, NULL, 0, NULL,            \
      "Seed for initialisation, dropout and data order.")                                                    \
    X(TRAIN_LOSS_SCALE, "training.initial_loss_scale", FLOAT, training.initial_loss_scale, 4294967296.0, 1,  \
      1e38, NULL, 0, NULL, "fp16: initial dynamic loss scale.")                                              \
    X(TRAIN_LS_WINDOW, "training.loss_scale_window", INT, training.loss_scale_window, 1000, 1, 1e9, NULL, 0, \
      NULL, "fp16: clean steps before the loss scale doubles.")                                             \
    X(TRAIN_HYSTERESIS, "training.hysteresis", INT, training.hysteresis, 2, 1, 1e9, NULL, 0, NULL,           \
      "fp16: overflows tolerated before the loss scale halves.")                                            \
    X(TRAIN_LOG_INTERVAL, "training.log_interval", INT, training.log_interval, 10, 1, 1e9, NULL, 0, NULL,    \
      "Steps between log lines.")                                                                           \
    X(TRAIN_EVAL_INTERVAL, "training.eval_interval", INT, training.eval_interval, 0, 0, 1125899906842624.0, \
      NULL, 0, NULL,                                                                                        \
      "Steps between evaluations of the validation loss (the validation split of data.split), also after the last step; 0: none.") \
    X(TRAIN_EVAL_ITERS, "training.eval_iters", INT, training.eval_iters, 10, 1, 1048576, NULL, 0, NULL,      \
      "Global batches of validation samples an evaluation reads: the same samples every time.")             \
    /* optimizer and learning-rate schedule */                                                               \
    X(OPT_TYPE, "optimizer.type", ENUM, optimizer.type, MGC_OPT_ADAMW, 0, 0, mgc_enum_optimizer, 0, NULL,    \
      "Optimizer.")                                                                                          \
    X(OPT_LR, "optimizer.lr", FLOAT, optimizer.lr, 3e-4, 0, 10, NULL, 0, NULL, "Peak learning rate.")        \
    X(OPT_MIN_LR, "optimizer.min_lr", FLOAT, optimizer.min_lr, 0, 0, 10, NULL, 0, NULL,                      \
      "Learning rate at the end of decay.")                                                                 \
    X(OPT_BETA1, "optimizer.beta1", FLOAT, optimizer.beta1, 0.9, 0, 0.999999999, NULL, 0, NULL, "Adam beta1.") \
    X(OPT_BETA2, "optimizer.beta2", FLOAT, optimizer.beta2, 0.95, 0, 0.999999999, NULL, 0, NULL,             \
      "Adam beta2.")                                                                                         \
    X(OPT_EPS, "optimizer.eps", FLOAT, optimizer.eps, 1e-8, 1e-30, 1, NULL, 0, NULL, "Adam epsilon.")       \
    X(OPT_WD, "optimizer.weight_decay", FLOAT, optimizer.weight_decay, 0.1, 0, 10, NULL, 0, NULL,            \
      "Decoupled weight decay (not applied to norms and biases).")                                         \
    X(OPT_CLIP, "optimizer.clip_grad", FLOAT, optimizer.clip_grad, 1.0, 0, 1e12, NULL, 0, NULL,              \
      "Global gradient-norm clipping threshold; 0 turns clipping off.")                                     \
    X(OPT_WARMUP, "optimizer.warmup_iterations", INT, optimizer.warmup_iterations, 0, 0,                     \
      1125899906842624.0, NULL, 0, NULL, "Linear warmup steps from 0 to lr.")                                \
    X(OPT_DECAY, "optimizer.decay_style", ENUM, optimizer.decay_style, MGC_DECAY_COSINE, 0, 0,               \
      mgc_enum_decay, 0, NULL, "Decay from lr to min_lr after warmup.")                                      \
    X(OPT_DECAY_ITERS, "optimizer.decay_iterations", INT, optimizer.decay_iterations, 0, 1,                  \
      1125899906842624.0, NULL, MGC_KF_DERIVED, "training.iterations",                                       \
      "Step at which decay reaches min_lr (counted from step 0, warmup included).")                          \
    X(OPT_WSD_ITERS, "optimizer.wsd_decay_iterations", INT, optimizer.wsd_decay_iterations, 0, 1,           \
      1125899906842624.0, NULL, MGC_KF_DERIVED, "10% of decay_iterations - warmup_iterations",              \
      "wsd: the final steps that decay to min_lr (the rest after warmup stays at lr).")                     \
    X(OPT_WSD_STYLE, "optimizer.wsd_decay_style", ENUM, optimizer.wsd_decay_style, MGC_WSD_EXPONENTIAL, 0, 0, \
      mgc_enum_wsd, 0, NULL, "wsd: the shape of that final decay.")                                         \
    /* data */                                                                                               \
    X(DATA_FORMAT, "data.format", ENUM, data.format, MGC_DATA_SYNTHETIC, 0, 0, mgc_enum_data_format, 0, NULL, \
      "synthetic: the corpus mgc generates itself; megatron: indexed .bin/.idx datasets.")                  \
    X(DATA_PATHS, "data.paths", BLEND, data.paths, 0, 0, 0, NULL, MGC_KF_OPTIONAL, "none",                   \
      "Datasets to blend: a list of prefixes, or of {path, weight} mappings.")                              \
    X(DATA_SPLIT, "data.split", STRING, data.split, 0, 0, 0, NULL, 0, "\"969,30,1\"",                        \
      "Train/validation/test split of documents, as relative weights.")                                      \
    X(DATA_EOD_MASK, "data.eod_mask_loss", BOOL, data.eod_mask_loss, 0, 0, 0, NULL, 0, NULL,                 \
      "Leave out of the loss the tokens predicted from an end-of-document token.")                          \
    X(DATA_EOD, "data.eod_token", INT, data.eod_token, 256, 0, 2147483647.0, NULL, 0, NULL,                  \
      "The end-of-document token id (256: the byte tokenizer's).")                                          \
    X(DATA_RESET_ATTN, "data.reset_attention_mask", BOOL, data.reset_attention_mask, 0, 0, 0, NULL, 0, NULL, \
      "Attention stays within a document: a token sees no token before its document's start.")             \
    X(DATA_RESET_POS, "data.reset_position_ids", BOOL, data.reset_position_ids, 0, 0, 0, NULL, 0, NULL,     \
      "Positions (learned or rotary) restart at 0 at each document's start.")                               \
    /* checkpoint */                                                                                         \
    X(CKPT_DIR, "checkpoint.directory", STRING, checkpoint.directory, 0, 0, 0, NULL, 0, "\"\"",               \
      "Where checkpoints are written and resumed from; empty turns checkpointing off.")                     \
    X(CKPT_INTERVAL, "checkpoint.interval", INT, checkpoint.interval, 0, 0, 1125899906842624.0, NULL, 0,     \
      NULL, "Steps between checkpoints; 0 saves only at the end.")                                          \
    X(CKPT_KEEP, "checkpoint.keep", INT, checkpoint.keep, 3, 0, 1048576, NULL, 0, NULL,                      \
      "Most recent checkpoints kept; 0 keeps all.")                                                         \
    X(CKPT_ASYNC, "checkpoint.async_save", BOOL, checkpoint.async_save, 0, 0, 0, NULL, 0, NULL,             \
      "Save in the background: each rank copies the values it owns to host memory at the save, and a thread of its own writes them while training goes on (rank 0's then checksums and renames the file); mgc-run --async-save turns it on too.") \
    /* hardware target, for the cost model */                                                                \
    X(HW_GPU, "hardware.gpu", STRING, hardware.gpu, 0, 0, 0, NULL, 0, "\"h100-sxm\"",                        \
      "GPU model of the target (a hardware profile name).")                                                 \
    X(HW_GPN, "hardware.gpus_per_node", INT, hardware.gpus_per_node, 8, 1, 1024, NULL, 0, NULL,              \
      "GPUs per node.")                                                                                      \
    X(HW_NODES, "hardware.nodes", INT, hardware.nodes, 1, 1, 1048576, NULL, MGC_KF_DERIVED,                  \
      "ceil(world_size / gpus_per_node)", "Nodes in the job.")                                              \
    X(HW_ARCHS, "hardware.cuda_archs", INT_LIST, hardware.cuda_archs, 0, 50, 200, NULL, 0, "[80, 90]",       \
      "CUDA compute capabilities kernels are compiled for (80 = sm_80).")

typedef enum mgc_key {
#define MGC_X_ENUM(id, path, type, field, def, lo, hi, en, flags, deftext, doc) MGC_KEY_##id,
    MGC_CONFIG_KEYS(MGC_X_ENUM)
#undef MGC_X_ENUM
    MGC_KEY__COUNT
} mgc_key;

/* One schema row. */
typedef struct mgc_keyinfo {
    const char *path;          /* "section.key" */
    mgc_type type;             /* value type */
    size_t offset;             /* of the field inside mgc_config */
    double def;                /* default for INT/FLOAT/BOOL/ENUM */
    double lo, hi;             /* inclusive range (INT, FLOAT, INT_LIST items) */
    const char *const *enums;  /* NULL-terminated names (ENUM) */
    unsigned flags;            /* MGC_KF_* */
    const char *deftext;       /* documentation of a derived/non-numeric default */
    const char *doc;           /* one-sentence description */
} mgc_keyinfo;

extern const mgc_keyinfo mgc_keys[MGC_KEY__COUNT];
/* Sections in schema order, NULL-terminated: "model", "moe", ... */
extern const char *const mgc_sections[];

/* ---- the configuration ------------------------------------------------- */

typedef struct mgc_model_cfg {
    char *name;
    int64_t vocab_size;              /* V before padding */
    int64_t vocab_divisor;           /* make_vocab_size_divisible_by */
    int64_t seq_length;              /* s */
    int64_t max_position_embeddings; /* learned table rows */
    int64_t hidden_size;             /* h */
    int64_t num_layers;              /* L */
    int64_t num_heads;               /* a */
    int64_t num_query_groups;        /* g */
    int64_t head_dim;                /* d */
    int64_t ffn_hidden_size;         /* f */
    int normalization;               /* mgc_norm */
    double norm_eps;
    int activation;                  /* mgc_act */
    int position_embedding;          /* mgc_pos */
    double rotary_base;
    double rotary_percent;
    int add_bias_linear;
    int add_qkv_bias;
    int qk_layernorm;                /* norm q and k per head */
    int64_t window_size;             /* sliding window in keys; 0 none */
    mgc_int_list window_layers;      /* the layers with the window (given: a list; else all) */
    int tie_embeddings;
    double hidden_dropout;
    double attention_dropout;
    double init_std;
} mgc_model_cfg;

typedef struct mgc_moe_cfg {
    int64_t num_experts;             /* E; 0 = dense */
    int64_t top_k;                   /* k */
    int64_t ffn_hidden_size;         /* f_e */
    int64_t shared_experts;          /* count */
    int64_t shared_ffn_hidden_size;  /* f_s per shared expert */
    int64_t layer_freq;
    int64_t first_dense_layers;
    mgc_int_list layers;             /* explicit MoE layer list */
    int router_score;                /* mgc_score */
    double aux_loss_coeff;
    int aux_loss_scope;              /* mgc_aux_scope */
    int router_dtype;                /* mgc_router_dtype: the router logits' dtype */
    double z_loss_coeff;
    double router_topk_scaling_factor; /* the chosen experts' weights times it (1: as scored) */
    int64_t router_num_groups;       /* group-limited routing: expert groups (0 off) */
    int64_t router_group_topk;       /* groups a token may use */
    double expert_bias_update_rate;  /* aux-loss-free expert bias: its step (0 off) */
    double capacity_factor;          /* 0 = dropless */
    int drop_policy;                 /* mgc_drop_policy */
} mgc_moe_cfg;

typedef struct mgc_parallel_cfg {
    int64_t world_size;
    int64_t tensor;                  /* tp */
    int sequence_parallel;
    int64_t pipeline;                /* pp */
    int64_t virtual_stages;          /* vp */
    mgc_str_list pipeline_layout;
    int64_t data;                    /* dp */
    int64_t context;                 /* cp */
    int64_t expert;                  /* ep */
    int64_t expert_tensor;           /* etp */
    int schedule;                    /* mgc_sched */
    int64_t microbatch_group_size;
    int distributed_optimizer;
    int64_t grad_bucket_size;        /* parameters per gradient bucket; 0: Megatron's rule */
} mgc_parallel_cfg;

typedef struct mgc_training_cfg {
    int64_t micro_batch_size;        /* b */
    int64_t global_batch_size;       /* B */
    int64_t grad_accum;              /* m, microbatches per step per DP rank */
    int precision;                   /* mgc_precision */
    int recompute;                   /* mgc_recompute */
    int recompute_method;            /* mgc_recompute_method (full recompute) */
    int64_t recompute_num_layers;    /* full: layers per group (uniform), per chunk (block) */
    mgc_str_list recompute_modules;  /* "norm", "activation", "dropout", "mlp", "moe" (MGC_RECOMPUTE_MOD_*) */
    int64_t loss_chunks;             /* row chunks of the head (compiler/losschunk.c); 0 auto */
    int logits_dtype;                /* mgc_logits_dtype: the output layer's logits */
    int64_t iterations;
    int64_t seed;
    double initial_loss_scale;
    int64_t loss_scale_window;
    int64_t hysteresis;
    int64_t log_interval;
    int64_t eval_interval;
    int64_t eval_iters;
} mgc_training_cfg;

typedef struct mgc_optimizer_cfg {
    int type;                        /* mgc_optimizer */
    double lr, min_lr, beta1, beta2, eps, weight_decay, clip_grad;
    int64_t warmup_iterations;
    int decay_style;                 /* mgc_decay */
    int64_t decay_iterations;
    int64_t wsd_decay_iterations;    /* wsd: the annealing steps at the end of decay_iterations */
    int wsd_decay_style;             /* mgc_wsd */
} mgc_optimizer_cfg;

typedef struct mgc_data_cfg {
    int format;                      /* mgc_data_format */
    mgc_blend paths;
    char *split;
    int eod_mask_loss;
    int64_t eod_token;
    int reset_attention_mask;        /* attention within documents (Megatron's --reset-attention-mask) */
    int reset_position_ids;          /* rotary positions from each document's start */
} mgc_data_cfg;

typedef struct mgc_checkpoint_cfg {
    char *directory;
    int64_t interval;
    int64_t keep;
    int async_save; /* write in the background (runtime/checkpoint.h mgc_ckpt_save_async) */
} mgc_checkpoint_cfg;

typedef struct mgc_hardware_cfg {
    char *gpu;
    int64_t gpus_per_node;
    int64_t nodes;
    mgc_int_list cuda_archs;
} mgc_hardware_cfg;

/* One pipeline (virtual) stage of the layout, derived by finalize. */
typedef struct mgc_stage {
    int32_t first_layer;   /* first decoder layer in this stage */
    int32_t num_layers;    /* decoder layers in it (may be 0) */
    uint8_t embedding;     /* holds the input embedding */
    uint8_t loss;          /* holds final norm, output layer and loss */
} mgc_stage;

/* Values derived by mgc_config_finalize; valid only when it reported no error. */
typedef struct mgc_derived {
    int64_t padded_vocab_size;   /* V rounded up to divisor * tensor */
    int64_t num_microbatches;    /* = training.grad_accum */
    int64_t expert_data;         /* EDP = world / (etp * ep * pp) */
    int64_t num_moe_layers;      /* layers with routed experts */
    uint8_t *is_moe_layer;       /* (num_layers) 1 for MoE layers */
    int64_t num_stages;          /* pipeline * virtual_stages */
    mgc_stage *stages;           /* (num_stages) in model order: chunk c of rank r is c*pp + r */
    int sequence_parallel;       /* effective (off when tensor == 1) */
} mgc_derived;

typedef struct mgc_config {
    mgc_model_cfg model;
    mgc_moe_cfg moe;
    mgc_parallel_cfg parallel;
    mgc_training_cfg training;
    mgc_optimizer_cfg optimizer;
    mgc_data_cfg data;
    mgc_checkpoint_cfg checkpoint;
    mgc_hardware_cfg hardware;
    mgc_derived derived;

    uint8_t given[MGC_KEY__COUNT]; /* 1 when the user set the key (file or --set) */
    mgc_loc loc[MGC_KEY__COUNT];   /* where it was set; file-level when not given */
    mgc_loc file_loc;              /* the main file, line 0 */
    const char *file;              /* main file name (owned) */
    struct mgc_config_priv *priv;  /* owned strings and parse state */
} mgc_config;

mgc_config *mgc_config_new(void);
void mgc_config_free(mgc_config *c);
/* The MGC_RECOMPUTE_MOD_* bits of training.recompute_modules (a name mgc check refuses counts
 * for none). */
uint32_t mgc_config_recompute_modules(const mgc_config *c);
/* Full recompute of decoder layer `layer` (training.recompute, recompute_method,
 * recompute_num_layers over the pipeline chunks of c->derived): the first layer of the group
 * it is re-run with (its forward re-runs in the backward from that layer's input), or -1 when
 * its activations are kept (no full recompute, a block method's later layers).  Without
 * derived stages the model is one chunk. */
int32_t mgc_config_recompute_group(const mgc_config *c, int64_t layer);

/* Parse YAML text and apply its keys over the defaults.  `name` is used in
 * diagnostics.  May be called once per config.  0 when no error was added. */
int mgc_config_load_text(mgc_config *c, const char *name, const char *text, size_t len, mgc_diags *d);
/* Read a file and mgc_config_load_text it; unreadable files are diagnosed. */
int mgc_config_load_file(mgc_config *c, const char *path, mgc_diags *d);

/* Apply one `dotted.path=value` override (value is YAML: `2`, `true`,
 * `[1, 3]`, `rmsnorm`).  `origin` names it in diagnostics, e.g. "--set #2". */
int mgc_config_set(mgc_config *c, const char *assignment, const char *origin, mgc_diags *d);

/* Fill derived defaults and run every consistency rule (check.c).  Call
 * once after loading and overrides.  0 when no error was added. */
int mgc_config_finalize(mgc_config *c, mgc_diags *d);

/* Schema lookups. */
int mgc_key_find(const char *path); /* index or -1 */
/* Best "did you mean" candidate for an unknown key in `section` (NULL for
 * top level); writes a full dotted path to out.  0 when nothing is close. */
int mgc_key_suggest(const char *section, const char *name, char *out, size_t outsz);
/* Edit distance (optimal string alignment), capped at `cap`. */
int mgc_edit_distance(const char *a, const char *b, int cap);

/* Where to point a diagnostic about key k: its own location when given,
 * else the file. */
mgc_loc mgc_config_loc(const mgc_config *c, mgc_key k);

/* Typed field access by key (for generic code: overrides, printing). */
void *mgc_config_field(mgc_config *c, mgc_key k);

#ifdef __cplusplus
}
#endif
#endif /* MGC_CONFIG_H */
