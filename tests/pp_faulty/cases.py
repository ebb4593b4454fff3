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
AFAB_RECEIVE = """    for i in range(pipe.m):
        x = inputs[i] if pipe.first else communicate(pipe, recv_prev=True)[0]
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
    Faulty("afab_receives_every_activation_first", options=P2,
           why="AFAB receives all m activations before its first forward: the stages run one after another",
           edits=[(AFAB_RECEIVE, "    xs = inputs if pipe.first else [communicate(pipe, recv_prev=True)[0]\n"
                                 "                                    for _ in range(pipe.m)]\n"
                                 "    for i in range(pipe.m):\n        x = xs[i]\n")],
           expect={"afab": ("fail", r"stage 1 started the forward of micro-batch 0 having received 4 activations "
                                    r"from the previous stage that no forward had used yet.*one after another"),
                   "one_f_one_b": PASS}),
    Faulty("output_sent_after_backward", options=P2,
           why="1F1B's steady state sends the forward's output only after the backward in between",
           edits=[(STEADY, "        y = forward(i)\n"
                           "        backward(None if pipe.last else communicate(pipe, recv_next=True)[1])\n"
                           "        if not pipe.last:\n            communicate(pipe, send_next=y)\n")],
           expect={"one_f_one_b": ("fail", r"stage 0 started the backward of micro-batch 0 with the output of its "
                                           r"last forward not yet sent to the next stage.*in ONE communicate"),
                   "afab": PASS}),
    Faulty("gradient_sent_after_next_forward", options=P2,
           why="1F1B sends each input's gradient back only after the stage's next forward",
           edits=[("    warmup = min(pipe.stages - pipe.stage - 1, pipe.m)\n",
                   "    warmup = min(pipe.stages - pipe.stage - 1, pipe.m)\n    owed = []\n"),
                  ("            communicate(pipe, send_prev=dx)\n\n    for i in range(warmup):",
                   "            owed.append(dx)                      # sent after the next forward\n\n"
                   "    for i in range(warmup):"), ("        losses.append(y.detach())\n        return y\n",
       "        losses.append(y.detach())\n        while owed:\n"
       "            communicate(pipe, send_prev=owed.pop(0))\n        return y\n"),
                  ("        backward(communicate(pipe, recv_next=True)[1])\n    return",
                   "        backward(communicate(pipe, recv_next=True)[1])\n    while owed:\n"
                   "        communicate(pipe, send_prev=owed.pop(0))\n    return")],
           expect={"one_f_one_b": ("fail", r"stage 1 started the forward of micro-batch 1 with the input's gradient "
                                           r"of its last backward not yet sent to the previous stage"),
                   "afab": PASS}),
    Faulty("peers_are_stage_numbers", options=P2,
           why="communicate's peers are pipe.stage +- 1, not pipe.prev / pipe.next: right only where stage s is "
               "rank s",
           edits=[(f"{op}, pipe.{side}, pipe.group))", f"{op}, pipe.stage {sign} 1, pipe.group))")
                  for op, side, sign in (("from_prev", "prev", "-"), ("from_next", "next", "+"),
                                         ("send_next.detach().contiguous()", "next", "+"),
                                         ("send_prev.detach().contiguous()", "prev", "-"))],
           expect={"communicate": ("fail", r"stage s on global rank 1 - s: .*stage 1 \(global rank 0\) posted a "
                                           r"receive from rank 0, which is itself.*not pipe\.stage \+- 1"),
                   "afab": PASS, "one_f_one_b": PASS}),
    Faulty("isend_irecv_unbatched", options=P2,
           why="communicate posts dist.isend and dist.irecv one by one, not through batch_isend_irecv",
           edits=[(POSTED_TOGETHER, "    reqs = [op.op(op.tensor, op.peer, op.group) for op in ops]   # one by one\n"
                                    "    for request in reqs:\n        request.wait()\n")],
           expect={"communicate": ("fail", r"1F1B's steady state.*communicate made 1 sends and 1 receives outside "
                                           r"dist\.batch_isend_irecv"),
                   "afab": PASS}),
    Faulty("sends_not_waited", options=P2, why="communicate waits on its receives' requests only",
           edits=[(POSTED_TOGETHER, "    if ops:\n        for op, request in zip(ops, dist.batch_isend_irecv(ops)):\n"
                                    "            if op.op is dist.irecv:\n                request.wait()\n")],
           expect={"communicate": ("fail", r"along the chain.*returned without waiting on 1 of its send requests")}),
    Faulty("receive_buffer_float32", options=P2,
           why="communicate's receive buffers are float32 (no dtype=) while the stages send float64",
           edits=[(f"        from_{side} = torch.empty(pipe.shape, dtype=pipe.dtype)",
                   f"        from_{side} = torch.empty(pipe.shape)") for side in ("prev", "next")],
           expect={"communicate": ("fail", r"received into a torch\.float32 buffer while the stages send "
                                           r"torch\.float64.*torch\.empty\(pipe\.shape, dtype=pipe\.dtype\)"),
                   "afab": ("fail", r"hint: gloo aborted the receiving process: a message of 96 B arrived for a "
                                    r"receive buffer of 48 B.*dtype=pipe\.dtype")}),
    Faulty("afab_backwards_newest_first", options=P2, why="AFAB runs its backwards newest first",
           edits=[("        x, y = saved.pop(0)                      # the oldest first: micro-batch order, as the next "
                   "stage sends", "        x, y = saved.pop()")],
           expect={"afab": ("fail", r"ran its backwards in the order \[3, 2, 1, 0\]: every stage runs them in "
                                    r"micro-batch order"),
                   "one_f_one_b": PASS}),
    Faulty("first_stage_input_requires_grad", options=P2,
           why="forward_step makes x require its gradient on the first stage too: the caller's data",
           edits=[("    if not pipe.first:\n        x.requires_grad_()\n", "    x.requires_grad_()\n")],
           expect={"forward_step": ("fail", r"first stage: forward_step made its input x require its gradient"),
                   "afab": ("fail", r"the caller's inputs require their gradient after the step")}),
    Faulty("returns_zero_not_none", options=P2, why="AFAB returns 0.0 on the stages without the loss, not None",
           edits=[("    return float(sum(losses)) if pipe.last else None\n\n\ndef one_f_one_b",
                   "    return float(sum(losses))\n\n\ndef one_f_one_b")],
           expect={"afab": ("fail", r"stage 0 returned 0\.0: the schedules return the step's loss on the last "
                                    r"stage only, None on every other stage"),
                   "one_f_one_b": PASS}),
    Faulty("loss_scale_float32", options=P2, why="the loss is scaled by a float32 tensor 1 / m: off by rounding",
           edits=[("        return pipe.loss_fn(y, target) / pipe.m", 
                   "        return pipe.loss_fn(y, target) * torch.tensor(1 / pipe.m)")],
           expect={"forward_step": ("fail", r"pipe\.m = 0\.196367514\d+ \(a relative difference of 3\.0e-08 from "
                                            r"the nearest: float32 rounding")}),
    Faulty("gradient_buffer_reused", options=P2,
           why="communicate receives every gradient into one buffer kept on pipe: the stub asks for a new one each",
           edits=[("        from_next = torch.empty(pipe.shape, dtype=pipe.dtype)",
                   "        if getattr(pipe, 'grad_buffer', None) is None:\n"
                   "            pipe.grad_buffer = torch.empty(pipe.shape, dtype=pipe.dtype)\n"
                   "        from_next = pipe.grad_buffer")],
           expect={"afab": ("fail", r"micro-batches \[0, 1, 2, 3\] received into one and the same buffer.*kept "
                                    r"and reused"),
                   "communicate": PASS}),
]

# right submissions written otherwise than the solution: they must pass (test_pp_checker.py)
RIGHT = [
    Faulty("afab_receives_next_activation_early", options=P4,
           why="right: AFAB receives the next activation right after a forward, before sending its output (the "
               "middle stages of p=4 hold one received ahead, as Megatron's 1F1B does)",
           edits=[(AFAB_RECEIVE, "    nxt = None if pipe.first else communicate(pipe, recv_prev=True)[0]\n"
                                 "    for i in range(pipe.m):\n        x = inputs[i] if pipe.first else nxt\n"),
                  ("        saved.append((x, y))\n        if pipe.last:\n            losses.append(y.detach())\n"
                   "        else:\n",
                   "        saved.append((x, y))\n        if not pipe.first and i + 1 < pipe.m:\n"
                   "            nxt = communicate(pipe, recv_prev=True)[0]\n        if pipe.last:\n"
                   "            losses.append(y.detach())\n        else:\n")],
           expect={}),
]
