"""Bug hunt 3: the two ranks of rendezvous.sbatch, one per node, meet at MASTER_ADDR:MASTER_PORT (gloo).

One machine cannot show two nodes, so rank 1 stands in for the second node: it takes the MASTER_ADDR that the
second node's task gets from rendezvous.sbatch (beside this file, read as bash and srun read it). Where that task
would get none, it has only its own default, which on a real second node is that node itself; here it is
192.0.2.1, an address reserved for documentation (RFC 5737) that no machine answers. This file is not the bug.
"""
import os
from pathlib import Path

from course_lib.bughunt import rank_world, setup, teardown
from course_lib.sbatch.script import parse

rank, _, _ = rank_world()
job = parse((Path(__file__).parent / "rendezvous.sbatch").read_text())
if rank == 1 and "MASTER_ADDR" not in job.exports:     # what the second node's task would see
    os.environ["MASTER_ADDR"] = "192.0.2.1"
print(f"rank {rank}: rendezvous at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", flush=True)
setup()
print(f"rank {rank}: joined", flush=True)
teardown()
