#!/bin/sh
# cli_compile.sh MGC - `mgc compile` and `mgc inspect` as a user runs them:
# a written plan is explained by inspect (text, --memory, --json that parses),
# the timeline is an SVG, and bad inputs fail with status 1, a message, and no
# output file left behind.  Prints "cli_compile: N passed, M failed".
set -u
mgc=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "cli_compile: FAIL: $*"; }

"$mgc" compile models/tiny-moe.yaml --set parallel.pipeline=2 --set parallel.virtual_stages=2 \
  --set parallel.world_size=2 --set model.num_layers=4 --set moe.first_dense_layers=0 \
  --set training.global_batch_size=16 -o "$tmp/p.plan" --timeline "$tmp/t.svg" >"$tmp/out" 2>"$tmp/err" \
  && ok || { bad "compile failed"; cat "$tmp/err"; }
grep -q "interleaved-1f1b" "$tmp/out" && ok || bad "compile summary lacks the schedule"
grep -q "peak memory per GPU" "$tmp/out" && ok || bad "compile summary lacks peak memory"
# the plan's CUDA kernels (NVRTC, no GPU needed): compiled into the plan when NVRTC is there
if grep -q "^kernels: none (NVRTC not found" "$tmp/out"; then
    echo "cli_compile: no NVRTC: the kernel check is skipped"
else
    grep -q "^kernels in the plan: [1-9][0-9]* cubins" "$tmp/out" && ok || bad "the plan carries no kernels"
fi
head -c 5 "$tmp/t.svg" | grep -q "<svg\|<?xml" && ok || bad "timeline is not an SVG"
grep -q "chunk 1" "$tmp/t.svg" && ok || bad "interleaved timeline shows no second chunk"

"$mgc" inspect "$tmp/p.plan" >"$tmp/i" 2>&1 && ok || bad "inspect failed"
# inspect explains the same plan compile reported (same per-stage arena lines)
grep "peak memory" "$tmp/out" >"$tmp/a"; grep "peak memory" "$tmp/i" >"$tmp/b"
cmp -s "$tmp/a" "$tmp/b" && ok || bad "inspect and compile disagree on peak memory"
"$mgc" inspect --memory "$tmp/p.plan" | grep -q "placement waste" && ok || bad "inspect --memory lacks the breakdown"
"$mgc" inspect --json --memory "$tmp/p.plan" >"$tmp/j" && ok || bad "inspect --json failed"
if command -v python3 >/dev/null 2>&1; then
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["grid"]["pipeline"]==2 and len(d["stages"])==2 and d["stages"][0]["buffers"]' "$tmp/j" \
    && ok || bad "inspect --json is not the expected JSON"
fi

# bad inputs: status 1, a message naming the file, no plan written
"$mgc" compile tests/bad/heads-tensor.yaml -o "$tmp/no.plan" >/dev/null 2>"$tmp/e"; rc=$?
[ $rc = 1 ] && ok || bad "invalid config: status $rc"
[ ! -e "$tmp/no.plan" ] && ok || bad "invalid config left a plan"
head -c 200 "$tmp/p.plan" >"$tmp/trunc.plan"
"$mgc" inspect "$tmp/trunc.plan" 2>"$tmp/e" >/dev/null; rc=$?
[ $rc = 1 ] && grep -q "truncated" "$tmp/e" && ok || bad "truncated plan: status $rc, $(cat "$tmp/e")"
"$mgc" inspect models/tiny-gpt.yaml 2>"$tmp/e" >/dev/null; rc=$?
[ $rc = 1 ] && grep -q "not an mgc plan" "$tmp/e" && ok || bad "YAML given to inspect: status $rc"
"$mgc" compile models/tiny-gpt.yaml -o "$tmp/missing/dir/x.plan" >/dev/null 2>"$tmp/e"; rc=$?
[ $rc = 1 ] && [ -z "$(ls "$tmp" | grep -v '^[a-z]*$\|\.plan$\|\.svg$')" ] && ok || bad "unwritable output: status $rc"
# MGC_FUSION chooses the fusions by name: one left out, or a name it does not know (an error
# naming it, no plan)
MGC_FUSION=-norm_bwd_bias "$mgc" compile examples/tiny-gpt.yaml --no-kernels -o "$tmp/f.plan" >/dev/null 2>&1 &&
  "$mgc" inspect --ops "$tmp/f.plan" >"$tmp/fo" 2>&1 && ! grep -q "norm_bwd.* +bias " "$tmp/fo" && grep -q "add_norm" "$tmp/fo" &&
  grep -q "attention_bwd qkv +bias " "$tmp/fo" &&
  ok || bad "MGC_FUSION=-norm_bwd_bias: still a bias gradient in a norm backward, or no other fusion"
MGC_FUSION=-attention_bwd_bias "$mgc" compile examples/tiny-gpt.yaml --no-kernels -o "$tmp/f2.plan" >/dev/null 2>&1 &&
  "$mgc" inspect --ops "$tmp/f2.plan" >"$tmp/fo" 2>&1 && ! grep -q "attention_bwd.* +bias " "$tmp/fo" &&
  grep -q "norm_bwd +bias " "$tmp/fo" &&
  ok || bad "MGC_FUSION=-attention_bwd_bias: still a bias gradient in an attention backward, or none in a norm backward"
