#!/bin/sh
# golden.sh - golden diagnostics for `mgc check`.
#
#   tests/golden.sh path/to/mgc            compare against the goldens
#   UPDATE=1 tests/golden.sh path/to/mgc   rewrite them (then review the diff!)
#
# tests/bad/NAME.yaml      must exit 1, print nothing on stdout, and print
#                          exactly tests/bad/NAME.expected on stderr.
# tests/good/NAME.yaml     must exit 0 and print "NAME.yaml: ok..." on stdout;
#                          stderr must equal tests/good/NAME.expected when that
#                          file exists (warnings), else be empty.
# NAME.args (optional)     extra arguments placed before the file, e.g.
#                          `--set parallel.tensor=3`.
# Paths in the output are relative: the script runs from the repository root.
# Prints `golden: N passed, M failed`; exit status 1 on any failure.
set -u

if [ $# -ne 1 ]; then
    echo "usage: tests/golden.sh path/to/mgc" >&2
    exit 2
fi
case $1 in
/*) MGC=$1 ;;
*) MGC=$(pwd)/$1 ;;
esac
cd "$(dirname "$0")/.." || exit 2
if [ ! -x "$MGC" ]; then
    echo "golden: $MGC is not an executable" >&2
    exit 2
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mgc-golden.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT INT TERM
pass=0
fail=0
update=${UPDATE:-0}

bad() { # name, reason
    fail=$((fail + 1))
    echo "FAIL $1: $2"
}

run() { # yaml -> $tmp/out, $tmp/err, $rc
    args=
    if [ -f "${1%.yaml}.args" ]; then args=$(cat "${1%.yaml}.args"); fi
    # shellcheck disable=SC2086 # the .args file is split into words on purpose
    "$MGC" check $args "$1" >"$tmp/out" 2>"$tmp/err"
    rc=$?
}

for y in tests/bad/*.yaml; do
    [ -f "$y" ] || continue
    exp=${y%.yaml}.expected
    run "$y"
    if [ "$update" = 1 ]; then cp "$tmp/err" "$exp"; fi
    if [ "$rc" -ne 1 ]; then
        bad "$y" "exit status $rc, expected 1"
        sed 's/^/    /' "$tmp/err" | head -20
    elif [ -s "$tmp/out" ]; then
        bad "$y" "printed on stdout: $(head -1 "$tmp/out")"
    elif [ ! -f "$exp" ]; then
        bad "$y" "no $exp (run with UPDATE=1, then review it)"
    elif ! cmp -s "$exp" "$tmp/err"; then
        bad "$y" "stderr differs from $exp"
        diff -u "$exp" "$tmp/err" | sed 's/^/    /' | head -40
    else
        pass=$((pass + 1))
    fi
done

for y in tests/good/*.yaml; do
    [ -f "$y" ] || continue
    exp=${y%.yaml}.expected
    run "$y"
    if [ "$update" = 1 ]; then
        if [ -s "$tmp/err" ]; then cp "$tmp/err" "$exp"; else rm -f "$exp"; fi
    fi
    if [ "$rc" -ne 0 ]; then
        bad "$y" "exit status $rc, expected 0"
        sed 's/^/    /' "$tmp/err" | head -20
    elif ! grep -q "^$y: ok" "$tmp/out"; then
        bad "$y" "no '$y: ok' line on stdout"
    elif [ -f "$exp" ] && ! cmp -s "$exp" "$tmp/err"; then
        bad "$y" "stderr differs from $exp"
        diff -u "$exp" "$tmp/err" | sed 's/^/    /' | head -40
    elif [ ! -f "$exp" ] && [ -s "$tmp/err" ]; then
        bad "$y" "unexpected diagnostics (add $exp if they are intended)"
        sed 's/^/    /' "$tmp/err" | head -20
    else
        pass=$((pass + 1))
    fi
done

echo "golden: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
