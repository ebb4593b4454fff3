"""Bug hunt 3: two "nodes" (one rank each) meet at MASTER_ADDR:MASTER_PORT (gloo).

On a real job, a script that does not export MASTER_ADDR leaves each node to its own default, and the default
127.0.0.1 on the second node is that node itself, where nobody waits. One machine cannot show two nodes, so
rank 1 stands in for the second node with 192.0.2.1, an address reserved for documentation (RFC 5737) that
no machine answers.
"""
import os

from course_lib.bughunt import rank_world, setup, teardown

rank, _, _ = rank_world()
### BEGIN SOLUTION
# STUB: if rank == 1:                              # the second node's idea of where rank 0 is
# STUB:     os.environ["MASTER_ADDR"] = "192.0.2.1"
pass                                           # every rank uses the MASTER_ADDR the job script exported
### END SOLUTION
print(f"rank {rank}: rendezvous at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", flush=True)
setup()
print(f"rank {rank}: joined", flush=True)
teardown()
