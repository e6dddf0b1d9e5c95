#!/usr/bin/env bash
# The GPU measurements that decide the opt-in decode kernels (ModelConfig.decode_qkv, decode_out;
# SamplerConfig.decode_fusion), in three GPU calls of under 10 minutes each (carry .whl):
#
#   bash experiments/decode_kernels_ab.sh 1   # GPU tests of the kernels; the q/k/v front and the down projection alone
#   bash experiments/decode_kernels_ab.sh 2   # decode step end to end: profile_decode, separate processes, alternated
#   bash experiments/decode_kernels_ab.sh 3   # the issue's benchmark (bench_sampler, 1,024 new tokens, transformers)
#
# Part 2 compares, on the 0.5B shape at batch 64 (the goal's case): the current default; decode_qkv alone;
# decode_qkv + decode_out; and the same with decode_fusion, each in its own process (JAX reuses a trace), the
# default and the full set twice, alternated. Results: $OUT/<stage>/results.json and the stage logs (gpu_session.sh);
# `python3 experiments/decode_ab_table.py <the stage dirs>` puts them side by side.
set -u
cd "$(dirname "$0")/.."
prof="python3 experiments/profile_decode.py --batches 64 --impls pallas --reps 20 --no-attention"
new="--decode-qkv pallas --decode-out pallas"
gpu_tests="tests/test_policy_decode_qkv.py tests/test_policy_decode_oproj.py tests/test_policy_decode_mlp.py"
# The down projection's split against narrower column blocks (fewer fp32 partials for XLA to sum) and no split.
down_sweep="python3 experiments/bench_decode_mlp.py --shapes 0.5b --batches 64 --parts down --down-configs \
64x64x0x4x3,32x64x0x4x3,16x64x0x4x3,16x128x0x4x3,16x128x1x4x3,16x64x1x8x3"
bench="python3 experiments/bench_sampler.py --models 0.5b --batches 64,256 --decode-qkv auto --decode-out auto"
case "${1:-}" in
  1) exec bash experiments/gpu_session.sh \
       "gpu_tests=280=JAX_PLATFORMS=cuda,cpu python3 -m pytest -q -m gpu $gpu_tests tests/test_policy_gpu.py" \
       "qkv_alone=170=python3 experiments/bench_decode_qkv.py --shapes 0.5b --rounds 1 --out \$OUT/qkv_alone" \
       "down_alone=110=$down_sweep --out \$OUT/down_alone" ;;
  2) exec bash experiments/gpu_session.sh \
       "base1=85=$prof --out \$OUT/base1" \
       "new1=85=$prof $new --out \$OUT/new1" \
       "qkv_only=85=$prof --decode-qkv pallas --out \$OUT/qkv_only" \
       "base2=85=$prof --out \$OUT/base2" \
       "new2=85=$prof $new --out \$OUT/new2" \
       "new_fusion=85=$prof $new --decode-fusion 1 --out \$OUT/new_fusion" ;;
  3) exec bash experiments/gpu_session.sh \
       "bench_sampler=560=$bench --budget-s 540 --out \$OUT/bench_sampler" ;;
  *) echo "usage: $0 1|2|3 (see the header)" >&2; exit 2 ;;
esac
