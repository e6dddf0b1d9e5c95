#!/usr/bin/env bash
# The GPU checks of the decode step's kernels, in GPU calls of under 10 minutes each (carry .whl; part 3 with the
# variant `base` also .ab_base). A session has 30 minutes of device time, and a machine goes back 30 s after a
# call: join parts into one call (below). On 2026-12-05 `1q+5` took 4 + 5 minutes, `5+2n` 5 + 2.
#
#   bash experiments/decode_kernels_ab.sh prep  # HERE, not on the GPU host: .ab_base/ = the baseline tree (commit
#                                               # eac7616's kevin_jax and profile scripts), for part 3's `base`
#   bash experiments/decode_kernels_ab.sh 1     # the kernels alone, by block shape / warps / stages (attention: also
#                                               # splits and balanced splits; down: also fewer F splits): attention,
#                                               # q/k/v, MLP, o projection, the residual add + norm.
#                                               # `python3 experiments/decode_winners.py <files_at>` (after untarring
#                                               # all.tar.gz) prints the winners and part 3's command for them.
#   bash experiments/decode_kernels_ab.sh a     # the attention kernel alone (ATTN_SWEEP's configs, 4 layers, 256 and
#                                               # 768 generated slots visible), then its winner's --kernel-opts
#                                               # value in $OUT/winners.txt, as part 1q (~5 min)
#   bash experiments/decode_kernels_ab.sh 1q    # part 1's q/k/v and MLP front/down benches only (~4 min); like part
#                                               # 1 it ends by writing the winners' --kernel-opts value to
#                                               # $OUT/winners.txt, which variants of a part 3 or 5 joined to it
#                                               # read: 'best:--kernel-opts "$(cat $OUT/winners.txt)"'
#   bash experiments/decode_kernels_ab.sh 3 [NAME:FLAGS ...]
#                                               # profile_decode at B = 64, one process per variant, the variants
#                                               # alternated twice; NAME:FLAGS adds profile_decode flags (the
#                                               # default set: see PART3 below); NAME `base` runs .ab_base's tree.
#                                               # A kernel's options without changing its defaults, e.g. part 1's
#                                               # winners: 'st5:--kernel-opts "decode_mlp.swiglu_front:num_stages=5;
#                                               # decode_qkv.qkv_rope_cache:block_m=16"' (quote the value: it holds
#                                               # ';'); with decode_add_norm the down kernel is down_partials
#   bash experiments/decode_kernels_ab.sh 3b    # part 3 with PART3B's variants (the o projection kernel)
#   bash experiments/decode_kernels_ab.sh 5 [NAME:FLAGS ...]
#                                               # the issue's benchmark (bench_sampler, 0.5B, B = 64, no
#                                               # transformers) per variant, alternated twice, NAME:FLAGS as in part
#                                               # 3 but bench_sampler's flags (it takes --kernel-opts too; default
#                                               # set: PART5); experiments/bench_ab_table.py puts them side by side
#   bash experiments/decode_kernels_ab.sh 5a    # part 5 with PART5A's variants: the attention's splits, balance and
#                                               # stages end to end, on the twenty-eighth session's best options
#                                               # (~8.5 min at AB_S=480)
#   bash experiments/decode_kernels_ab.sh 5c    # part 5 with PART5C's variants: fixed-range splits, and the
#                                               # balanced ones (the default) by stages, split count, block size,
#                                               # warps (~5.5 min at AB_S=420)
#   bash experiments/decode_kernels_ab.sh 5d    # part 5 with PART5D's variants: 2 and 3 balanced splits by stages
#   bash experiments/decode_kernels_ab.sh 5s    # part 5 with PART5S's variants: the sampling step's chunk statistics
#                                               # from XLA, the SwiGLU front with 3 stages (~4.5 min at AB_S=270)
#   bash experiments/decode_kernels_ab.sh ks    # the chunk statistics kernel alone against XLA's passes, by block
#                                               # shape; the SwiGLU front alone with the norm inside, part 1's
#                                               # front configs (~1 min)
#   bash experiments/decode_kernels_ab.sh o     # the o projection, q/k/v and down kernels alone by loop length and
#                                               # program count, then the o kernel's row blocks end to end (PART5O;
#                                               # ~7 min at AB_S=210)
#   bash experiments/decode_kernels_ab.sh p     # one traced generate call on `inout` (1,024 + 1,024 tokens): every
#                                               # decode kernel's device time per step (profile_decode, ~1.5 min)
#   bash experiments/decode_kernels_ab.sh ncu   # Nsight Compute on `inout`'s decode kernels in bench_sampler (step
#                                               # 20 on: q/k/v, attention, o projection, SwiGLU front, down, for two
#                                               # layers): duration, throughput, occupancy, warp stalls. On an
#                                               # H100 (2026-12-06) ncu segfaulted on attaching to the JAX process
#   bash experiments/decode_kernels_ab.sh l2    # the small-weight kernels (q/k/v, o projection, down)
#                                               # alone, their defaults, with every layer's own weights and with
#                                               # the same weights (L2-resident): the most that prefetching weights
#                                               # into L2 could gain (~2.5 min)
#   bash experiments/decode_kernels_ab.sh h     # the fused LM head + draw (policy/decode_head.py): its GPU tests, then
#                                               # the kernel alone against XLA's head + sample_logits by block shape;
#                                               # with part 5: `AB_S=240 ... h+5 new: "head:--decode-head pallas"`
#   bash experiments/decode_kernels_ab.sh 2     # every policy GPU test (the kernels' own and the sampler's)
#   bash experiments/decode_kernels_ab.sh ns    # only the GPU tests of the thirty-fifth session's change: the q/k/v
#                                               # kernel's (with its prefetch), the sampler's with the kernels
#   bash experiments/decode_kernels_ab.sh 5p    # part 5 with PART5P's variants: the q/k/v kernel's prefetch of the
#                                               # attention's first cache blocks (~6 min at AB_S=360)
#   bash experiments/decode_kernels_ab.sh pp    # part p with that prefetch (4 blocks per split)
#   bash experiments/decode_kernels_ab.sh 2n    # only the GPU tests of the add + norm kernel and the unrolled merge
#   bash experiments/decode_kernels_ab.sh n     # only the GPU tests of the twenty-eighth session's options:
#                                               # decode_norm 'fold' / 'inside' (the q/k/v and SwiGLU kernels with the
#                                               # norm inside), the attention kernel's, the o projection's and
#                                               # the q/k/v kernel's own, the sampler with each kernel (~4 min)
#   bash experiments/decode_kernels_ab.sh 4a    # the issue's benchmark on its goal's case: 0.5B, B = 64
#   bash experiments/decode_kernels_ab.sh 4     # the issue's whole benchmark table (0.5B and 1.5B, B 64/256)
#
# Parts join with '+' into one call (one machine start), e.g. `AB_S=360 bash experiments/decode_kernels_ab.sh 5+2n
# VARIANTS...`; AB_S (default 540) is the seconds parts 3 and 5 share among their runs, TESTS_S part 2n's limit.
# A bench_sampler run took 18-32 s on an H100 (2026-12-06; 28 s limits cut 4 of 6 runs): give each >= 40 s.
# Results: $OUT/<stage>/ and the stage logs (gpu_session.sh); `python3 experiments/decode_ab_table.py <stage dirs>`
# puts part 3's runs side by side. Part 1's first config of each kernel is the current default.
set -u
cd "$(dirname "$0")/.."
BASE=eac7616  # the last tree measured end to end (twenty-third session: 44,978 tok/s in bench_sampler)
prof="experiments/profile_decode.py --batches 64 --impls pallas --reps 20 --no-attention"
bench="experiments/bench_sampler.py --models 0.5b --batches 64 --no-hf"  # part 5: the issue's goal case
gpu_tests="tests/test_policy_decode_qkv.py tests/test_policy_decode_oproj.py tests/test_policy_decode_mlp.py \
tests/test_policy_decode_add_norm.py tests/test_policy_decode_head.py tests/test_policy_decode_norm.py \
tests/test_policy_gpu.py tests/test_policy_sample_stats.py"
gpu_tests_new="tests/test_policy_decode_add_norm.py tests/test_policy_gpu.py::test_decode_kernel_sampler_on_gpu \
tests/test_policy_gpu.py::test_pallas_decode_attention_matches_einsum_on_gpu"  # the twenty-fifth session's options
# attention: block_k x splits x warps x stages x balance; its bench timed only XLA and the default in 150 s
# (2026-12-05): give its stage a longer limit, in a call of its own, before adding configs
attn="64x0x4x2x0,64x0x4x3x1,64x0x2x3x1,128x0x4x3x1"
qkv="64x16x4x5,64x16x4x3,64x16x4x7,32x16x4x5,16x16x2x7"  # 16-row blocks with 4 warps: slower (2026-12-05)
# front: block_n x block_d x warps x stages [x block_m]; F / 64 = 76 programs at 0.5B leave 56 of 132 SMs idle, but
# 32-column or 32-row blocks (152 programs) took 12.5-14.5 against 10.4 us per layer (2026-12-05)
front="64x128x4x4,64x128x4x3,64x128x2x3,32x128x4x3,64x64x4x6"  # 5+ stages of 64x128 exceed shared memory
# down: block_n x block_k x splits (0: pick_splits, 19 at 0.5B) x warps x stages; 4 splits with 5 stages is the
# default since 2026-12-05 (8.2 against 8.7 us per layer with 19 splits and 3 stages)
down="64x64x4x4x5,64x64x0x4x3,64x64x2x4x5,64x64x4x4x6,64x64x4x4x4,32x64x4x4x5,64x128x4x4x5"
# Part 3's default variants: the tree's defaults; the attention's splits merged by elementwise ops (which XLA may
# fuse into the o projection); balanced splits; the residual add + next norm kernel; XLA's multi-output fusions
# (SamplerConfig.decode_fusion). PART3B: the o projection + residual kernel (decode_out), alone and with the add +
# norm kernel (together they leave XLA only the post-attention norm between kernels); both attention options.
# part a: block_k x splits (0: the kernel's choice, 2 at B = 64) x warps x stages x balance; one split writes the
# output itself (no merge)
ATTN_SWEEP="64x0x4x2x0,64x0x4x3x0,64x0x4x3x1,64x8x4x2x1,64x8x4x3x1,64x16x4x2x1,64x1x4x4x0,64x2x4x3x1,128x0x4x3x1,\
128x8x4x2x1"
attn_opts="--kernel-opts decode_attention.decode_attention"
PART3=("new:" "unrolled:$attn_opts:merge=unrolled" "balance:$attn_opts:balance=1" "addnorm:--decode-add-norm pallas" \
       "fusion:--decode-fusion 1")
