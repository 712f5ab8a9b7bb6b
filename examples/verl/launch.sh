#!/usr/bin/env bash
# Launch LightningRL on VeRL.  Needs: pip install 'lightning-rl[verl]' vllm (a vLLM version verl 0.9.1
# supports, >= 0.18), NVIDIA GPUs, and the model weights reachable from every node.
#
#   one node, 8 GPUs:      examples/verl/launch.sh
#   several nodes:         on the head node:    ray start --head --port 6379
#                          on every other node: ray start --address <head-ip>:6379
#                          then on the head:    NNODES=2 examples/verl/launch.sh
# Extra arguments are Hydra overrides, e.g. actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct.
set -euo pipefail
cd "$(dirname "$0")"
NNODES="${NNODES:-1}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
if [ "$NNODES" -gt 1 ]; then
  export RAY_ADDRESS="${RAY_ADDRESS:-auto}"   # join the cluster started with `ray start`
fi
exec python train.py \
  trainer.nnodes="$NNODES" \
  trainer.n_gpus_per_node="$GPUS_PER_NODE" \
  "$@"
