#!/usr/bin/env bash
# The GPU checks of the decode step's kernels, in GPU calls of under 10 minutes each (carry .whl; part 3 also
# .ab_base):
#
#   bash experiments/decode_kernels_ab.sh prep  # HERE, not on the GPU host: .ab_base/ = the baseline tree (commit
#                                               # eac7616's kevin_jax and profile scripts) for part 3
#   bash experiments/decode_kernels_ab.sh 1     # the kernels alone, by block shape / warps / stages (and, for
#                                               # attention, splits and balanced splits): attention, q/k/v, MLP
#   bash experiments/decode_kernels_ab.sh 2     # every policy GPU test (the kernels' own and the sampler's)
#   bash experiments/decode_kernels_ab.sh 3     # profile_decode at B = 64: the baseline tree against this tree,
#                                               # then this tree with SamplerConfig.decode_fusion; alternated, each
#                                               # in its own process (JAX reuses a trace)
#   bash experiments/decode_kernels_ab.sh 4     # the issue's benchmark table (bench_sampler: 0.5B and 1.5B, B 64/256)
#
# Results: $OUT/<stage>/ and the stage logs (gpu_session.sh); `python3 experiments/decode_ab_table.py <stage dirs>`
# puts part 3's runs side by side. Part 1's first config of each kernel is the current default.
set -u
cd "$(dirname "$0")/.."
BASE=eac7616  # the last tree measured end to end (twenty-third session: 44,978 tok/s in bench_sampler)
prof="experiments/profile_decode.py --batches 64 --impls pallas --reps 20 --no-attention"
gpu_tests="tests/test_policy_decode_qkv.py tests/test_policy_decode_oproj.py tests/test_policy_decode_mlp.py \
tests/test_policy_gpu.py"
attn="64x0x4x2x0,64x0x4x2x1,64x0x4x3x1,64x0x4x4x1,128x0x4x3x1,128x0x8x3x1,64x8x4x3x1,64x1x4x4x1,64x2x4x4x1,\
64x0x2x3x1"
qkv="64x16x4x3,16x16x4x3,64x16x4x5,64x16x4x7,16x16x4x7,32x16x4x7,16x16x2x7"
front="64x128x4x3,64x128x4x5,64x128x4x7,32x128x4x5,32x128x4x7"
down="64x64x0x4x3,64x64x0x4x5,64x128x0x4x3,64x128x0x4x4,32x64x0x4x5"
case "${1:-}" in
  prep) rm -rf .ab_base && mkdir .ab_base && git archive "$BASE" kevin_jax experiments/profile_decode.py \
          experiments/xla_profile.py | tar -x -C .ab_base && echo "built .ab_base (git-ignored) from $BASE" ;;
  1) exec bash experiments/gpu_session.sh \
       "attn=240=python3 experiments/bench_decode_attention.py --configs $attn --out \$OUT/attn" \
       "qkv=120=python3 experiments/bench_decode_qkv.py --shapes 0.5b --batches 64 --configs $qkv --out \$OUT/qkv" \
       "mlp=150=python3 experiments/bench_decode_mlp.py --shapes 0.5b --batches 64 --configs $front \
--down-configs $down --out \$OUT/mlp" ;;
  2) exec bash experiments/gpu_session.sh \
       "gpu_tests=500=JAX_PLATFORMS=cuda,cpu python3 -m pytest -q -m gpu $gpu_tests" ;;
  3) [ -d .ab_base/kevin_jax ] || { echo "no .ab_base: run part prep here and carry .ab_base" >&2; exit 2; }
     exec bash experiments/gpu_session.sh \
       "base1=70=python3 .ab_base/$prof --out \$OUT/base1" \
       "new1=70=python3 $prof --out \$OUT/new1" \
       "fusion1=70=python3 $prof --decode-fusion 1 --out \$OUT/fusion1" \
       "base2=70=python3 .ab_base/$prof --out \$OUT/base2" \
       "new2=70=python3 $prof --out \$OUT/new2" \
       "fusion2=70=python3 $prof --decode-fusion 1 --out \$OUT/fusion2" ;;
  4) exec bash experiments/gpu_session.sh \
       "bench_sampler=560=python3 experiments/bench_sampler.py --budget-s 540 --out \$OUT/bench_sampler" ;;
  *) echo "usage: $0 prep|1|2|3|4 (see the header)" >&2; exit 2 ;;
esac