PART3B=("new:" "oproj:--decode-out pallas" "oproj_addnorm:--decode-out pallas --decode-add-norm pallas" \
        "bal_unrolled:$attn_opts:balance=1,merge=unrolled")
PART5=("new:" "fusion:--decode-fusion 1")  # add + norm and the unrolled merge lost on 2026-12-05
# PART5A: on `inout` (the norms inside the kernels + the o projection kernel: +1.9 % on an H200, 2026-12-05), the
# attention with one split (it writes its output itself; the o kernel reads its padded rows: no merge, no slice)
# with 2 and 4 stages and 128-slot blocks, and balanced splits (4, and 8 with 3 stages). At B = 64 the kernel reads
# ~50 MB of cache per layer at ~2.6 TB/s (its kernel in the twenty-third session's profile): 1/3 of the step.
inout="--decode-norm inside --decode-out pallas"  # the defaults' ('auto') choice at 0.5B, B = 64 since 2026-12-06
PART5A=("inout:$inout" "one:$inout $attn_opts:num_splits=1" "one4s:$inout $attn_opts:num_splits=1,num_stages=4"
        "one128k:$inout $attn_opts:block_k=128,num_splits=1,num_stages=3" "bal:$inout $attn_opts:balance=1"
        "bal8s:$inout $attn_opts:balance=1,num_splits=8,num_stages=3")
