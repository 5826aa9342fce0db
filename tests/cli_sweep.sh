#!/bin/sh
# cli_sweep.sh MGC - `mgc sweep` as a user runs it: a small sweep of
# models/tiny-gpt.yaml writes a CSV and a JSON with one entry per variant,
# infeasible variants carry their reasons, the ranking is sorted, -j 1 and
# -j 2 give the same bytes, a 70B model on one GPU "does not fit", and the
# sweep's numbers are the ones `mgc compile --json` predicts for the same
# config.  Bad input exits 2 (or 1) with a message and leaves no file behind.
# Prints "cli_sweep: N passed, M failed".
set -u
mgc=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "cli_sweep: FAIL: $*"; }
have_py=0
command -v python3 >/dev/null 2>&1 && have_py=1

# 3 x 3 x 2 = 18 variants on a world of 4: tensor 3 and pipeline 3 do not divide it
vary="--vary parallel.tensor=1,2,3 --vary parallel.pipeline=1,2,3 --vary training.micro_batch_size=1,2"
"$mgc" sweep models/tiny-gpt.yaml --world-size 4 $vary --top 5 -j 2 \
  --csv "$tmp/a.csv" --json "$tmp/a.json" --plot "$tmp/a.svg" >"$tmp/out" 2>"$tmp/err" \
  && ok || { bad "small sweep failed"; cat "$tmp/err"; }
grep -q "^mgc sweep: 18 variants" "$tmp/out" && ok || bad "summary does not count 18 variants"
grep -q "world size" "$tmp/out" && ok || bad "summary does not group the world-size failures"
grep -q "^ *1 " "$tmp/out" && ok || bad "no ranking table"
[ "$(wc -l <"$tmp/a.csv")" -eq 19 ] && ok || bad "CSV is not a header + 18 rows"
head -1 "$tmp/a.csv" | grep -q "^variant,parallel.tensor,parallel.pipeline,training.micro_batch_size,feasible,rank,tokens_per_s" \
  && ok || bad "CSV header: $(head -1 "$tmp/a.csv")"
# every infeasible row has a category and a reason
awk -F, 'NR > 1 && $5 == "false" && ($(NF-1) == "" || $NF == "") {bad = 1} END {exit bad}' "$tmp/a.csv" \
  && ok || bad "an infeasible CSV row lacks its reason"
grep -q "is not divisible by tensor \* context \* pipeline" "$tmp/a.csv" && ok || bad "no divisibility reason in the CSV"
head -c 4 "$tmp/a.svg" | grep -q "<svg" && ok || bad "plot is not an SVG"
grep -q "best: " "$tmp/a.svg" && ok || bad "plot does not label the best variant"

if [ $have_py = 1 ]; then
  python3 - "$tmp/a.json" "$tmp/a.csv" <<'EOF' && ok || bad "JSON content"
import csv, json, sys
d = json.load(open(sys.argv[1]))
rows = list(csv.DictReader(open(sys.argv[2])))
r = d["results"]
assert d["variants"] == 18 and len(r) == 18 == len(rows), (d["variants"], len(r), len(rows))
assert d["feasible"] + sum(d["infeasible"].values()) == 18
for x in r:
    if not x["feasible"]:
        assert x["reason"] and x["category"] in ("memory", "invalid_config", "world_size", "no_gpu_kernels",
                                                 "compile_error"), x
feas = sorted((x for x in r if x["feasible"]), key=lambda x: x["rank"])
assert feas, "nothing feasible"
assert [x["rank"] for x in feas] == list(range(1, len(feas) + 1))
tps = [x["tokens_per_s"] for x in feas]
assert tps == sorted(tps, reverse=True), tps
for x, row in zip(r, rows):
    assert int(row["variant"]) == x["variant"]
    assert (row["feasible"] == "true") == x["feasible"]
    if x["feasible"]:
        assert float(row["tokens_per_s"]) == x["tokens_per_s"]
        assert int(row["max_arena_bytes"]) == x["max_arena_bytes"]
EOF
else
  echo "cli_sweep: no python3: the JSON checks are skipped"
