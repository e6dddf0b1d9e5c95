#!/usr/bin/env bash
# The GPU checks of the decode kernels with the current defaults (ModelConfig.decode_qkv='auto' since the
# twenty-third session), in GPU calls of under 10 minutes each (carry .whl):
#
#   bash experiments/decode_kernels_ab.sh 1   # every policy GPU test (the kernels' own and the sampler's)
#   bash experiments/decode_kernels_ab.sh 2   # the issue's benchmark table (bench_sampler: 0.5B and 1.5B, B 64/256)
#   bash experiments/decode_kernels_ab.sh 3   # profile_decode at B = 64: the default against decode_qkv='xla',
#                                             # alternated, each in its own process (JAX reuses a trace)
#
# Results: $OUT/<stage>/ and the stage logs (gpu_session.sh); `python3 experiments/decode_ab_table.py <stage dirs>`
# puts part 3's runs side by side.
set -u
cd "$(dirname "$0")/.."
prof="python3 experiments/profile_decode.py --batches 64 --impls pallas --reps 20 --no-attention"
gpu_tests="tests/test_policy_decode_qkv.py tests/test_policy_decode_oproj.py tests/test_policy_decode_mlp.py \
tests/test_policy_gpu.py"
case "${1:-}" in
  1) exec bash experiments/gpu_session.sh \
       "gpu_tests=500=JAX_PLATFORMS=cuda,cpu python3 -m pytest -q -m gpu $gpu_tests" ;;
  2) exec bash experiments/gpu_session.sh \
       "bench_sampler=560=python3 experiments/bench_sampler.py --budget-s 540 --out \$OUT/bench_sampler" ;;
  3) exec bash experiments/gpu_session.sh \
       "base1=70=$prof --decode-qkv xla --out \$OUT/base1" \
       "new1=70=$prof --out \$OUT/new1" \
       "base2=70=$prof --decode-qkv xla --out \$OUT/base2" \
       "new2=70=$prof --out \$OUT/new2" ;;
  *) echo "usage: $0 1|2|3 (see the header)" >&2; exit 2 ;;
esac
