"""A stand-in for torchrun's static rendezvous, as the seed system's
minGPT-ddp example drives it under srun: every task reads its rank and
the world's size from Slurm's variables, rank 0 listens on the head
node's address, every other task connects to it over TCP and reports
itself, and rank 0 answers each with the whole world. Each task prints
one line: `rank R world W local L node N head-saw K`."""
import os
import socket
import sys
import time


def main(host, port):
    rank = int(os.environ["SLURM_PROCID"])
    world = int(os.environ["SLURM_NTASKS"])
    local = int(os.environ["SLURM_LOCALID"])
    node = int(os.environ["SLURM_NODEID"])
    me = f"{rank} {local} {node} {os.environ.get('SLURMD_NODENAME', '?')}"
    if rank == 0:
        srv = socket.create_server((host, port))
        srv.settimeout(60)
        peers, seen = [], [me]
        while len(peers) < world - 1:
            conn, _ = srv.accept()
            seen.append(conn.makefile().readline().strip())
            peers.append(conn)
        answer = ";".join(sorted(seen)) + "\n"
        for c in peers:
            c.sendall(answer.encode())
            c.close()
        saw = len(seen)
    else:
        deadline = time.time() + 60
        while True:
            try:
                conn = socket.create_connection((host, port), timeout=5)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        conn.sendall((me + "\n").encode())
        saw = len(conn.makefile().readline().strip().split(";"))
    print(f"rank {rank} world {world} local {local} node {node} head-saw {saw}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
