"""Faulty own_ddp.py submissions that `course check ownddp` must catch, at the right variant and with the right
reason (tests/faulty.py says how a case is declared; tests/test_owndp_checker.py runs them).

Each is the solution with a mistake learners make typed in. ``("pass", "")``: that variant must still pass.
"""
from faulty import Faulty

W2 = {"world_sizes": (2,)}
PASS = ("pass", "")
BROADCAST = ("        with torch.no_grad():   # frozen ones too: every rank must compute with the same model\n"
             "            for t in [*module.parameters(), *module.buffers()]:\n"
             "                dist.broadcast(t, src=0)\n")
HOOKS = "        for p in self.params:   # a frozen parameter cannot take a hook, and needs none\n"
LAUNCH = "        self.handles.append(dist.all_reduce(param.grad, async_op=True))\n"
FLUSH = ("        for i in range(len(self.buckets)):     # a bucket with an unused parameter never filled up: "
         "send it now\n"
         "            if i not in self.pending:\n"
         "                self._launch(i)\n")
WAITS = "        for handle in self.handles:\n            handle.wait()\n        self.handles.clear()\n"
NAIVE = ("        for p in self.params:\n            if p.grad is not None:   # unused on every rank: nothing to send\n"
         "                dist.all_reduce(p.grad)\n                p.grad /= self.world\n")
FORWARD = "    def forward(self, *args, **kwargs):\n        return self.module(*args, **kwargs)\n"