# PART5C: on an H100 (2026-12-06, thirty-first session) 4 balanced splits gained +1.3 % again (and the prefetches
# into L2 lost; removed), and became the default: against fixed slot ranges; by stages, splits, block size, warps.
PART5C=("inout:$inout" "fixed:$inout $attn_opts:balance=0" "bal3s:$inout $attn_opts:num_stages=3"
        "bal4s:$inout $attn_opts:num_stages=4" "bal2sp:$inout $attn_opts:num_splits=2,num_stages=3"
        "bal128k:$inout $attn_opts:block_k=128,num_stages=3" "bal2w:$inout $attn_opts:num_warps=2,num_stages=3")
# PART5D: on an H100 (2026-12-06, thirty-second session) 2 balanced splits with 3 stages gained +0.9 % over 4 with 2
# (3 stages alone lost 0.9 %): 2 and 3 splits by stages. Since then (+0.9 % on an H200 too) 2 splits with 3 stages
# are the default, so `inout` here is that, and `bal2sp` repeats it.
PART5D=("inout:$inout" "bal2sp:$inout $attn_opts:num_splits=2,num_stages=3" "bal2:$inout $attn_opts:num_splits=2"
        "bal3sp:$inout $attn_opts:num_splits=3,num_stages=3")
# Part o (thirty-third session): is a small-weight kernel's time its loop's length or its programs' bytes? The o
# projection alone by reduction block (7, 14, 28 iterations) and row block (56, 112, 224 programs); q/k/v by D block
# (7 or 14 iterations) and row block; down by splits x reduction block (19 iterations of 64 or of 128) and by
# column block (56, 112, 224 programs). Then PART5O end to end: the o kernel in 32- and 16-row blocks.
OPROJ_SWEEP="16x128x4x3,16x64x4x3,16x32x4x3,16x128x4x3x32,16x128x4x3x16,32x128x4x3,16x128x4x5x16,16x128x2x3x16"
QKV_SWEEP="64x16x4x5,64x16x4x5x64,64x16x4x5x32,32x16x4x5,16x16x4x5"
DOWN_SWEEP="64x64x4x4x5,64x128x2x4x5,64x64x2x4x5,32x64x4x4x5,16x64x4x4x5"
PART5O=("inout:$inout" "om32:$inout --kernel-opts decode_oproj.out_proj_residual:block_m=32"
        "om16:$inout --kernel-opts decode_oproj.out_proj_residual:block_m=16")
