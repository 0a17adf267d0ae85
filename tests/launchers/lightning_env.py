"""What PyTorch Lightning's SLURM environment reads, read the same way
(Lightning itself pulls PyTorch, too big for CI): it is detected when
SLURM_NTASKS is set and the job is not named bash or interactive; more
than one task needs SLURM_NTASKS_PER_NODE (Lightning refuses a bare
--ntasks); the main address is the first host of SLURM_NODELIST, the
port 15000 plus the job id's last four digits; ranks from the task's
variables. Prints one line per task."""
import os
import subprocess
import sys

env = os.environ
if "SLURM_NTASKS" not in env or env.get("SLURM_JOB_NAME") in ("bash", "interactive"):
    sys.exit("not detected as a SLURM environment")
ntasks = int(env["SLURM_NTASKS"])
if ntasks > 1 and "SLURM_NTASKS_PER_NODE" not in env:
    sys.exit("--ntasks without --ntasks-per-node: Lightning refuses it")
nodes = subprocess.run(
    ["scontrol", "show", "hostnames", env["SLURM_NODELIST"]],
    check=True, capture_output=True, text=True,
).stdout.split()
port = 15000 + int(env["SLURM_JOB_ID"][-4:])
print(
    f"global {env['SLURM_PROCID']} local {env['SLURM_LOCALID']} node {env['SLURM_NODEID']} "
    f"world {ntasks} per-node {env['SLURM_NTASKS_PER_NODE']} main {nodes[0]}:{port}"
)
