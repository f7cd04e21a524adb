# Sourced by the one-command H200 checks (benchmarks/*_h200.sh): OUT from their first
# argument, the checkout first on PYTHONPATH (the device wheels after it), the compiled kernels (never the
# interpreter), and `run_pytest BUDGET_S ARGS...`, which gives pytest what is left of BUDGET_S seconds since the
# script started (at least 10) and leaves OUT/pytest.{log,xml} and $test_rc.
# Their summary heredocs (`$PY - "$OUT" ... <<'PY'`) take `tail`, `write` and `pytest_shards` (the sharded tests below)
# from benchmarks/h200_summary.py.
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

# `start_pytest_shards N LIMIT_S`: the test ids in OUT/test_ids.txt dealt round robin into N shards (OUT/shard_<i>.txt),
# each a background pytest limited to LIMIT_S seconds -> OUT/pytest_<i>.{xml,log} (summed by
# h200_summary.pytest_shards), so the tests run while the check precompiles; `wait_pytest_shards` then waits for them
# (before any timing starts) and sets $test_rc: 0 when every shard passed, else a failing shard's rc.
start_pytest_shards() {
    local i
    shard_pids=()
    set -f          # test ids carry [params]: no globbing
    for (( i = 0; i < $1; i++ )); do
        awk -v i=$i -v n=$1 'NR % n == i' "$OUT/test_ids.txt" > "$OUT/shard_$i.txt"
        [ -s "$OUT/shard_$i.txt" ] || continue
        timeout $2 $PY -m pytest -v -p no:cacheprovider -rs --junitxml="$OUT/pytest_$i.xml" \
            $(cat "$OUT/shard_$i.txt") > "$OUT/pytest_$i.log" 2>&1 &
        shard_pids+=($!)
    done
    set +f
}

wait_pytest_shards() {
    local p
    test_rc=0
    for p in "${shard_pids[@]}"; do wait "$p" || test_rc=$?; done
}