# PART5S (thirty-fourth session): the sampling step's chunk statistics in one Pallas pass over the logits
# (policy/sample_stats.py; XLA makes three: 38 us per step in the thirty-third session's H100 profile), and the
# SwiGLU front with 4 pipeline stages (3 then). On an H100 the statistics gained +0.2 % (a row's chunk in one tile;
# 8-row, 512-column tiles: 1.000), the front +0.6 % (with 132 column programs of 32-48 columns instead: 0.998); both
# are the defaults since, so against `inout` now the variants turn them off. Part ks: the statistics kernel alone by
# block shape, and the front alone with the norm inside (part 1's front configs).
PART5S=("inout:$inout" "xstats:$inout --kernel-opts sampler.sample_logits:stats=xla"
        "front3s:$inout --kernel-opts decode_mlp.swiglu_front:num_stages=3")
# PART5P: the q/k/v kernel's extra programs load the cache blocks that the attention kernel, next, reads first (the
# first 2 or 4 blocks of each balanced split's share: 8.4 or 16.8 MB of the ~50 MB per layer at B = 64), so that
# it finds them in L2 (1 block: 4.2 MB). Part pp: part p's profile with pf4. Part nq: the prefetch's GPU tests.
# On an H100 (thirty-fifth session) 2 blocks gained +0.4 to +0.6 % in three calls, 3 and 4 lost (4: the attention
# 21.0 -> 18.1 us per layer, q/k/v 7.3 -> 10.9): 2 is decode_qkv.PREFETCH_BLOCKS since, so `inout` has it and
# the variants are against it (pf0: none).
pf_opts="--kernel-opts decode_qkv.qkv_rope_cache:prefetch_blocks"
PART5P=("inout:$inout" "pf0:$inout $pf_opts=0" "pf1:$inout $pf_opts=1" "pf4:$inout $pf_opts=4")
# variants NAME:FLAGS for parts 3 and 5: one stage per variant and round, rounds alternated; the limit shares AB_S
# seconds (default 540) among them.
ab_stages() {  # ab_stages <command prefix> <variant>...
  local cmd=$1; shift
  local limit=$(( ${AB_S:-540} / (2 * $#) )) round v name flags
  for round in 1 2; do
    for v in "$@"; do
      name=${v%%:*}; flags=${v#*:}
      if [ "$name" = base ]; then
        [ -d .ab_base/kevin_jax ] || { echo "no .ab_base: run part prep here and carry .ab_base" >&2; exit 2; }
        stages+=("base$round=$limit=python3 .ab_base/$cmd $flags --out \$OUT/base$round")
      else
        stages+=("$name$round=$limit=python3 $cmd $flags --out \$OUT/$name$round")
      fi
    done
  done
}
usage() {
  echo "usage: $0 prep | PART[+PART...] [NAME:FLAGS ...], PART one of 1 a 1q l2 h o p pp ncu 5a 5c 5d 5s 5p ks n ns nq" \
       "2 2n 3 3b 5 4a 4 (see the header)" >&2
  exit 2
}
# Part 1's kernel benches at the 0.5B shape, B = 64 (qkv_stage LIMIT [CONFIGS]; mlp_stage LIMIT PARTS
# [DOWN_CONFIGS [MORE FLAGS]]; part o passes its sweeps), and the stage that writes their winners' --kernel-opts
# value to $OUT/winners.txt for later stages of the same call; the A/B table against `inout` (parts 5a-5d, o).
qkv_stage() {
  echo "qkv=$1=python3 experiments/bench_decode_qkv.py --shapes 0.5b --batches 64 --configs ${2:-$qkv} --out \$OUT/qkv"
}
mlp_stage() {
  echo "mlp=$1=python3 experiments/bench_decode_mlp.py --shapes 0.5b --batches 64 --parts $2 --configs $front \
--down-configs ${3:-$down} ${4:+$4 }--out \$OUT/mlp"
}
table_inout="table5=20=python3 experiments/bench_ab_table.py \$OUT --base inout"
winners="winners=15=python3 experiments/decode_winners.py \$OUT --write \$OUT/winners.txt"
[ "${1:-}" = prep ] && { rm -rf .ab_base && mkdir .ab_base && git archive "$BASE" kevin_jax \
  experiments/profile_decode.py experiments/xla_profile.py | tar -x -C .ab_base && \
  echo "built .ab_base (git-ignored) from $BASE"; exit; }
parts=${1:-}; shift || true
stages=()
for part in ${parts//+/ }; do
  case "$part" in
    1) stages+=("attn=200=python3 experiments/bench_decode_attention.py --configs $attn --out \$OUT/attn"
                "$(qkv_stage 80)" "$(mlp_stage 200 front,down,oproj)"
                "addnorm=80=python3 experiments/bench_decode_add_norm.py --out \$OUT/addnorm" "$winners") ;;
    h) stages+=("head_tests=100=JAX_PLATFORMS=cuda,cpu python3 -m pytest -q -m gpu tests/test_policy_decode_head.py"
                "head=180=python3 experiments/bench_decode_head.py --configs 32x128x4x3,32x128x8x3,32x128x4x4 \
--stats-configs 16x128x4 --out \$OUT/head") ;;
    a) stages+=("attn=300=python3 experiments/bench_decode_attention.py --layers 4 --gen-visible 256,768 --configs \
$ATTN_SWEEP --out \$OUT/attn" "$winners") ;;
    1q) stages+=("$(qkv_stage 60)" "$(mlp_stage 140 front,down)" "$winners") ;;  # for later stages of the call
    2) stages+=("gpu_tests=500=JAX_PLATFORMS=cuda,cpu python3 -m pytest -q -m gpu $gpu_tests") ;;
    n) stages+=("norm_tests=300=JAX_PLATFORMS=cuda,cpu python3 -m pytest -q -m gpu tests/test_policy_decode_norm.py \
tests/test_policy_gpu.py::test_pallas_decode_attention_matches_einsum_on_gpu tests/test_policy_decode_oproj.py \
tests/test_policy_decode_qkv.py::test_triton_kernel_on_gpu tests/test_policy_sample_stats.py \
tests/test_policy_decode_mlp.py::test_triton_kernel_on_gpu \
tests/test_policy_gpu.py::test_decode_kernel_sampler_on_gpu") ;;
    ks) stages+=("sample_stats=90=python3 experiments/bench_sample_stats.py --out \$OUT/sample_stats"
                 "$(mlp_stage 120 front "" --front-norm)") ;;
    ns) stages+=("new_tests=150=JAX_PLATFORMS=cuda,cpu python3 -m pytest -q -m gpu tests/test_policy_decode_qkv.py \
tests/test_policy_gpu.py::test_decode_kernel_sampler_on_gpu") ;;
    nq) stages+=("pf_tests=120=JAX_PLATFORMS=cuda,cpu python3 -m pytest -q -m gpu tests/test_policy_decode_qkv.py \
-k prefetch") ;;
    2n) stages+=("gpu_tests_new=${TESTS_S:-200}=JAX_PLATFORMS=cuda,cpu python3 -m pytest -q -m gpu $gpu_tests_new") ;;
    3) if [ $# -gt 0 ]; then ab_stages "$prof" "$@"; else ab_stages "$prof" "${PART3[@]}"; fi ;;
    3b) ab_stages "$prof" "${PART3B[@]}" ;;
    l2) for same in "" " --same-weights"; do
          tag=${same:+_l2}
          stages+=("qkv$tag=60=python3 experiments/bench_decode_qkv.py --shapes 0.5b --batches 64 --configs \
${qkv%%,*}$same --out \$OUT/qkv$tag" "mlp$tag=90=python3 experiments/bench_decode_mlp.py --shapes 0.5b --batches 64 \
--parts down,oproj --configs ${front%%,*} --down-configs ${down%%,*} --oproj-configs 16x128x4x3$same \
--out \$OUT/mlp$tag")
        done
        ;;
    5a|5c|5d|5s|5p) variants="PART${part^^}[@]"  # PART5A, 5C, 5D, 5S or 5P, each against its `inout`
        ab_stages "$bench" "${!variants}"
        stages+=("$table_inout") ;;
    o) stages+=("$(mlp_stage 150 oproj,down "$DOWN_SWEEP" "--oproj-configs $OPROJ_SWEEP")"
                "$(qkv_stage 80 "$QKV_SWEEP")")
       ab_stages "$bench" "${PART5O[@]}"
       stages+=("$table_inout") ;;
    p) stages+=("prof=180=python3 $prof --new-tokens 1024 $inout --out \$OUT/prof") ;;
    pp) stages+=("prof_pf=180=python3 $prof --new-tokens 1024 $inout $pf_opts=4 --out \$OUT/prof_pf") ;;
    ncu) stages+=("ncu=240=ncu --clock-control none --target-processes all --kernel-name regex:kevin_decode \
--launch-skip 2400 --launch-count 10 --section SpeedOfLight --section LaunchStats --section Occupancy \
--section WarpStateStats --section SchedulerStats python3 $bench --new-tokens 64 $inout --out \$OUT/ncu_bench") ;;
    5) if [ $# -gt 0 ]; then ab_stages "$bench" "$@"; else ab_stages "$bench" "${PART5[@]}"; fi
       stages+=("table5=20=python3 experiments/bench_ab_table.py \$OUT") ;;
    4a) stages+=("bench_sampler=300=python3 experiments/bench_sampler.py --models 0.5b --batches 64 --budget-s 270 \
--out \$OUT/bench_sampler") ;;
    4) stages+=("bench_sampler=560=python3 experiments/bench_sampler.py --budget-s 540 --out \$OUT/bench_sampler") ;;
    *) usage ;;
  esac
done
[ ${#stages[@]} -gt 0 ] || usage
exec bash experiments/gpu_session.sh "${stages[@]}"
