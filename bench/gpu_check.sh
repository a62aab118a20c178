#!/usr/bin/env bash
# The GPU check, one prepared script (under 8 minutes on one GPU; never in CI): the tests marked gpu,
# then training MFU (the paper's base model and GPT-2 small, bf16) and decoding speed, as JSON in
# bench/results/gpu_check.json (and the tests' summary in bench/results/gpu_tests.txt).
#
#   bash bench/gpu_check.sh            # on a machine with CUDA and the CUDA build of torch==2.13.0
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
mkdir -p bench/results
timeout 240 "$PY" -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -20 | tee bench/results/gpu_tests.txt
tests=${PIPESTATUS[0]}
timeout 240 "$PY" bench/gpu_check.py --out bench/results/gpu_check.json
bench=$?
echo "gpu tests: exit $tests; measurements: exit $bench"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
