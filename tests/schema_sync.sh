#!/bin/sh
# schema_sync.sh MGC - docs/mgc-config.schema.json and the generated key
# reference inside docs/model-yaml.md must equal what `mgc schema` prints.
# UPDATE=1 rewrites them.
set -u
mgc=$1
tmp=${TMPDIR:-/tmp}/mgc-schema.$$
trap 'rm -f "$tmp".*' EXIT
"$mgc" schema --json >"$tmp.json" || exit 1
"$mgc" schema --markdown >"$tmp.md" || exit 1
doc=docs/model-yaml.md
begin='<!-- BEGIN KEY REFERENCE -->'
end='<!-- END KEY REFERENCE -->'
# the doc with the generated part replaced by the binary's output
awk -v b="$begin" -v e="$end" -v gen="$tmp.md" '
  $0 == b { print; while ((getline l < gen) > 0) print l; skip = 1; next }
  $0 == e { skip = 0 }
  !skip { print }' "$doc" >"$tmp.doc"
fail=0
if [ "${UPDATE:-0}" = 1 ]; then
  cp "$tmp.json" docs/mgc-config.schema.json
  cp "$tmp.doc" "$doc"
  echo "schema_sync: updated"
  exit 0
fi
grep -qF "$begin" "$doc" || { echo "schema_sync: $doc lacks the marker '$begin'"; fail=1; }
cmp -s "$tmp.json" docs/mgc-config.schema.json || { echo "schema_sync: docs/mgc-config.schema.json is stale (UPDATE=1 sh tests/schema_sync.sh MGC)"; fail=1; }
cmp -s "$tmp.doc" "$doc" || { echo "schema_sync: key reference in $doc is stale (UPDATE=1 sh tests/schema_sync.sh MGC)"; diff "$doc" "$tmp.doc" | head -20; fail=1; }
[ $fail = 0 ] && echo "schema_sync: 2 files in sync, 0 failed"
exit $fail
