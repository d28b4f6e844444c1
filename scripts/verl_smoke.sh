#!/usr/bin/env bash
# verl smoke run on one GPU: Qwen2.5-0.5B, 10 GRPO steps with LLDS (action gate), SearchQA episodes played
# by searchgym's agent loop behind vLLM, on the generated world with BM25 built in each agent-loop worker.
#   pip install -e '.[verl]' vllm     # a CUDA machine; vLLM brings its own CUDA torch
#   scripts/verl_smoke.sh             # extra Hydra overrides may follow, e.g. trainer.n_gpus_per_node=2
# Settings: OUT (default runs/verl_smoke), MODEL (default Qwen/Qwen2.5-0.5B), GPUS (default 1).
# It checks that the run ends (exit 0) and that runs/verl_smoke/metrics.jsonl holds actor/llds_loss and
# lld/delta_adv_pos for each of the 10 steps. trainer.use_v1=False: verl 0.9.1's default v1 trainer needs
# `transfer_queue` (verl's verl-core extra), which searchgym[verl] does not install.
set -euo pipefail
OUT=${OUT:-runs/verl_smoke}
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B}
GPUS=${GPUS:-1}
mkdir -p "$OUT"

searchgym prepare verl --out "$OUT/data" --split train --split test --limit 256 \
    --max-turns 3 --max-turn-tokens 256 --max-context-tokens 2048 --max-obs-tokens 400

VERL_FILE_LOGGER_PATH="$OUT/metrics.jsonl" \
python -m verl.trainer.main_ppo \
    trainer.use_v1=False \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    data.train_files="$OUT/data/train.parquet" \
    data.val_files="$OUT/data/test.parquet" \
    data.train_batch_size=16 \
    data.max_prompt_length=512 \
    data.max_response_length=1536 \
    data.filter_overlong_prompts=True \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=4 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0.001 \
    actor_rollout_ref.actor.policy_loss._target_=searchgym.agents.integrations.verl.LLDSPolicyLossConfig \
    actor_rollout_ref.actor.policy_loss.loss_mode=llds_action \
    +actor_rollout_ref.actor.policy_loss.llds_coef=0.2 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.mode=async \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.calculate_log_probs=True \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
    trainer.logger='["console","file"]' \
    trainer.project_name=searchgym \
    trainer.experiment_name=verl_smoke \
    trainer.n_gpus_per_node="$GPUS" \
    trainer.nnodes=1 \
    trainer.total_training_steps=10 \
    trainer.val_before_train=False \
    trainer.test_freq=-1 \
    trainer.save_freq=-1 \
    "$@"