fi

# the same sweep on one thread: byte-identical CSV and JSON
"$mgc" sweep models/tiny-gpt.yaml --world-size 4 $vary -q -j 1 --csv "$tmp/b.csv" --json "$tmp/b.json" \
  >/dev/null 2>&1 && ok || bad "-j 1 sweep failed"
cmp -s "$tmp/a.csv" "$tmp/b.csv" && ok || bad "-j 1 and -j 2 CSVs differ"
cmp -s "$tmp/a.json" "$tmp/b.json" && ok || bad "-j 1 and -j 2 JSONs differ"
"$mgc" sweep models/tiny-gpt.yaml --world-size 4 $vary -q >"$tmp/q" 2>&1 && ok || bad "-q sweep failed"
[ "$(grep -c . "$tmp/q")" -le 2 ] && ok || bad "-q printed more than the summary"

# the sweep's numbers are mgc compile's: same config through both
"$mgc" compile models/tiny-gpt.yaml --json --set parallel.world_size=4 --set parallel.tensor=2 \
  --set parallel.pipeline=2 --set training.micro_batch_size=2 >"$tmp/c.json" 2>"$tmp/err" \
  && ok || { bad "mgc compile --json failed"; cat "$tmp/err"; }
if [ $have_py = 1 ]; then
  python3 - "$tmp/a.json" "$tmp/c.json" <<'EOF' && ok || bad "sweep and compile disagree"
import json, sys
s = json.load(open(sys.argv[1]))
c = json.load(open(sys.argv[2]))
v = [x for x in s["results"] if x["values"] == {"parallel.tensor": "2", "parallel.pipeline": "2",
                                                "training.micro_batch_size": "2"}]
assert len(v) == 1 and v[0]["feasible"], v
v = v[0]
arena = max(st["arena_bytes"] for st in c["stages"])
assert v["max_arena_bytes"] == arena, (v["max_arena_bytes"], arena)
if "predicted" in c:
    p = c["predicted"]
    assert v["tokens_per_s"] == p["tokens_per_s"], (v["tokens_per_s"], p["tokens_per_s"])
    assert v["step_s"] == p["step_s"], (v["step_s"], p["step_s"])
    assert v["mfu"] == p["mfu"], (v["mfu"], p["mfu"])
    assert v["max_arena_bytes"] == p["max_arena_bytes"]
else:
    print("cli_sweep: mgc compile --json has no 'predicted' object: compared memory only")
EOF
fi

# a 70B model on one GPU cannot fit: rejected with the arena it would need; exit 1
"$mgc" sweep models/llama2-70b.yaml --world-size 8 --set parallel.virtual_stages=1 \
  --vary parallel.tensor=1 --vary parallel.pipeline=1 \
  --csv "$tmp/big.csv" >"$tmp/out" 2>"$tmp/err"
[ $? -eq 1 ] && ok || bad "an all-infeasible sweep does not exit 1"
grep -q "does not fit: .* GiB arena on pipeline rank 0 > .* GiB usable of .* GiB (h100-sxm, 10% headroom)" \
  "$tmp/big.csv" && ok || bad "no 'does not fit' reason: $(tail -1 "$tmp/big.csv")"
grep -q "no variant is feasible" "$tmp/err" && ok || bad "no explanation when nothing is feasible"

# head dims the CUDA attention kernels do not serve (20 at 4 heads of a width of 80; 80 at one
# head is served): infeasible, in their own category, with the key and value in the reason
"$mgc" sweep models/tiny-gpt.yaml --set model.hidden_size=80 --vary model.num_attention_heads=1,4 \
  --csv "$tmp/hd.csv" >"$tmp/out" 2>"$tmp/err" && ok || bad "head-dim sweep failed: $(cat "$tmp/err")"
grep -q "1 feasible, 1 infeasible (no GPU kernels 1)" "$tmp/out" && ok || bad "head-dim sweep summary: $(tail -2 "$tmp/out")"
grep -q '^1,4,false,.*,no_gpu_kernels,model.head_dim (20): ' "$tmp/hd.csv" && ok \
  || bad "head-dim variant's CSV row: $(tail -1 "$tmp/hd.csv")"

