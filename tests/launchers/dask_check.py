"""dask-jobqueue's documented SLURMCluster usage against a Corral cluster;
prints one `key value` line per check for tests/tests/launchers.rs."""
import subprocess
import sys
import time

from dask.distributed import Client
from dask_jobqueue import SLURMCluster


def main(folder):
    cluster = SLURMCluster(
        cores=1,
        processes=1,
        memory="1GB",
        walltime="00:05:00",
        queue="gpu",
        log_directory=folder,
        scheduler_options={"host": "127.0.0.1"},
    )
    script = cluster.job_script()
    print("directives", sum(1 for l in script.splitlines() if l.startswith("#SBATCH")), flush=True)
    t0 = time.time()
    cluster.scale(jobs=2)
    client = Client(cluster)
    client.wait_for_workers(2, timeout=120)
    print("workers", len(client.scheduler_info()["workers"]), flush=True)
    print("seconds", round(time.time() - t0, 2), flush=True)
    futures = client.map(lambda x: x * x, range(10))
    print("sum", sum(client.gather(futures)), flush=True)
    hosts = client.run(lambda: __import__("os").environ.get("SLURMD_NODENAME"))
    print("nodes", sorted(hosts.values()), flush=True)
    jobs = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True).stdout
    print("running", len([l for l in jobs.splitlines() if "RUNNING" in l]), flush=True)
    client.close()
    cluster.close()
    deadline = time.time() + 30
    while time.time() < deadline:
        left = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
        if not left.strip():
            break
        time.sleep(0.5)
    print("left", len(left.split()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