"$mgc" compile examples/tiny-gpt.yaml --no-kernels -o "$tmp/g.plan" >/dev/null 2>&1 &&
  "$mgc" inspect --ops "$tmp/g.plan" 2>&1 | grep -q "norm_bwd +bias " && ok || bad "no bias gradient in a norm backward by default"
"$mgc" inspect --ops "$tmp/g.plan" 2>&1 | grep -q "attention_bwd qkv +bias " && ok || bad "no bias gradient in an attention backward by default"
"$mgc" inspect --ops "$tmp/g.plan" 2>&1 | grep -q "linear_dgrad_gelu +bias decoder.layers.0.mlp.linear_fc2 " &&
  ok || bad "no bias gradient in a linear_dgrad_gelu by default"
MGC_FUSION=-dgrad_gelu_bias "$mgc" compile examples/tiny-gpt.yaml --no-kernels -o "$tmp/f3.plan" >/dev/null 2>&1 &&
  "$mgc" inspect --ops "$tmp/f3.plan" >"$tmp/fo" 2>&1 && ! grep -q "linear_dgrad_gelu +bias" "$tmp/fo" &&
  grep -q "linear_wgrad decoder.layers.0.mlp.linear_fc1 .*linear_fc1.bias.grad" "$tmp/fo" &&
  grep -q "linear_dgrad_gelu decoder.layers.0.mlp.linear_fc2 " "$tmp/fo" &&
  ok || bad "MGC_FUSION=-dgrad_gelu_bias: still a bias gradient in a linear_dgrad_gelu, or none in fc1's wgrad"
# the embedding and the first norm: one op by default, two without that fusion
"$mgc" inspect --ops "$tmp/g.plan" 2>&1 | grep -q " #0 embedding_norm " && ok || bad "no embedding_norm by default"
MGC_FUSION=-embedding_norm "$mgc" compile examples/tiny-gpt.yaml --no-kernels -o "$tmp/h.plan" >/dev/null 2>&1 &&
  "$mgc" inspect --ops "$tmp/h.plan" >"$tmp/ho" 2>&1 && ! grep -q "embedding_norm" "$tmp/ho" &&
  grep -q " #1 norm saves decoder.layers.0.input_layernorm " "$tmp/ho" && grep -q " +bias " "$tmp/ho" &&
  ok || bad "MGC_FUSION=-embedding_norm: still an embedding_norm, no first norm, or no other fusion"
# with hidden dropout the norm backwards take the dropout's backward (and then the bias), not
# without that fusion (its dropout_add_bwd left, the bias gradients with the linears)
"$mgc" compile examples/tiny-gpt.yaml --set model.hidden_dropout=0.1 --no-kernels -o "$tmp/d.plan" >/dev/null 2>&1 &&
  "$mgc" inspect --ops "$tmp/d.plan" >"$tmp/do" 2>&1 && grep -q "norm_bwd +bias +dropout " "$tmp/do" &&
  ! grep -q "dropout_add_bwd" "$tmp/do" && ok || bad "hidden dropout: no norm_bwd +bias +dropout, or a dropout_add_bwd left"
MGC_FUSION=-norm_bwd_drop "$mgc" compile examples/tiny-gpt.yaml --set model.hidden_dropout=0.1 --no-kernels \
  -o "$tmp/dn.plan" >/dev/null 2>&1 && "$mgc" inspect --ops "$tmp/dn.plan" >"$tmp/dno" 2>&1 &&
  ! grep -q "+dropout" "$tmp/dno" && grep -q "dropout_add_bwd" "$tmp/dno" && grep -q "add_norm" "$tmp/dno" &&
  ok || bad "MGC_FUSION=-norm_bwd_drop: still a dropout backward in a norm backward, or no other fusion"
MGC_FUSION=add_norm,bogus "$mgc" compile examples/tiny-gpt.yaml -o "$tmp/nf.plan" >/dev/null 2>"$tmp/e"; rc=$?
[ $rc = 1 ] && grep -q "MGC_FUSION names no fusion 'bogus'" "$tmp/e" && [ ! -e "$tmp/nf.plan" ] &&
  ok || bad "MGC_FUSION=add_norm,bogus: status $rc, $(cat "$tmp/e")"
for knob in MGC_ATT_FWD_KEYS=48:16,\ 32\ or\ 64 MGC_ATT_DKV_ROWS=48:16,\ 32\ or\ 64 MGC_ATT_DKV_BUFS=3:1\ or\ 2; do
  kv=${knob%%:*} takes=${knob#*:}
  env "$kv" "$mgc" compile examples/tiny-gpt.yaml -o "$tmp/fk.plan" >/dev/null 2>"$tmp/e"; rc=$?
  [ $rc = 1 ] && grep -q "${kv%%=*}='${kv#*=}' is no attention tile size" "$tmp/e" &&
    grep -q "hint: it takes $takes" "$tmp/e" && [ ! -e "$tmp/fk.plan" ] &&
    ok || bad "$kv: status $rc, $(cat "$tmp/e")"
done
cp "$tmp/p.plan" "$tmp/keep.plan"
"$mgc" compile tests/bad/heads-tensor.yaml -o "$tmp/keep.plan" >/dev/null 2>&1
cmp -s "$tmp/p.plan" "$tmp/keep.plan" && ok || bad "a failed compile changed an existing plan"

echo "cli_compile: $pass passed, $fail failed"
[ $fail = 0 ]
