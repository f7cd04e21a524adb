# Sourced by the one-command H200 checks (benchmarks/*_h200.sh): OUT from their first
# argument, the checkout first on PYTHONPATH (the device wheels after it), the compiled kernels (never the
# interpreter), and `run_pytest BUDGET_S ARGS...`, which gives pytest what is left of BUDGET_S seconds since the
# script started (at least 10) and leaves OUT/pytest.{log,xml} and $test_rc.
# Their summary heredocs (`$PY - "$OUT" ... <<'PY'`) take `tail` and `write` from benchmarks/h200_summary.py.
set -u
OUT=${1:?usage: $0 OUT_DIR}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
PY=${PYTHON:-python3}
start=$(date +%s)

run_pytest() {
    local left=$(( $1 - ($(date +%s) - start) ))
    shift
    timeout $(( left > 10 ? left : 10 )) $PY -m pytest -v -p no:cacheprovider -rs --junitxml="$OUT/pytest.xml" \
        "$@" > "$OUT/pytest.log" 2>&1
    test_rc=$?
}
