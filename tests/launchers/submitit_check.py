"""submitit's documented usage against a Corral cluster; prints one
`key value` line per check for tests/tests/launchers.rs to assert."""
import sys
import time

import submitit


def add(a, b):
    return a + b


def boom():
    raise ValueError("boom from the job")


def rank():
    env = submitit.JobEnvironment()
    return (env.global_rank, env.local_rank, env.num_tasks, env.node, env.num_nodes)


def main(folder):
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
    ex.update_parameters(timeout_min=5, nodes=1, tasks_per_node=1)
    t0 = time.time()
    job = ex.submit(add, 2, 3)
    print("result", job.result(), flush=True)
    print("seconds", round(time.time() - t0, 2), flush=True)
    failing = ex.submit(boom)
    try:
        failing.result()
        print("raised none", flush=True)
    except submitit.core.utils.FailedJobError as e:
        print("raised", "ValueError: boom from the job" in str(e), flush=True)
    jobs = ex.map_array(add, [1, 2, 3], [10, 20, 30])
    print("array", [j.result() for j in jobs], flush=True)
    ex.update_parameters(nodes=2, tasks_per_node=2)
    print("ranks", sorted(ex.submit(rank).results()), flush=True)
    ex.update_parameters(nodes=1, tasks_per_node=1)
    sleeper = ex.submit(time.sleep, 120)
    while sleeper.state in ("UNKNOWN", "PENDING"):
        time.sleep(0.5)
    sleeper.cancel()
    deadline = time.time() + 30
    while not sleeper.state.startswith("CANCELLED") and time.time() < deadline:
        time.sleep(0.5)
    print("cancelled", sleeper.state, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