CASES = [
    Faulty("none_grad_not_skipped", options=W2, why="naive: divides every gradient, the unused layer's None too",
           edits=[("            if p.grad is not None:   # unused on every rank: nothing to send\n"
                   "                dist.all_reduce(p.grad)\n                p.grad /= self.world\n",
                   "            dist.all_reduce(p.grad)\n            p.grad /= self.world\n")],
           expect={"naive": ("fail", r"tied model: \w+Error: .*NoneType.*: a parameter that forward did not use .* "
                                     r"has no gradient on any rank: its \.grad is None; skip it"),
                   "overlapped": PASS}),
    Faulty("no_average", options=W2, why="naive: the gradients are summed over the ranks, never divided by W",
           edits=[("                dist.all_reduce(p.grad)\n                p.grad /= self.world\n",
                   "                dist.all_reduce(p.grad)\n")],
           expect={"naive": ("fail", r"plain model, W=2, rank \d, after step 1: the update is W = 2 times the "
                                     r"single-process one: divide the summed gradient by W"),
                   "flat": PASS, "overlapped": PASS, "bucketed": PASS}),
    Faulty("wait_in_hook", options=W2, why="overlapped: the hook waits on its all-reduce: correct, but no overlap",
           edits=[(LAUNCH, "        dist.all_reduce(param.grad, async_op=True).wait()\n")],
           expect={"overlapped": ("fail", r"plain model, W=2: an all-reduce is waited on during backward \(in the "
                                          r"hook\).*wait in finish_gradient_synchronization"),
                   "naive": PASS, "bucketed": PASS}),
    Faulty("buckets_forward_order", options=W2, why="bucketed: buckets built from the first parameter",
           edits=[("    for p in reversed(list(params)):", "    for p in list(params):")],
           expect={"bucketed": ("fail", r"plain model, W=2, bucket_size_mb=\S+ \(212 bytes\): 4 all-reduces of "
                                        r"\[.*\] elements; expected 3 buckets.*built from the first parameter; "
                                        r"build them from the last"),
                   "overlapped": PASS}),
    Faulty("hook_on_frozen", options=W2, why="overlapped: a hook on every parameter, the frozen one too",
           edits=[(HOOKS, "        for p in self.module.parameters():\n")],
           expect={"overlapped": ("fail", r"OverlappedDDP\(tied model\): RuntimeError: cannot register a hook on a "
                                          r"tensor that doesn't require gradient \(own_ddp\.py line "
                                          r"{line:p.register_post_accumulate_grad_hook(self._on_grad_ready)}, in "
                                          r"__init__\): register hooks only on parameters with requires_grad"),
                   "naive": PASS, "bucketed": PASS}),
    Faulty("bucket_never_flushed", options=W2,
           why="bucketed: a bucket that holds an unused parameter never fills up and is never sent",
           edits=[(FLUSH, "")],
           expect={"bucketed": ("fail", r"tied model, W=2, rank \d, after step 1: hidden\.bias.* differ from a "
                                        r"single-process run"),
                   "overlapped": PASS}),
    Faulty("no_broadcast", options=W2, why="no initial broadcast: every rank starts from its own random model",
           edits=[(BROADCAST, "        pass\n")],
           expect={v: ("fail", r"plain model, rank 1: right after wrapping it, 0\.weight, 0\.bias, .* differ from "
                               r"rank 0's: broadcast every parameter and buffer from rank 0")
                   for v in ("naive", "flat", "overlapped", "bucketed")}),
    Faulty("broadcast_trainable_only", options=W2, why="only the parameters that require grad are broadcast",
           edits=[(BROADCAST, "        for t in self.params:\n            dist.broadcast(t.data, src=0)\n")],
           expect={"naive": ("fail", r"tied model, rank 1: right after wrapping it, frozen\.weight, frozen\.bias, "
                                     r"the buffer scale differ from rank 0's.*\(frozen ones too\)")}),
    Faulty("bucket_counts_not_reset", options=W2,
           why="bucketed: the count of ready gradients per bucket is never reset: from the second step on no bucket "
               "fills up in backward, and finish_gradient_synchronization sends them all (right, but no overlap)",
           edits=[("        self.ready = [0] * len(self.buckets)\n        self.pending = {}\n",
                   "        self.pending = {}\n")],
           expect={"bucketed": ("fail", r"plain model, W=2: the all-reduces overlapped backward in step 1 but not in "
                                        r"step 3: .*not reset once the step is done"),
                   "naive": PASS, "overlapped": PASS}),
    Faulty("broadcast_parameters_only", options=W2,
           why="the parameters are broadcast but not the buffers: a random buffer stays each rank's own",
           edits=[(BROADCAST, BROADCAST.replace("[*module.parameters(), *module.buffers()]", "module.parameters()"))],
           expect={v: ("fail", r"tied model, rank 1: right after wrapping it, the buffer scale differs from rank 0's: "
                               r"broadcast every parameter and buffer")
                   for v in ("naive", "flat", "overlapped", "bucketed")}),
    # what the values cannot show: the bytes sent, memory kept from step to step, a broadcast per step, a wait
    Faulty("naive_sends_frozen", options=W2,
           why="naive: walks module.parameters(), skips the unused one but sends a frozen one's zeros: the count of "
               "all-reduces is right, their sizes are not",
           edits=[(NAIVE, "        for p in self.module.parameters():\n"
                          "            if p.requires_grad and p.grad is None:   # unused: nothing to send\n"
                          "                continue\n"
                          "            g = p.grad if p.grad is not None else torch.zeros_like(p)   # frozen: zeros\n"
                          "            dist.all_reduce(g)\n            g /= self.world\n")],
           expect={"naive": ("fail", r"tied model, W=2: 5 all-reduces of \[.*\] elements in one step; NaiveDDP sends "
                                     r"one per gradient, of \[66, 36, 6\] elements.*frozen"),
                   "flat": PASS, "overlapped": PASS, "bucketed": PASS}),
    Faulty("handles_never_cleared", options=W2,
           why="overlapped: the handles are waited on but never cleared: the list grows by a handle per gradient "
               "every step (and waits again on the old ones); right values",
           edits=[(WAITS, "        for handle in self.handles:\n            handle.wait()\n")],
           expect={"overlapped": ("fail", r"plain model, W=2: self\.handles holds 12 tensors and all-reduce handles "
                                          r"after step 2 and 18 after step 3: .*never dropped"),
                   "naive": PASS, "flat": PASS, "bucketed": PASS}),
    Faulty("bucket_buffers_kept", options=W2,
           why="bucketed: every bucket's flat buffer is also appended to a list that is never cleared: a copy of "
               "every gradient kept per step",
           edits=[("        self.pending = {}                         # bucket",
                   "        self.flats = []                           # keeps each buffer alive until sent\n"
                   "        self.pending = {}                         # bucket"),
                  ("        self.pending[i] = (dist.all_reduce(flat, async_op=True), flat)\n",
                   "        self.pending[i] = (dist.all_reduce(flat, async_op=True), flat)\n"
                   "        self.flats.append(flat)\n")],
           expect={"bucketed": ("fail", r"plain model, W=2: self\.flats holds 6 tensors and all-reduce handles "
                                        r"after step 2 and 9 after step 3: .*never dropped"),
                   "overlapped": PASS}),
    Faulty("broadcast_every_forward", options=W2,
           why="rank 0's parameters broadcast again in every forward: right values, the whole model sent every step",
           edits=[(FORWARD, "    def forward(self, *args, **kwargs):\n"
                            "        with torch.no_grad():   # keep ranks in step\n"
                            "            for p in self.module.parameters():\n                dist.broadcast(p, src=0)\n"
                            "        return self.module(*args, **kwargs)\n")],
           expect={v: ("fail", r"plain model, W=2, step 1: 6 broadcasts of 203 elements during the step.*broadcast "
                               r"once, in NaiveDDP\.__init__")
                   for v in ("naive", "flat", "overlapped", "bucketed")}),
    Faulty("wait_last_only", options=W2,
           why="overlapped: waits only on the last handle, as if the all-reduces finished in order: the others may "
               "still run when optimizer.step() reads the gradients",
           edits=[(WAITS, "        if self.handles:   # the last launched finishes last\n"
                          "            self.handles[-1].wait()\n        self.handles.clear()\n")],
           expect={"overlapped": ("fail", r"plain model, W=2, step 1: 5 of the 6 async all-reduces launched in the "
                                          r"step were never waited on"),
                   "naive": PASS, "bucketed": PASS}),
    Faulty("divide_before_wait", options=W2,
           why="overlapped: the hook launches the all-reduce of the undivided gradient and finish divides it before "
               "waiting: a race with the all-reduce still running (right values when it happens to finish first)",
           edits=[("        param.grad /= self.world          # the sum of the ranks' grad / W is their mean\n", ""),
                  (WAITS, "        for p in self.params:\n            if p.grad is not None:\n"
                          "                p.grad /= self.world\n" + WAITS)],
           expect={"overlapped": ("fail", r"plain model, W=2, step 1: the tensors of 6 of the 6 async all-reduces "
                                          r"launched in the step were changed in place before their wait\(\)"),
                   "naive": PASS, "bucketed": PASS}),
    # what the test models' registration order hides: a model used in another order, a cap in MiB, not MB
    Faulty("launch_on_last_entry", options=W2,
           why="bucketed: a bucket goes out when its last entry's gradient is ready, as if that came last: true only "
               "when forward uses the parameters in the order they were registered",
           edits=[("        self.ready[i] += 1\n        if self.ready[i] == len(self.buckets[i]):\n",
                   "        if param is self.buckets[i][-1]:   # backward reaches a bucket's last parameter last\n")],
           expect={"bucketed": ("fail", r"reordered model, W=2, step 1: an all-reduce of 75 elements started during "
                                        r"backward when backward had produced 27 elements.*Count the gradients that "
                                        r"arrived in each bucket"),
                   "overlapped": PASS}),
    Faulty("bucket_cap_in_mb", options=W2, why="bucketed: the cap is bucket_size_mb * 1e6 bytes, not MiB",
           edits=[("    cap = bucket_size_mb * MIB\n", "    cap = bucket_size_mb * 1e6             # MB\n")],
           expect={"bucketed": ("fail", r"\(1052 bytes\): 2 all-reduces of \[131, 72\] elements; expected 2 buckets of "
                                        r"\[143, 60\]: .*bucket_size_mb \* 1e6 bytes.*bucket_size_mb \* 2\*\*20"),
                   "overlapped": PASS}),
    Faulty("reduce_then_broadcast", options=W2,
           why="naive: each gradient reduced to rank 0, then broadcast from it: right values, two calls for one",
           edits=[("                dist.all_reduce(p.grad)\n",
                   "                dist.reduce(p.grad, dst=0)\n                dist.broadcast(p.grad, src=0)\n")],
           expect={"naive": ("fail", r"plain model, W=2, step 1: 6 reduces and 6 broadcasts during the step: .*use "
                                     r"dist\.all_reduce"),
                   "flat": PASS, "bucketed": PASS}),
    # the checker's own case deadline: the deadlock is reported by the ranks (every rank waits on another) within
    # seconds, well before it; "a deadlock" is said only then, not when a deadline fired
    Faulty("rank0_only_reduce", options={"world_sizes": (2,)},
           why="naive: only rank 0 all-reduces; rank 1 goes on and waits elsewhere: a deadlock",
           edits=[("            if p.grad is not None:   # unused on every rank: nothing to send\n",
                   "            if p.grad is not None and dist.get_rank() == 0:\n")],
           expect={"naive": ("fail", r"W=2: did not finish: a deadlock, ranks \[0.*\n.*rank 0 was waiting at "
                                     r"own_ddp\.py:{line:                dist.all_reduce(p.grad)} in "
                                     r"finish_gradient_synchronization"),
                   "flat": PASS, "bucketed": PASS}),
    Faulty("syntax_error", options=W2, why="a missing colon",
           edits=[("def make_buckets(params, bucket_size_mb):", "def make_buckets(params, bucket_size_mb)")],
           expect={"own_ddp.py": ("fail", "does not load: SyntaxError")}),
]
