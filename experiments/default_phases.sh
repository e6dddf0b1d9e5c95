#!/usr/bin/env bash
# The default job (python -m kevin_jax.main --config=configs/multiturn.py, ~11 min on one H200) as three phases
# of one device call each (at most 10 minutes): a job spanning several calls is lost whenever the machine is given
# back between them (30 s idle), and each phase here needs only what the previous one returned.
#
#   warm SEED         the warm start (SFT) and its evaluation: workdir $OUT/warm (total_steps=0); the warm
#                     start's export is $OUT/warm/sft/hf (KEEP=warm/sft/hf returns it, gzipped)       ~5 min
#   rl SEED FROM.tgz  RL from that export (init_from), no evaluations, stops by RL_BUDGET_S (default 480 s)
#                     and exports $OUT/rl/hf (KEEP=rl/hf); 30 steps                                 ~5 min
#   eval SEED FROM.tgz  the trained export's evaluation: workdir $OUT/after (total_steps=0)       ~1.5 min
#
# PHASES_CONFIG picks another config for a phase (the single-turn baseline's rl phase:
# configs/singleturn.py:same_budget; README "Results" has that call). Further arguments are config overrides for the
# job (e.g. --config.rollout.max_context_tokens=3072); give each phase the same ones. The evaluations of `warm` and
# `eval` use the same sampling seeds as the one job's step-0 and closing evaluations, so they are paired as those
# are, and the phases compute what the one job computes
# (tests/test_train_loop.py::test_total_steps_zero_evaluates_the_start_and_an_export_in_phases); both are logged as
# "eval at step 0" of their own workdirs. One difference: the one job's evaluator keeps results across its
# evaluations and steps (evaluator.result_cache), so its closing evaluation reuses the verdict and timing of a
# kernel it has already seen; each phase is its own process and evaluates afresh (same checks, a fresh timing).
# From this machine, with the device tool, carrying .whl (and .carry):
#
#   KEEP=warm/sft/hf bash experiments/gpu_session.sh 'warm=570=bash experiments/default_phases.sh warm 1'
#   mkdir -p .carry && cat <files_at>/keep.tgz.part* > .carry/warm_hf.tgz
#   KEEP=rl/hf bash experiments/gpu_session.sh 'rl=570=bash experiments/default_phases.sh rl 1 .carry/warm_hf.tgz'
#   cat <files_at>/keep.tgz.part* > .carry/rl_hf.tgz && rm .carry/warm_hf.tgz   # carry one export at a time
#   bash experiments/gpu_session.sh 'after=400=bash experiments/default_phases.sh eval 1 .carry/rl_hf.tgz'
set -eu
phase=${1:?phase: warm, rl or eval}; seed=${2:?seed}; shift 2
OUT=${OUT:-/tmp/out}
# PHASES_CONFIG: another config (the tests run configs/multiturn.py:runlocal on CPU).
job=(python3 -m kevin_jax.main "--config=${PHASES_CONFIG:-configs/multiturn.py}" "--config.seed=$seed")

# unpack FROM.tgz: the HF export in it, as a directory (printed).
unpack() {
  local tgz=$1 dest=${PHASES_TMP:-/tmp}/from_$phase
  [ -f "$tgz" ] || { echo "phase $phase: no file $tgz (the previous phase's keep.tgz.part* joined by cat)" >&2; exit 2; }
  rm -rf "$dest" && mkdir -p "$dest" && tar xzf "$tgz" -C "$dest"
  [ -f "$dest/config.json" ] || { echo "phase $phase: $tgz holds no HF export (no config.json at its top)" >&2; exit 2; }
  echo "$dest"
}

case $phase in
  warm)
    exec "${job[@]}" "--workdir=$OUT/warm" --config.total_steps=0 "$@" ;;
  rl)
    from=$(unpack "${1:?phase rl needs FROM.tgz}"); shift
    exec "${job[@]}" "--workdir=$OUT/rl" "--config.init_from=$from" "--config.evaluation.in_training_splits=()" \
      "--config.time_budget_s=${RL_BUDGET_S:-480}" "$@" ;;
  eval)
    from=$(unpack "${1:?phase eval needs FROM.tgz}"); shift
    exec "${job[@]}" "--workdir=$OUT/after" "--config.init_from=$from" --config.total_steps=0 "$@" ;;
  *)
    echo "phase must be warm, rl or eval, got $phase" >&2; exit 2 ;;
esac
