#!/usr/bin/env bash
# `make mutate`: mutation testing (mutmut 3.8.1; config in pyproject's [tool.mutmut]) of the functions that
# carry the method, then reports/mutation.md from the results (scripts/mutation_report.py, which exits 1
# when a surviving mutant is neither killed nor explained in scripts/mutation_equivalent.toml).
# Not part of CI (~40 min on 2 busy cores); a developer habit after touching these functions.
#   bash scripts/mutate.sh             a full run from scratch (removes mutants/, mutmut's gitignored copy)
#   bash scripts/mutate.sh --resume    only the mutants of the scope not checked yet (an interrupted run)
#   bash scripts/mutate.sh --survivors only the surviving (or untested) ones again, after adding tests
set -euo pipefail
cd "$(dirname "$0")/.."
PYBIN=${PYBIN:-.venv/bin}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset PYTHONPATH  # the tests must import mutmut's mutated copy (mutants/src), not src/
S='ǁ'
SCOPE=(
  "tandem_rlvr.training.core.x_masked_mean__mutmut_*"             # the loss: advantages, log-probs, KL, aggregation
  "tandem_rlvr.training.core.x_group_advantages__mutmut_*"
  "tandem_rlvr.engines.types.x_token_logps__mutmut_*"
  "tandem_rlvr.engines.types.x_logp_of__mutmut_*"
  "tandem_rlvr.training.core.x_k3_kl__mutmut_*"
  "tandem_rlvr.training.core.x_aggregate__mutmut_*"
  "tandem_rlvr.training.core.x_policy_loss__mutmut_*"
  "tandem_rlvr.training.core.x_chunk_weight__mutmut_*"
  "tandem_rlvr.training.core.x_process_scale__mutmut_*"
  "tandem_rlvr.training.arms.x_arm_plan__mutmut_*"                # the arms' masks
  "tandem_rlvr.training.arms.x_loss_mask__mutmut_*"
  "tandem_rlvr.training.arms.x_check_senior_frac__mutmut_*"
  "tandem_rlvr.training.ownership.x_*"                            # the fail-closed ownership check
  "tandem_rlvr.training.trainer.x${S}Trainer${S}update__mutmut_*" # the trainer's update path
  "tandem_rlvr.training.trainer.x${S}Trainer${S}_minibatch__mutmut_*"
  "tandem_rlvr.training.trainer.x${S}Trainer${S}_drift_metrics__mutmut_*"
  "tandem_rlvr.training.trainer.x${S}Trainer${S}_clip_and_step__mutmut_*"
  "tandem_rlvr.engines.handoff.x${S}Schedule${S}*"               # handoff schedules
  "tandem_rlvr.engines.handoff.x${S}SequenceSchedule${S}*"
  "tandem_rlvr.engines.handoff.x${S}CoinStream${S}*"
  "tandem_rlvr.engines.schedules.x${S}ScheduleDef${S}*"          # the schedule registry and its rules
  "tandem_rlvr.engines.schedules.x${S}Param${S}*"
  "tandem_rlvr.engines.schedules.x_step_end__mutmut_*"
  "tandem_rlvr.engines.schedules.x_none__mutmut_*"
  "tandem_rlvr.engines.schedules.x_bernoulli__mutmut_*"
  "tandem_rlvr.engines.schedules.x_word__mutmut_*"
  "tandem_rlvr.engines.schedules.x_step__mutmut_*"
  "tandem_rlvr.engines.schedules.x_alternate__mutmut_*"
  "tandem_rlvr.engines.schedules.x_chunk__mutmut_*"
  "tandem_rlvr.engines.schedules.x_sentence__mutmut_*"
  "tandem_rlvr.engines.schedules.x_config_params__mutmut_*"
  "tandem_rlvr.engines.handoff.x_over_rounds__mutmut_*"
  "tandem_rlvr.engines.handoff.x_make_schedule__mutmut_*"
  "tandem_rlvr.engines.handoff.x_simulate__mutmut_*"
  "tandem_rlvr.evaluation.metrics.x_pass_at_k__mutmut_*"            # pass@k
  "tandem_rlvr.evaluation.metrics.x__correct_counts__mutmut_*"
  "tandem_rlvr.evaluation.metrics.x_mean_pass_at_k__mutmut_*"
  "tandem_rlvr.evaluation.metrics.x_pass_at_ks__mutmut_*"
  "tandem_rlvr.evaluation.evaluate.x_pass_metrics__mutmut_*"       # pass@k and tax of an evaluation
  "tandem_rlvr.evaluation.evaluate.x_tax_metrics__mutmut_*"
  "tandem_rlvr.rewards.scorer.x${S}RewardScorer${S}_run_jobs__mutmut_*"  # the reward's time limit
  "tandem_rlvr.rewards.scorer.x${S}RewardScorer${S}_collect__mutmut_*"
  "tandem_rlvr.rewards.scorer.x${S}RewardScorer${S}_expire__mutmut_*"
  "tandem_rlvr.rewards.scorer.x__check_limit__mutmut_*"
)
mode=${1:-full}
case "$mode" in
  full) rm -rf mutants; names=("${SCOPE[@]}") ;;
  --resume|--survivors)
    mapfile -t names < <("$PYBIN/python" scripts/mutation_report.py --list "${mode#--}" "${SCOPE[@]}")
    if [ "${#names[@]}" -eq 0 ]; then echo "mutate: no ${mode#--} mutants to run"; fi ;;
  *) echo "usage: bash scripts/mutate.sh [--resume|--survivors]" >&2; exit 2 ;;
esac
t0=$(date +%s)
if [ "${#names[@]}" -gt 0 ]; then
  "$PYBIN/mutmut" run --max-children "${MUTATE_JOBS:-2}" "${names[@]}"
fi
took=()
[ "$mode" != full ] || took=(--seconds $(( $(date +%s) - t0 )))
[ -n "${MUTATE_NO_REPORT:-}" ] || "$PYBIN/python" scripts/mutation_report.py "${took[@]}" "${SCOPE[@]}"
