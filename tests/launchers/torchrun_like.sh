#!/bin/bash
#SBATCH -J ddp-standin
#SBATCH -N 2
#SBATCH --ntasks-per-node=2
# The shape of the seed system's minGPT-ddp batch script: the first node of
# the job's list is the rendezvous host, its address asked of the node
# itself through srun, and one srun starts every rank.
set -euo pipefail
nodes=( $(scontrol show hostnames "$SLURM_JOB_NODELIST") )
head_node=${nodes[0]}
head_ip=$(srun --nodes=1 --ntasks=1 -w "$head_node" hostname --ip-address | awk '{print $1}')
echo "head $head_node $head_ip"
port=$((29500 + SLURM_JOB_ID % 500))
srun python3 "$RENDEZVOUS" "$head_ip" "$port"
