#!/usr/bin/env bash
# A/B a kernel change on the GPU machine: for each variant named, copy the kernel files it holds
# into kernels/ and run bench.engine_gpu with the given arguments, one process a variant, in the
# order given (alternate them: old new old new). Each run's JSON goes to $OUT/ab_<i>_<variant>.json.
# AB_BENCH names another bench module taking --json (the engine's: bench.engine_gpu_smollm).
#
#   AB_DIR=.dev3 bench/ab_kernels.sh "--modes int8 --batches 1" old new old new
#   AB_BENCH=bench.engine_gpu_smollm bench/ab_kernels.sh "--only batch1,ttft" old new old new
#   bench/ab_kernels.sh "--modes bf16,int8 --batches 1" base tree base tree
#
# $AB_DIR/<variant>/ holds that variant's copies of the changed files of kernels/ (git-ignored
# there, e.g. `git show HEAD~1:kernels/quant_matmul.py > .dev3/old/quant_matmul.py`), or, for a
# change beyond kernels/, a whole tree to run from (it has a kernels/ folder: e.g.
# `git archive HEAD~1 kernels bench selfhost | tar -x -C .dev3/base`). The variant `tree` is the
# working tree's kernels/ as it was when the script started, restored after any copied variant. The
# last copied variant's files stay in kernels/ at the end; the working tree on the device is a copy.
set -euo pipefail
args=$1
shift
dir=${AB_DIR:-.dev3}
bench=${AB_BENCH:-bench.engine_gpu --random-weights}
tree=$(mktemp -d)
cp -r kernels "$tree/"
i=0
for v in "$@"; do
  i=$((i + 1))
  run_in=.
  if [ -d "$dir/$v/kernels" ]; then
    run_in=$dir/$v
  elif [ "$v" = tree ]; then
    # a copied variant before this one left its files in kernels/
    rm -rf kernels && cp -r "$tree/kernels" kernels
  else
    cp "$dir/$v"/*.py kernels/
  fi
  echo "=== $i $v $(date +%T)"
  # shellcheck disable=SC2086 # the bench's arguments are meant to split
  (cd "$run_in" && python3 -m $bench $args --json "$OUT/ab_${i}_$v.json" 2>&1 | grep -v '^  tuned')
done