# usage errors: exit 2 with a message
"$mgc" sweep models/tiny-gpt.yaml --vary parallel.tensor >"$tmp/out" 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "expected KEY=V1,V2" "$tmp/err" && ok || bad "bad --vary syntax"
# a list value keeps its commas: two variants, each listed as written
"$mgc" sweep models/tiny-gpt.yaml --vary 'training.recompute_modules=[],[norm, activation, dropout]' \
  >"$tmp/out" 2>"$tmp/err" && ok || bad "list-valued --vary failed: $(cat "$tmp/err")"
grep -q "2 variants" "$tmp/out" && grep -q "\[norm, activation, dropout\]" "$tmp/out" && ok \
  || bad "list-valued --vary: $(cat "$tmp/out")"
for v in '[norm' 'norm]' '[norm],[activation'; do
    "$mgc" sweep models/tiny-gpt.yaml --vary "training.recompute_modules=$v" >"$tmp/out" 2>"$tmp/err"
    [ $? -eq 2 ] && grep -q "brackets do not pair up" "$tmp/err" && ok || bad "--vary $v accepted"
done
"$mgc" sweep models/tiny-gpt.yaml --vary parallel.tensor=1,,2 >"$tmp/out" 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "empty value" "$tmp/err" && ok || bad "empty --vary value"
"$mgc" sweep models/tiny-gpt.yaml --vary parallel.tensr=1,2 >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 2 ] && grep -q "tensr" "$tmp/err" && ok || bad "unknown key: exit $rc, $(cat "$tmp/err")"
"$mgc" sweep models/tiny-gpt.yaml --vary parallel.tensor=1,two >"$tmp/out" 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "vary #1" "$tmp/err" && ok || bad "a bad value is not reported at its --vary"
"$mgc" sweep "$tmp/nonexistent.yaml" --vary parallel.tensor=1 >"$tmp/out" 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "nonexistent.yaml" "$tmp/err" && ok || bad "unreadable base file"
"$mgc" sweep models/tiny-gpt.yaml >"$tmp/out" 2>"$tmp/err"
[ $? -eq 2 ] && ok || bad "no --vary is not a usage error"
"$mgc" sweep models/tiny-gpt.yaml --vary parallel.tensor=1 -j 0 >"$tmp/out" 2>"$tmp/err"
[ $? -eq 2 ] && ok || bad "-j 0 is not a usage error"
"$mgc" sweep models/tiny-gpt.yaml --vary parallel.tensor=1 --hardware no-such-gpu >"$tmp/out" 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "no-such-gpu" "$tmp/err" && ok || bad "unknown hardware profile"

# an output in a directory that does not exist: an error, and no file at all
"$mgc" sweep models/tiny-gpt.yaml --vary parallel.tensor=1,2 --csv "$tmp/no/dir/x.csv" >"$tmp/out" 2>"$tmp/err"
[ $? -eq 1 ] && grep -q "cannot write $tmp/no/dir/x.csv" "$tmp/err" && ok || bad "unwritable CSV path"
[ ! -e "$tmp/no" ] && ok || bad "something was left behind"
ls "$tmp" | grep -q "tmp[0-9]" && bad "a temporary file was left behind" || ok

# devices are written in place, never renamed over; "-" is stdout
"$mgc" sweep models/tiny-gpt.yaml --vary parallel.tensor=1,2 --csv /dev/null -q >"$tmp/out" 2>"$tmp/err" \
  && [ -c /dev/null ] && ok || bad "--csv /dev/null: $(cat "$tmp/err")"
"$mgc" sweep models/tiny-gpt.yaml --vary parallel.tensor=1,2 --csv - -q >"$tmp/out" 2>"$tmp/err" \
  && grep -q "^variant,parallel.tensor," "$tmp/out" && ok || bad "--csv - does not write to stdout"

echo "cli_sweep: $pass passed, $fail failed"
[ $fail -eq 0 ]
