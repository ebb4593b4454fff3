"""Faulty pipeline-parallel submissions for `course check pp` (see tests/faulty.py): one mistake each."""
from faulty import Faulty

PASS = ("pass", "")
P2 = {"world_sizes": (2,)}
P4 = {"world_sizes": (4,)}
POSTED_TOGETHER = """    if ops:
        for request in dist.batch_isend_irecv(ops):
            request.wait()
"""
STEADY = """        y = forward(i)
        backward(None if pipe.last else communicate(pipe, send_next=y, recv_next=True)[1])
"""

CASES = [
    Faulty("blocking_sends_first", options=P2,
           why="communicate sends with blocking dist.send before it receives: in 1F1B's steady state both "
               "neighbours send first and wait for each other",
           edits=[(POSTED_TOGETHER,
                   "    for op in ops:   # sends were appended after the receives: send them first\n"
                   "        if op.op is dist.isend:\n"
                   "            dist.send(op.tensor, op.peer)\n"
                   "    for op in ops:\n"
                   "        if op.op is dist.irecv:\n"
                   "            dist.recv(op.tensor, op.peer)\n")],
           expect={"communicate": ("fail", r"1F1B's steady state.*did not finish: a deadlock.*\nrank 0 was waiting at "
                                           r"pp\.py:{line:dist.send(op.tensor, op.peer)}.*\nrank 1 was waiting at "
                                           r"pp\.py:{line:dist.send(op.tensor, op.peer)}.*\nhint: .*both send first"),
                   "forward_step": PASS, "backward_step": PASS, "afab": PASS,
                   "one_f_one_b": ("fail", "did not finish: a deadlock")}),
    Faulty("loss_not_divided", options=P2, why="the last stage returns the micro-batch's loss, not divided by m",
           edits=[("        return pipe.loss_fn(y, target) / pipe.m", "        return pipe.loss_fn(y, target)")],
           expect={"forward_step": ("fail", r"not divided by the number of micro-batches m = 3"),
                   "afab": ("fail", r"m = 4 times one process's: each micro-batch's loss must be divided by the "
                                    r"number of micro-batches m"),
                   "one_f_one_b": ("fail", r"m = 4 times"), "communicate": PASS, "backward_step": PASS}),
    Faulty("grads_zeroed_per_micro_batch", options=P2,
           why="backward_step zeroes the gradients before each micro-batch's backward",
           edits=[("    torch.autograd.backward(y, grad)\n",
                   "    pipe.module.zero_grad()\n    torch.autograd.backward(y, grad)\n")],
           expect={"backward_step": ("fail", r"holds the second one's gradient only: backward_step zeroes the "
                                             r"gradients between micro-batches"),
                   "afab": ("fail", r"gradient is the last micro-batch's share alone: the gradients were "
                                    r"zeroed between micro-batches"),
                   "communicate": PASS, "forward_step": PASS}),
    Faulty("warmup_p_minus_stage", options=P4, why="1F1B's warm-up is p - stage forwards, one too many",
           edits=[("    warmup = min(pipe.stages - pipe.stage - 1, pipe.m)",
                   "    warmup = min(pipe.stages - pipe.stage, pipe.m)")],
           expect={"one_f_one_b": ("fail", r"stage 3: ValueError.*after 1 forwards and no backward: more than "
                                           r"1F1B's warm-up of p - stage - 1 = 0 forwards"),
                   "afab": PASS, "communicate": PASS}),
    Faulty("backward_before_loss", options=P2,
           why="1F1B's steady state runs the backward first, then the forward: on the last stage (warm-up 0) "
               "the backward starts before the loss exists",
           edits=[(STEADY, "        backward(None if pipe.last else communicate(pipe, recv_next=True)[1])\n"
                           "        y = forward(i)\n        if not pipe.last:\n"
                           "            communicate(pipe, send_next=y)\n")],
           expect={"one_f_one_b": ("fail", r"last stage: IndexError.*its backward started before its loss"),
                   "afab": PASS}),
    Faulty("wrong_micro_batch", options=P2,
           why="1F1B backwards the newest micro-batch kept, not the oldest: the gradient received is another one's",
           edits=[("        x, y = saved.pop(0)                      # the oldest micro-batch in flight",
                   "        x, y = saved.pop()")],
           expect={"one_f_one_b": ("fail", r"stage 0 applied the gradient of micro-batch 0 \(received from stage 1\) "
                                           r"to the activations of micro-batch 1: it received the wrong micro-batch"),
                   "afab": PASS}),
    Faulty("receive_shape_whole_batch", options=P2,
           why="communicate allocates the receive buffers for the whole batch, not one micro-batch",
           edits=[("        from_prev = torch.empty(pipe.shape, dtype=pipe.dtype)",
                   "        from_prev = torch.empty(pipe.m * pipe.shape[0], pipe.shape[1], dtype=pipe.dtype)")],
           expect={"communicate": ("fail", r"stage 1 received a tensor of shape \(6, 6\) from stage 0, which sent "
                                           r"\(2, 6\) \(pipe.shape\): the sent and expected shapes disagree"),
                   "afab": ("fail", "the tensor sent and the one received disagree")}),
    Faulty("keeps_every_micro_batch", options=P2,
           why="1F1B reads each (x, y) from the list and never removes it: the order of its calls is 1F1B's, but "
               "every micro-batch's activations stay alive after its backward, as in AFAB",
           edits=[("    warmup = min(pipe.stages - pipe.stage - 1, pipe.m)\n",
                   "    warmup = min(pipe.stages - pipe.stage - 1, pipe.m)\n    done = [0]\n"),
                  ("        x, y = saved.pop(0)                      # the oldest micro-batch in flight\n",
                   "        x, y = saved[done[0]]                    # the oldest not yet backwarded\n"
                   "        done[0] += 1\n")],
           expect={"one_f_one_b": ("fail", r"stage 0: when it started the forward of micro-batch 3 it still held the "
                                           r"tensors of micro-batches \[0, 1\], whose backward had already run \("
                                           r"measured.*with the new one 4 micro-batches' tensors at once, where 1F1B "
                                           r"holds at most p - stage = 2.*saved.pop\(0\), not saved\[i\]"),
                   "afab": PASS, "communicate": PASS, "forward_step": PASS, "backward_step": PASS}),
    Faulty("loss_kept_with_graph", options=P2,
           why="1F1B's last stage keeps each loss with its graph (losses.append(y), no detach): the graph's leaf "
               "holds every micro-batch's input after its backward",
           edits=[("            losses.append(y.detach())\n        return y",
                   "            losses.append(y)\n        return y")],
           expect={"one_f_one_b": ("fail", r"stage 1: when it started the forward of micro-batch 2 it still held the "
                                           r"tensors of micro-batches \[0, 1\], whose backward had already run.*"
                                           r"1F1B holds at most p - stage = 1.*loss.detach\(\)"),
                   "afab": PASS}),
    Faulty("outputs_cached_past_the_step", options=P2,
           why="forward_step appends every output to a module-level list that nothing empties: each step's "
               "activations outlive it",
           edits=[("def forward_step(pipe, x, target=None):\n", "OUTPUTS = []\n\n\ndef forward_step(pipe, x, target=None):\n"),
                  ("    y = pipe.module(x)\n", "    y = pipe.module(x)\n    OUTPUTS.append(y)\n")],
           expect={"afab": ("fail", r"stage 0: after the step returned, the tensors of micro-batches \[0, 1, 2, 3\] "
                                    r"are still alive.*a module-level list"),
                   "one_f_one_b": ("fail", r"still held the tensors of micro-batches"),
                   "communicate": PASS, "forward_step": PASS, "backward_step": PASS}),
    Faulty("afab_sends_after_all_forwards", options=P2,
           why="AFAB sends its outputs on only after all m forwards: the next stage waits for the whole stage, "
               "no pipelining",
           edits=[("""        if pipe.last:
            losses.append(y.detach())
        else:
            communicate(pipe, send_next=y)
    for _ in range(pipe.m):""", """        if pipe.last:
            losses.append(y.detach())
    if not pipe.last:
        for _, y in saved:                       # every output at once, after all the forwards
            communicate(pipe, send_next=y)
    for _ in range(pipe.m):""")],
           expect={"afab": ("fail", r"stage 0 started the forward of micro-batch 1 having sent on 0 of the 1 "
                                    r"micro-batches before it \(measured at gloo's send\).*run one after another"),
                   "one_f_one_b": PASS}),
    Faulty("gradients_sent_back_in_pairs", options=P2,
           why="1F1B keeps each input's gradient and sends them back two at a time: the previous stage waits for "
               "the next backward too",
           edits=[("""        dx = backward_step(pipe, x, y, grad)
        if not pipe.first:
            communicate(pipe, send_prev=dx)

""", """        owed.append(backward_step(pipe, x, y, grad))
        if not pipe.first and len(owed) == 2:    # two at a time
            communicate(pipe, send_prev=owed.pop(0))
            communicate(pipe, send_prev=owed.pop(0))

"""), ("    warmup = min(pipe.stages - pipe.stage - 1, pipe.m)\n",
       "    warmup = min(pipe.stages - pipe.stage - 1, pipe.m)\n    owed = []\n"),
                  ("""        backward(communicate(pipe, recv_next=True)[1])
    return""", """        backward(communicate(pipe, recv_next=True)[1])
    if owed and not pipe.first:
        communicate(pipe, send_prev=owed.pop(0))
    return""")],
           expect={"one_f_one_b": ("fail", r"stage 1 started the backward of micro-batch 1 having sent on 0 of the 1 "
                                           r"micro-batches before it.*input's gradient to the previous stage as soon "
                                           r"as it is computed"),
                   "afab": PASS}),
]
