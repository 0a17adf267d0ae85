#!/bin/sh
# Corral's first run: what one checks on a fresh GPU cluster, with Slurm's
# own commands. `corral up` runs this with PATH pointing at the cluster.
set -e
cd "$(mktemp -d "${TMPDIR:-/tmp}/corral-demo-XXXXXX")"

echo "== sinfo"
sinfo

echo
echo "== srun -N2 --gres=gpu:1: one task per node, each with a GPU of its own"
srun -N2 --gres=gpu:1 -l sh -c 'echo "$SLURMD_NODENAME sees GPU $CUDA_VISIBLE_DEVICES"'

echo
echo "== sbatch: a 2-node job, 2 tasks and 2 GPUs per node"
cat > demo-job.sh <<'EOF'
#!/bin/sh
#SBATCH -J demo
#SBATCH -N 2
#SBATCH --ntasks-per-node=2
#SBATCH --gres=gpu:2
#SBATCH -o demo-%j.out
echo "job $SLURM_JOB_ID on $SLURM_JOB_NODELIST"
srun -l sh -c 'echo "task $SLURM_PROCID on $SLURMD_NODENAME, GPUs $CUDA_VISIBLE_DEVICES"'
sleep 2
EOF
cat demo-job.sh
job=$(sbatch --parsable demo-job.sh)
echo "Submitted batch job $job"
sleep 1

echo
echo "== squeue"
squeue
echo
echo "== sinfo"
sinfo

while [ -n "$(squeue -h -j "$job" -t PD,R,CG)" ]; do sleep 0.5; done
echo
echo "== demo-$job.out ($(pwd))"
cat "demo-$job.out"
echo
scontrol show job "$job" | head -6
