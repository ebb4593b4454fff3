"""Faulty DDP scripts that `course check ddp` must catch, at the right step and with the right reason
(tests/faulty.py says how a case is declared; tests/test_ddp_checker.py runs them).

Most are the solution's clean view with a mistake typed in. Whole files stand beside this one where the
shape differs: mp.spawn, a functional script for srun only, Trainer classes (one correct: the checker must
not depend on the solution's names or layout), a single-process example. ``expect`` names the steps that
are asserted: ("fail", regex) or ("pass", ""); steps not named are not asserted. ``options`` go to
``check()`` on top of ``DEFAULT`` (the fewer runs, the quicker), except ``cpu_only``: the mistake shows only
without GPUs, so the case is skipped on a machine with 2 or more.
"""
from faulty import Faulty

# one srun-style launch of 2 ranks, no simulated cluster
DEFAULT = {"styles": ("srun",), "more_ranks": None, "timeout": 120.0, "simulate": False}
BOTH = {"styles": ("srun", "torchrun")}
GPUS = {"simulate": True}                       # + 2 simulated nodes x 2 GPUs (Step 4)
NODES = {"more_ranks": 3}                       # + 3 ranks as 3 nodes of one rank each
SRUN_TORCHRUN = {**BOTH, "simulate": True}      # + torchrun inside a one-task Slurm step (Step 1)
PASS = ("pass", "")
CPU_ONLY = {"cpu_only": True}

SET_DEVICE = ("    if use_cuda:  # Step 1: set this rank's GPU before init, so that NCCL uses it and no other\n"
              "        torch.cuda.set_device(local_rank)\n")
DDP_WRAP = "    model = DDP(model, device_ids=[local_rank] if use_cuda else None)"
DEVICE = '    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")'
ENV_TORCHRUN = ('    if "RANK" in os.environ:\n'
                '        return int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), '
                'int(os.environ["WORLD_SIZE"])\n')
ENV_SRUN = ('    if "SLURM_PROCID" in os.environ:  # srun: one task per rank\n'
            '        return int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_LOCALID"]), '
            'int(os.environ["SLURM_NTASKS"])\n')
INIT = '    dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world_size,  # Step 1\n'
EPOCH_LINE = "                                epoch_s=epoch_s), flush=True)\n"
SAVE = '        torch.save(model.module.state_dict(), "mnist_cnn.pt")'
SAMPLER = "    train_sampler = DistributedSampler(train_set, seed=args.seed)"
TRAIN_KWARGS = '    train_kwargs = {"batch_size": args.batch_size, "sampler": train_sampler}'
SET_EPOCH = ("        train_sampler.set_epoch(epoch)  # Step 3: reshuffle; without it every epoch repeats "
             "the same order\n")
START = "        start = time.perf_counter()\n"
STOP = "        epoch_s = time.perf_counter() - start\n"
BACKWARD = "        scaler.scale(loss).backward()   # fp16: a scaled loss keeps small gradients from underflowing\n"

CASES = [
    # ---- Step 1: the process group
    Faulty("syntax_error", why="a syntax error (a colon missing)",
           edits=[("    if use_cuda:  # Step 1: set", "    if use_cuda  # Step 1: set")],
           expect={"Step 1": ("fail", r"does not compile: SyntaxError.*line {line:if use_cuda  # Step 1}")}),
    Faulty("mp_spawn", file="mp_spawn.py",
           why="the mp.spawn style of older tutorials: under srun or torchrun each rank spawns more processes",
           expect={"Step 1": ("fail", r"starts its own processes")}),
    Faulty("world_size_one", file="world_size_one.py",
           why="copied from a single-process example: every process joins a group of one",
           expect={"Step 1": ("fail", r"world.size")}),
    Faulty("world_size_hardcoded", options={"more_ranks": 3, "timeout": 60.0},
           why="the world size is hard-coded to 2: right with 2 ranks, wrong with 3",
           edits=[('    dist.init_process_group("nccl"',
                   '    world_size = 2  # two ranks, as in the notebook\n    dist.init_process_group("nccl"')],
           expect={"Step 1": ("fail", r"with 3 ranks")}),
    Faulty("world_size_too_big", why="the world size is hard-coded to 4 (the GPUs of a node): with 2 ranks init "
                                     "waits for ranks that never come, a deadlock reported in seconds",
           edits=[('    dist.init_process_group("nccl"',
                   '    world_size = 4  # the GPUs of one node\n    dist.init_process_group("nccl"')],
           # reported after a few seconds of every rank waiting in init (the stall alone: 60 s)
           expect={"Step 1": ("fail", r"asked init_process_group for world_size=4 \(hard-coded\?\)"),
                   "Step 2": ("fail", r"not checked: the run stopped before this step could be seen: deadlock: rank 0 "
                                      r"waited 1?\d s at line {line:dist.init_process_group(}")}),
    # mistakes that only another launcher or a second node shows
    Faulty("slurm_vars_first", options=SRUN_TORCHRUN,
           why="Slurm's variables read before torchrun's: right under srun and under torchrun, but under "
               "`srun torchrun` every worker reads the one task's SLURM_PROCID=0, SLURM_NTASKS=1",
           edits=[(ENV_TORCHRUN + ENV_SRUN, ENV_SRUN + ENV_TORCHRUN)],
           expect={"Step 1": ("fail", r"under `srun torchrun`.*worker 0 believed it was rank 0 of a world of 1; "
                                      r"worker 1 believed it was rank 0 of a world of 1.*SLURM_PROCID.*"
                                      r"Read torchrun's RANK, LOCAL_RANK and WORLD_SIZE first"),
                   "Step 2": PASS, "Step 5": PASS}),
    Faulty("master_addr_hardcoded", options=NODES,
           why="MASTER_ADDR set to the loopback in the script: right on one node, on two nodes the ranks of the "
               "second node look for rank 0 on their own node",
           edits=[(INIT, '    os.environ["MASTER_ADDR"] = "127.0.0.1"  # where rank 0 listens\n' + INIT)],
           expect={"Step 1": ("fail", r"line {line:# where rank 0 listens} sets MASTER_ADDR='127.0.0.1' "
                                      r"over the one the launch gave \(127.0.0.2, node 0's address on 3 nodes of one rank "
                                      r"each\).*on two nodes the ranks of node 1 look for rank 0 at 127.0.0.1"),
                   "Step 2": PASS}),
    Faulty("local_id_as_rank", options={**NODES, **GPUS},
           why="the srun branch returns SLURM_LOCALID as the global rank: right on one node, but every node then "
               "has its own rank 0; Step 4's simulated GPUs cannot get past init either: it says to fix Step 1 first",
           edits=[('int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_LOCALID"]),',
                   'int(os.environ["SLURM_LOCALID"]), int(os.environ["SLURM_LOCALID"]),')],
           expect={"Step 1": ("fail", r"with 3 ranks: the processes asked for ranks \[0, 0, 0\]"),
                   "Step 4": ("pass", r"\(Fix Step 1 first: the launch on 2 simulated nodes of 2 GPUs needs what "
                                      r"Step 1 checks, and it could not follow the script to its model: rank \d "
                                      r"crashed: .* at line {line:dist.init_process_group(}"),
                   "Step 6": ("fail", r"works with 2 ranks but not with 3")}),
    Faulty("world_size_from_gpu_count", options=GPUS,
           why="the world size taken from torch.cuda.device_count() on a GPU machine: right on one node (2 ranks, "
               "2 GPUs), but on 2 nodes of 2 GPUs each rank asks for a world of 2 where the job has 4",
           edits=[("    rank, local_rank, world_size = distributed_env()  # Step 1\n",
                   "    rank, local_rank, world_size = distributed_env()  # Step 1\n"
                   "    if use_cuda:\n        world_size = torch.cuda.device_count()  # one rank per GPU\n")],
           expect={"Step 1": ("fail", r"on 2 simulated nodes of 2 ranks and 2 GPUs each .*: 4 processes were started, "
                                      r"but they asked init_process_group for world_size=2 \(one node's worth: "
                                      r"torch.cuda.device_count\(\) counts"),
                   "Step 4": ("pass", r"Fix Step 1 first")}),
    Faulty("world_size_from_local_world_size", options=SRUN_TORCHRUN,
           why="under torchrun the world size taken from LOCAL_WORLD_SIZE: the same as WORLD_SIZE on one node, but on "
               "2 nodes of 2 ranks each rank asks for a world of 2 where the job has 4",
           edits=[('int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])',
                   'int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])')],
           expect={"Step 1": ("fail", r"on 2 simulated nodes of 2 ranks each .*: 4 processes were started, but they "
                                      r"asked init_process_group for world_size=2 \(one node's worth: .*LOCAL_WORLD_SIZE")}),
    Faulty("rank_from_local_rank_torchrun", options=SRUN_TORCHRUN,
           why="under torchrun the rank taken from LOCAL_RANK: the same as RANK on one node, but on 2 nodes two ranks "
               "ask for each of ranks 0 and 1",
           edits=[('return int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])',
                   'return int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_RANK"])')],
           expect={"Step 1": ("fail", r"on 2 simulated nodes of 2 ranks each .*asked for ranks \[0, 1, 0, 1\]: each must "
                                      r"have its own rank 0..3")}),
    Faulty("init_method_localhost", options=NODES,
           why="init_process_group given tcp://localhost: one node only",
           edits=[(INIT, INIT + "                            init_method=f\"tcp://localhost:{os.environ['MASTER_PORT']}\",\n")],
           expect={"Step 1": ("fail", r"init_method='tcp://localhost:\d+'\) names its own address where the "
                                      r"launcher gave MASTER_ADDR=127.0.0.2.*look for rank 0 at localhost")}),
    # ---- Step 2: the gradients
    Faulty("no_ddp", why="the data is sharded but the model is never wrapped in DDP: nothing averages gradients",
           edits=[(DDP_WRAP + "  # Step 2: same start, averaged gradients\n", ""),
                  (SAVE, SAVE.replace("model.module.", "model."))],
           expect={"Step 2": ("fail", r"parameters differ between ranks.*DistributedDataParallel"), "Step 3": PASS}),
    Faulty("ddp_bypassed", why="the model is wrapped, but training calls the module inside the wrapper",
           edits=[("step_model = torch.compile(model) if args.compile else model",
                   "step_model = torch.compile(model.module) if args.compile else model.module")],
           expect={"Step 2": ("fail", r"parameters differ between ranks.*DistributedDataParallel was built but not "
                                      r"used: train through the wrapper.*Training calls the plain model \(or model.module\)")}),
    Faulty("no_sync_every_step", why="gradient accumulation gone wrong: every forward runs inside model.no_sync(), "
                                     "so no backward averages the gradients, though DDP is built and used",
           edits=[("        with autocast():\n            output = model(data)\n",
                   "        with model.no_sync(), autocast():  # accumulate\n            output = model(data)\n")],
           expect={"Step 2": ("fail", r"parameters differ between ranks.*(\d+) of rank \d's \1 training forward passes through "
                                      r"DistributedDataParallel ran inside `model.no_sync\(\)`"), "Step 3": PASS}),
    Faulty("ddp_built_not_used", why="Step 2 done before Step 3: DDP(model) is built, but not assigned, so training "
                                     "goes on with the plain model (and the identical data hides it)",
           edits=[(DDP_WRAP, DDP_WRAP.replace("    model = DDP(", "    DDP(")),
                  (SAVE, SAVE.replace("model.module.", "model.")),
                  (SAMPLER + "  # Step 3: rank r gets every world_size-th image\n", ""),
                  (TRAIN_KWARGS, '    train_kwargs = {"batch_size": args.batch_size, "shuffle": True}'),
                  (SET_EPOCH, "")],
           expect={"Step 2": ("fail", r"only because every rank trained on the same data.*built but not used: train "
                                      r"through the wrapper \(`model = DDP\(model\)`")}),
    Faulty("ddp_subgroup", options=NODES,
           why="DDP given a group of ranks [0, 1] (the two GPUs it was tried on): with 2 ranks that is everyone; with "
               "3, rank 2 is outside it and gets new_group's non-member marker, which DDP fails on",
           edits=[(DDP_WRAP, "    pair = dist.new_group(ranks=[0, 1])  # average over the two GPUs I tested on\n"
                             + DDP_WRAP.replace("None)", "None, process_group=pair)"))],
           expect={"Step 2": ("fail", r"with 3 ranks \(3 nodes of one rank each\), DDP averages the gradients over "
                                      r"ranks \[0, 1\] only: the process_group it was given; rank 2 got what new_group "
                                      r"returns on a rank outside the group.*\nDDP\(\.\.\.\) is at line "
                                      r"{line:process_group=pair}"),
                   "Step 6": ("fail", r"works with 2 ranks but not with 3 \(srun\): rank 2 crashed: TypeError: .* at "
                                      r"line {line:process_group=pair}")}),
    Faulty("ddp_whole_world_group", options=NODES,
           why="correct: DDP given a group made of every rank, which is what it uses without one",
           edits=[(DDP_WRAP, "    everyone = dist.new_group(ranks=list(range(world_size)))\n"
                             + DDP_WRAP.replace("None)", "None, process_group=everyone)"))],
           expect={f"Step {n}": PASS for n in range(1, 7)}),
    Faulty("all_reduce_sums", why="no DDP: the script all-reduces each gradient itself, but never divides by the "
                                  "world size (all_reduce sums), so the ranks agree while every step is W times "
                                  "too large",
           edits=[(DDP_WRAP + "  # Step 2: same start, averaged gradients\n", ""),
                  (SAVE, SAVE.replace("model.module.", "model.")),
                  (BACKWARD, BACKWARD + "        for p in model.parameters():  # share the gradients\n"
                                        "            dist.all_reduce(p.grad)\n")],
           expect={"Step 2": ("fail", r"identical on all 2 ranks, but the first step used the sum of the ranks' "
                                      r"gradients, not their mean: all_reduce sums by default.*Divide")}),
    Faulty("all_reduce_averages", why="correct: the same, divided by the world size",
           edits=[(DDP_WRAP + "  # Step 2: same start, averaged gradients\n", ""),
                  (SAVE, SAVE.replace("model.module.", "model.")),
                  (BACKWARD, BACKWARD + "        for p in model.parameters():  # average the gradients\n"
                                        "            dist.all_reduce(p.grad)\n"
                                        "            p.grad /= dist.get_world_size()\n")],
           expect={f"Step {n}": PASS for n in range(1, 7)}),
    # what the values cannot show: identical parameters, but traffic or a step size the checker measures
    Faulty("ddp_grads_reduced_again", why="DDP, and after backward the script all-reduces every gradient again and "
                                          "divides by the world size: the values are unchanged, the traffic doubled",
           edits=[(BACKWARD, BACKWARD + "        for p in model.parameters():  # average the gradients\n"
                                        "            dist.all_reduce(p.grad)\n"
                                        "            p.grad /= dist.get_world_size()\n")],
           expect={"Step 2": ("fail", r"DistributedDataParallel already averages every gradient inside backward, but "
                                      r"rank \d's own collectives in the training loop sent 1.0 times the model's "
                                      r"1,199,882 parameters per optimizer step \(all_reduce 1.0; the largest at line "
                                      r"{line:dist.all_reduce(p.grad)}.*values are unchanged, but about 2 times the "
                                      r"traffic.*Drop them"), "Step 3": PASS}),
    Faulty("ddp_grads_summed_again", why="the same without the division: DDP's average summed again, each step W "
                                         "times too large, while the ranks still agree",
           edits=[(BACKWARD, BACKWARD + "        for p in model.parameters():  # share the gradients\n"
                                        "            dist.all_reduce(p.grad)\n")],
           expect={"Step 2": ("fail", r"already averages every gradient.*all_reduce 1.0.*the first step used 2 times "
                                      r"the averaged gradient: the script summed DDP's average again")}),
    Faulty("ddp_params_broadcast_every_step", why="DDP, and the script broadcasts rank 0's parameters after every "
                                                  "step to keep the copies in step: they already are",
           edits=[("        scaler.update()\n", "        scaler.update()\n"
                                                "        for p in model.parameters():  # keep the copies in step\n"
                                                "            dist.broadcast(p.data, 0)\n")],
           expect={"Step 2": ("fail", r"already averages every gradient.*\(broadcast 1.0; the largest at line "
                                      r"{line:dist.broadcast(p.data, 0)}.*without any broadcast")}),
    Faulty("ddp_loss_gathered_for_log", why="correct: every step all_gathers the loss for the log line, a scalar per "
                                            "rank, not the model's worth: no traffic worth a verdict",
           edits=[("        total_loss += loss.item() * len(data)\n",
                   "        losses = [torch.zeros_like(loss) for _ in range(dist.get_world_size())]\n"
                   "        dist.all_gather(losses, loss.detach())  # every rank's loss, for the log\n"
                   "        total_loss += torch.stack(losses).mean().item() * len(data)\n")],
           expect={**{f"Step {n}": PASS for n in range(1, 7)}, "Step 2": ("pass", r"DDP averaged the gradients")}),
    Faulty("no_sync_own_average", why="correct, if roundabout: every forward inside model.no_sync(), and the script "
                                      "averages the gradients itself: one all_reduce of each, divided; the verdict "
                                      "says DDP averaged none",
           edits=[("        with autocast():\n            output = model(data)\n"
                   "            loss = F.nll_loss(output.float(), target)\n" + BACKWARD,
                   "        with model.no_sync():  # I average myself\n            with autocast():\n"
                   "                output = model(data)\n                loss = F.nll_loss(output.float(), target)\n"
                   "            scaler.scale(loss).backward()\n"
                   "        for p in model.parameters():\n            dist.all_reduce(p.grad)\n"
                   "            p.grad /= dist.get_world_size()\n")],
           expect={**{f"Step {n}": PASS for n in range(1, 7)},
                   "Step 2": ("pass", r"averaged with all_reduce \(DDP averaged none of them: every training forward "
                                      r"ran inside model.no_sync\(\)\)")}),
    Faulty("loss_divided_by_world_size", options=NODES,
           why="the loss divided by the world size \"because DDP sums\": DDP divides already, so each step is W times "
               "too small while the ranks agree; seen on 2 and 3 ranks",
           edits=[("            loss = F.nll_loss(output.float(), target)\n",
                   "            loss = F.nll_loss(output.float(), target) / dist.get_world_size()  # DDP sums\n")],
           expect={"Step 2": ("fail", r"every rank divided its loss by the world size before backward \(by 2, and by 3 "
                                      r"with 3 ranks\).*2 times too small.*Drop the division"), "Step 3": PASS}),
    Faulty("loss_halved", options=NODES,
           why="correct for DDP: the loss times a constant 0.5, which is 1/W with 2 ranks but not with 3",
           edits=[("            loss = F.nll_loss(output.float(), target)\n",
                   "            loss = 0.5 * F.nll_loss(output.float(), target)\n")],
           expect={f"Step {n}": PASS for n in range(1, 7)}),
    Faulty("own_average_and_broadcast", why="no DDP: the script averages each gradient with all_reduce (right), then "
                                            "also broadcasts the parameters after every step: twice the traffic",
           edits=[(DDP_WRAP + "  # Step 2: same start, averaged gradients\n", ""),
                  (SAVE, SAVE.replace("model.module.", "model.")),
                  (BACKWARD, BACKWARD + "        for p in model.parameters():  # average the gradients\n"
                                        "            dist.all_reduce(p.grad)\n"
                                        "            p.grad /= dist.get_world_size()\n"),
                  ("        scaler.update()\n", "        scaler.update()\n"
                                                "        for p in model.parameters():  # keep the copies in step\n"
                                                "            dist.broadcast(p.data, 0)\n")],
           expect={"Step 2": ("fail", r"the script averages the gradients itself, which takes one all_reduce of each "
                                      r"gradient per step, but rank \d's own collectives in the training loop sent 2.0 "
                                      r"times .*\((all_reduce 1.0, broadcast 1.0|broadcast 1.0, all_reduce 1.0)")}),
    Faulty("ddp_on_copy", options=GPUS,
           why="DDP wraps a copy of the model, the optimizer holds the original's parameters: the gradients land on "
               "the copy, nothing trains, and the ranks agree because nothing moves",
           edits=[("import argparse\n", "import argparse\nimport copy\n"),
                  (DDP_WRAP + "  # Step 2: same start, averaged gradients\n"
                   "    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)",
                   "    net = model  # keep the plain Net for saving\n"
                   "    model = DDP(copy.deepcopy(net), device_ids=[local_rank] if use_cuda else None)  # Step 2\n"
                   "    optimizer = optim.Adadelta(net.parameters(), lr=args.lr)")],
           # Step 4: a copy of a model on a (simulated) GPU is on that GPU too
           expect={"Step 2": ("fail", r"the optimizer steps \d+ parameters, but none of them is a parameter of the "
                                      r"model DistributedDataParallel wraps.*ever got a gradient.*nothing trains"),
                   "Step 4": PASS}),
    Faulty("loss_times_world_size", options=NODES,
           why="the loss multiplied by the world size \"to undo DDP's average\": the step follows the sum of the "
               "ranks' gradients, W times the global batch's; seen on 2 and 3 ranks",
           edits=[("            loss = F.nll_loss(output.float(), target)\n",
                   "            loss = F.nll_loss(output.float(), target) * dist.get_world_size()  # undo DDP's "
                   "average\n")],
           expect={"Step 2": ("fail", r"every rank multiplied its loss by the world size before backward \(by 2, and "
                                      r"by 3 with 3 ranks\).*2 times too large.*Drop the factor"), "Step 3": PASS}),
    Faulty("lr_scaled_twice", options=NODES,
           why="the linear scaling rule applied twice: the learning rate grows with W squared; seen on 2 and 3 ranks",
           edits=[(DEVICE, DEVICE.replace("    device =",
                                          "    args.lr *= world_size  # W times the batch\n    device =")),
                  ("    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)",
                   "    optimizer = optim.Adadelta(model.parameters(), lr=args.lr * world_size)")],
           expect={"Step 2": ("fail", r"the learning rate grows with the square of the world size: 4 with 2 ranks, 9 "
                                      r"with 3.*scaled by the world size twice")}),
    Faulty("loss_summed_for_log", why="the epoch's loss all-reduced for the log line, not divided: the sum of the "
                                      "ranks' losses is printed",
           edits=[(STOP, STOP + "        loss_t = torch.tensor([train_loss])\n"
                                "        dist.all_reduce(loss_t)  # the loss over all ranks, for the log\n"
                                "        train_loss = loss_t.item()\n")],
           expect={"Step 2": ("fail", r"rank 0 printed train_loss=\d+\.\d+, the result of its all_reduce of a scalar "
                                      r"\(\d+\.\d+ on rank 0, summed over the 2 ranks\).*Divide the reduced value"),
                   "Step 3": PASS}),
    Faulty("crash_rank1", why="rank 1 crashes in the second epoch",
           edits=[(START, START + "        if rank == 1 and epoch == 2:\n"
                                  '            raise RuntimeError("simulated failure on rank 1")\n')],
           expect={"Step 2": ("fail", r"rank 1 crashed: RuntimeError: simulated failure"),
                   # the steps the crash hid show the crash itself: rank, error, line
                   "Step 5": ("fail", r"not checked: the run stopped before this step could be seen: rank 1 crashed: "
                                      r"RuntimeError: simulated failure on rank 1 at line {line:simulated failure}"),
                   "Step 6": ("fail", r"did not run to the end under srun \(Step 2\): rank 1 crashed: RuntimeError: "
                                      r"simulated failure on rank 1 at line {line:simulated failure}")}),
    Faulty("hang_allreduce_rank0", options={"stall": 10.0},
           why="rank 0 alone averages the epoch's loss for its log line: a collective on one rank",
           edits=[(STOP, STOP + "        if rank == 0:  # the mean loss over all ranks, for the log\n"
                                "            loss_sum = torch.tensor([train_loss])\n"
                                "            dist.all_reduce(loss_sum)\n"
                                "            train_loss = loss_sum.item() / world_size\n")],
           # every rank waits in a collective: reported after a few seconds (a one-digit wait), not at the stall
           expect={"Step 2": ("fail", r"deadlock: rank 0 waited \d s at line {line:dist.all_reduce(loss_sum)}: "
                                      r"dist.all_reduce\(loss_sum\) \(in torch's all_reduce\); rank 1 waited \d s at "
                                      r"line \d+: dist.barrier\(\)")}),
    # ---- Step 3: the data
    Faulty("no_sampler", why="DDP but no DistributedSampler: every rank trains on the whole data set",
           edits=[(SAMPLER + "  # Step 3: rank r gets every world_size-th image\n", ""),
                  (TRAIN_KWARGS, '    train_kwargs = {"batch_size": args.batch_size, "shuffle": True}'),
                  (SET_EPOCH, "")],
           expect={"Step 2": PASS, "Step 3": ("fail", r"every rank trained on all \d+ images")}),
    Faulty("no_set_epoch", why="the sampler is never told the epoch, so every epoch repeats the same order",
           edits=[(SET_EPOCH, "")],
           expect={"Step 3": ("fail", r"same order.*set_epoch")}),
    Faulty("same_shard", why="the sampler is told rank 0 on every rank, so all ranks train on the same shard",
           edits=[(SAMPLER, "    train_sampler = DistributedSampler(train_set, num_replicas=world_size, rank=0, "
                            "seed=args.seed)")],
           expect={"Step 3": ("fail", r"overlap in \d+ images")}),
    Faulty("sampler_per_node", options=NODES,
           why="the sampler is given the node's numbers (ranks per node, local rank): right on one node only",
           edits=[(SAMPLER, "    per_node = world_size // int(os.environ.get(\"SLURM_NNODES\", 1))\n"
                            "    train_sampler = DistributedSampler(train_set, num_replicas=per_node, rank=local_rank, "
                            "seed=args.seed)")],
           expect={"Step 3": ("fail", r"with 3 ranks: every rank trained on all \d+ images in epoch 1: every rank's "
                                      r"DistributedSampler was built with num_replicas=1 and rank=0\. Give it the "
                                      r"job's world size \(3\) and each rank's global rank, not its node's")}),
    Faulty("sampler_seed_per_rank", why="each rank's sampler gets its own seed: they shuffle different permutations",
           edits=[(SAMPLER, "    train_sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, "
                            "seed=args.seed + rank)")],
           expect={"Step 3": ("fail", r"overlap in \d+ images in epoch 1 .*the DistributedSamplers have the right "
                                      r"num_replicas and rank but different seeds \(\[\d+, \d+\]\)")}),
    Faulty("shuffle_and_sampler", why="shuffle=True and a DistributedSampler: the sampler shuffles already",
           edits=[(TRAIN_KWARGS, TRAIN_KWARGS[:-1] + ', "shuffle": True}')],
           expect={"Step 3": ("fail", r"shuffle=True together with sampler")}),
    Faulty("set_epoch_rank0_only", why="only rank 0 calls set_epoch: the ranks shuffle with different epochs, and "
                                       "their shares overlap",
           edits=[(SET_EPOCH, "        if rank == 0:  # rank 0 drives the shuffle\n    " + SET_EPOCH)],
           expect={"Step 3": ("fail", r"overlap in \d+ images in epoch 1 .*: rank 1 never called set_epoch \(rank 0 "
                                      r"called it with \[1, 2\]\).*on every rank")}),
    Faulty("test_loader_sharded",
           why="the test loader given a DistributedSampler while test() divides by the whole test set: each rank "
               "prints a fraction of its accuracy",
           edits=[("    test_loader = torch.utils.data.DataLoader(test_set, **test_kwargs, **loader_kwargs)",
                   "    test_sampler = DistributedSampler(test_set, shuffle=False)  # each rank tests its share\n"
                   "    test_loader = torch.utils.data.DataLoader(test_set, **test_kwargs, sampler=test_sampler, "
                   "**loader_kwargs)")],
           expect={"Step 2": PASS, "Step 3": ("fail", r"different shares of the \d+ test images \(\d+\+\d+, a "
                                                      r"DistributedSampler on the test DataLoader\), and no rank "
                                                      r"combined the results")}),
    Faulty("sampler_per_epoch", options=NODES,
           why="correct: a new DistributedSampler and DataLoader each epoch, seeded with the epoch (no set_epoch): "
               "the epochs of loaders built on one data set count together",
           edits=[(SAMPLER + "  # Step 3: rank r gets every world_size-th image\n", ""),
                  (TRAIN_KWARGS + "  # Step 3: the sampler shuffles\n", ""),
                  ("    train_loader = torch.utils.data.DataLoader(train_set, **train_kwargs, **loader_kwargs)\n", ""),
                  (SET_EPOCH, "        train_sampler = DistributedSampler(train_set, seed=args.seed + epoch)  # a new "
                              "order each epoch\n"
                              "        train_loader = torch.utils.data.DataLoader(\n"
                              "            train_set, batch_size=args.batch_size, sampler=train_sampler, "
                              "**loader_kwargs)\n")],
           expect={f"Step {n}": PASS for n in range(1, 7)}),
    Faulty("static_shard", why="correct: each rank's fixed Subset(range(rank, N, W)), reshuffled by its loader: the "
                               "shards are judged by the images they hold, not by positions in the Subset",
           edits=[(SAMPLER + "  # Step 3: rank r gets every world_size-th image\n",
                   "    shard = torch.utils.data.Subset(train_set, range(rank, len(train_set), world_size))  # mine\n"),
                  (TRAIN_KWARGS, '    train_kwargs = {"batch_size": args.batch_size, "shuffle": True}'),
                  ("DataLoader(train_set, **train_kwargs", "DataLoader(shard, **train_kwargs"),
                  (SET_EPOCH, ""),
                  ("total = seen if args.dry_run else len(train_loader.dataset)",
                   "total = seen if args.dry_run else len(train_set)")],
           expect={**{f"Step {n}": PASS for n in range(1, 7)},
                   "Step 3": ("pass", r"disjoint shards \(64\+64\) covering all 128 images")}),
    # ---- Step 4: the device
    Faulty("cuda_unguarded", options=CPU_ONLY, why="torch.cuda.set_device without asking whether there is a GPU",
           edits=[(SET_DEVICE, "    torch.cuda.set_device(local_rank)  # Step 1: set this rank's GPU before init\n")],
           expect={"Step 4": ("fail", r"rank \d crashed")}),
    Faulty("device_ids_on_cpu", options=CPU_ONLY, why="device_ids given to DDP even without GPUs",
           edits=[(DDP_WRAP, "    model = DDP(model, device_ids=[local_rank])")],
           expect={"Step 4": ("fail", r"rank \d crashed: ValueError: DistributedDataParallel device_ids.*and module "
                                      r"parameters \{device\(type='cpu'\)\}\..*\ndevice_ids names the one GPU the model "
                                      r"already sits on.*a model on the CPU takes none"),
                   # Step 2 wraps the model: the crash hid it, and its row says what to do too (issue 53 item 4)
                   "Step 2": ("fail", r"not checked: .*rank \d crashed: ValueError: DistributedDataParallel device_ids"
                                      r".*\ndevice_ids names the one GPU the model already sits on")}),
    Faulty("no_local_rank", options=CPU_ONLY,
           why="the device comes from the global rank, the local rank is never read: on one node that works; "
               "on two nodes rank 4 asks for cuda:4 on a 4-GPU node",
           edits=[('int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]),', 'int(os.environ["RANK"]),'),
                  ('int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_LOCALID"]),',
                   'int(os.environ["SLURM_PROCID"]),'),
                  ("    rank, local_rank, world_size = distributed_env()  # Step 1\n",
                   "    rank, world_size = distributed_env()  # Step 1\n    local_rank = rank\n")],
           expect={"Step 4": ("fail", r"never reads the local rank")}),
    Faulty("device_from_global_rank", options=GPUS,
           why="set_device(rank) and cuda:RANK: right on one node, on the second node rank 2 asks for cuda:2",
           edits=[(SET_DEVICE, SET_DEVICE.replace("set_device(local_rank)", "set_device(rank)")),
                  ('torch.device("cuda", local_rank) if use_cuda', 'torch.device("cuda", rank) if use_cuda'),
                  (DEVICE, DEVICE.replace("{local_rank}", "{rank}")),
                  (DDP_WRAP, DDP_WRAP.replace("[local_rank]", "[rank]"))],
           expect={"Step 1": PASS, "Step 2": PASS, "Step 3": PASS, "Step 5": PASS,
                   "Step 4": ("fail", r"2 simulated nodes of 2 ranks and 2 GPUs each \(ranks 0-1 on node 0, 2-3 on node 1\), "
                                      r"rank 2 \(local rank 0 on node 1\) asked "
                                      r"for cuda:2 \(set_device\).*right on one node and wrong on every other: use "
                                      r"the local rank")}),
    Faulty("device_cuda_no_index", options=GPUS,
           why="the model goes to 'cuda' (the current device, cuda:0) on every rank, and set_device is never called",
           edits=[(SET_DEVICE, ""), (DEVICE, '    device = torch.device("cuda" if use_cuda else "cpu")')],
           expect={"Step 4": ("fail", r"rank 1 \(local rank 1 on node 0\) put its model on cuda:0; ranks 0, 1 "
                                      r"share it on node 0: each rank of a node needs its own GPU")}),
    Faulty("visible_devices_and_local_rank", options=GPUS,
           why="each rank narrows CUDA_VISIBLE_DEVICES to its local rank, then still asks for cuda:<local rank>",
           edits=[(SET_DEVICE, '    os.environ["CUDA_VISIBLE_DEVICES"] = str(local_rank)  # one GPU per rank\n'
                               + SET_DEVICE)],
           expect={"Step 4": ("fail", r"rank 1 \(local rank 1 on node 0\) set CUDA_VISIBLE_DEVICES=1 \(line "
                                      r"{line:# one GPU per rank}\), so it sees only those GPUs.*asked "
                                      r"for cuda:1 \(set_device\)")}),
    Faulty("ddp_before_to_device", options={**GPUS, **CPU_ONLY},
           why="DDP(model, device_ids=[local_rank]) before model.to(device): on CPU no device_ids are given and all "
               "runs pass, but with GPUs DDP refuses a model still on the CPU",
           edits=[("    model = Net().to(device)\n", "    model = Net()\n"),
                  (DDP_WRAP + "  # Step 2: same start, averaged gradients\n",
                   DDP_WRAP + "  # Step 2: same start, averaged gradients\n    model = model.to(device)\n")],
           expect={"Step 4": ("fail", r"on 2 simulated nodes .* rank 0 \(local rank 0 on node 0\) gave "
                                      r"DistributedDataParallel device_ids=\[0\] while its model was still on the "
                                      r"CPU: with GPUs, DDP raises ValueError"),
                   "Step 2": PASS}),
    Faulty("device_ordinal_from_global_rank", options={**GPUS, **CPU_ONLY},
           why="model.to(rank): an int is a CUDA ordinal, the global rank's; right on one node, cuda:2 on the second",
           edits=[("    model = Net().to(device)\n", "    model = Net().to(rank if use_cuda else device)\n")],
           expect={"Step 4": ("fail", r"rank 2 \(local rank 0 on node 1\) asked for cuda:2 \(model.to\), which its "
                                      r"node does not have")}),
    Faulty("device_ordinal_local_rank", options={**GPUS, **CPU_ONLY},
           why="correct: model.to(local_rank), the ordinal of this rank's GPU on its node",
           edits=[("    model = Net().to(device)\n", "    model = Net().to(local_rank if use_cuda else device)\n")],
           expect={f"Step {n}": PASS for n in range(1, 7)}),
    Faulty("cuda_call_not_simulated", options=GPUS,
           why="correct, but it asks CUDA for the GPU's name, which the simulated GPUs cannot answer: Step 4 keeps "
               "what the CPU runs show and says why the simulation stopped",
           edits=[(SET_DEVICE, SET_DEVICE + "        print(torch.cuda.get_device_name(local_rank))\n")],
           expect={**{f"Step {n}": PASS for n in range(1, 4)}, "Step 5": PASS, "Step 6": PASS,
                   "Step 4": ("pass", r"reads the local rank.*\(The launch on 2 simulated nodes of 2 GPUs could not "
                                      r"follow the script to its model: rank \d "
                                      r"crashed: .* at line {line:get_device_name}")}),
    # ---- Step 5: the checkpoint
    Faulty("save_every_rank", why="every rank writes the checkpoint",
           edits=[("    if args.save_model and rank == 0:", "    if args.save_model:")],
           expect={"Step 5": ("fail", r"ranks \[0, 1\] all wrote mnist_cnn.pt")}),
    Faulty("checkpoint_per_local_rank", why="every rank saves its own copy, named by its local rank",
           edits=[("    if args.save_model and rank == 0:", "    if args.save_model:"),
                  (SAVE, SAVE.replace('"mnist_cnn.pt"', 'f"mnist_cnn_{local_rank}.pt"'))],
           expect={"Step 5": ("fail", r"ranks \[0, 1\] each wrote a checkpoint \(mnist_cnn_0.pt, mnist_cnn_1.pt\).*"
                                      r"Save once, on rank 0")}),
    Faulty("save_module_prefix", why='rank 0 saves the DDP wrapper\'s state_dict, whose keys start with "module."',
           edits=[(SAVE, SAVE.replace("model.module.", "model."))],
           expect={"Step 5": ("fail", r"start with 'module\.'")}),
    Faulty("save_whole_model", why="rank 0 pickles the whole model object instead of its state_dict",
           edits=[(SAVE, SAVE.replace("model.module.state_dict()", "model.module"))],
           expect={"Step 5": ("fail", r"does not load as a state_dict")}),
    Faulty("hang_barrier_rank0", options={"stall": 10.0},
           why="a barrier that only rank 0 calls, before saving: it waits for ranks that never come",
           edits=[(SAVE, "        dist.barrier()  # wait until the others are done (but only rank 0 comes here)\n"
                         + SAVE)],
           expect={"Step 2": PASS, "Step 5": ("fail", r"rank 0 .*barrier.*every rank")}),
    Faulty("new_group_on_rank0_only", options={"stall": 10.0},
           why="a group for the writer made on rank 0 alone: every rank must call new_group (PyTorch's docs), so "
               "the group the ranks make next together is not the same group on both, and its all_reduce waits",
           edits=[("    if args.save_model and rank == 0:",
                   "    if rank == 0:  # a group of rank 0 alone, for the writer\n"
                   "        writers = dist.new_group([0])\n"
                   "    everyone = dist.new_group(list(range(world_size)))  # to average the last test accuracy\n"
                   "    mean_acc = torch.tensor([float(test_acc)])\n"
                   "    dist.all_reduce(mean_acc, group=everyone)\n"
                   "    if args.save_model and rank == 0:")],
           expect={"Step 2": PASS, "Step 5": ("fail", r"deadlock: rank 0 waited \d+ s at line {line:everyone = }.*"
                                                      r"dist\.new_group is one of them: every rank of the job must "
                                                      r"call it, also a rank that is not in the new group.*"
                                                      r"Calls of new_group by rank: \[2, 1\]")}),
    Faulty("save_on_local_rank_0", options=NODES,
           why="local_rank == 0 where the global rank 0 was meant: one writer per node",
           edits=[("    if args.save_model and rank == 0:", "    if args.save_model and local_rank == 0:")],
           expect={"Step 1": PASS, "Step 3": PASS,
                   "Step 5": ("fail", r"on one node only rank 0 wrote mnist_cnn.pt, but on 3 nodes of one rank each "
                                      r"ranks 0 \(local rank 0 on node 0\), 1 \(local rank 0 on node 1\), 2 \(local "
                                      r"rank 0 on node 2\) all wrote it.*global rank is 0")}),
    Faulty("log_named_by_local_rank", options=NODES,
           why="each rank appends to a log file named by its local rank: on two nodes they share one file",
           edits=[(EPOCH_LINE, EPOCH_LINE + '        with open(f"train_log_{local_rank}.txt", "a") as log:\n'
                                            '            log.write(f"{epoch} {train_loss:.4f}\\n")\n')],
           expect={"Step 5": ("fail", r"ranks 0 \(local rank 0 on node 0\), 1 .* all wrote train_log_0.txt: a name "
                                      r"built from the local rank repeats on every node")}),
    # ---- Step 6: launchers and shutdown
    Faulty("barrier_every_step", why="a dist.barrier() after every optimizer step \"to keep the ranks in step\": "
                                     "DDP's all-reduce does that; barriers only to time",
           edits=[("        scaler.update()\n",
                   "        scaler.update()\n        dist.barrier()  # keep the ranks in step\n")],
           expect={"Step 2": PASS, "Step 6": ("fail", r"rank \d called dist.barrier\(\) \d+ times inside its training "
                                                      r"loop, at each of its \d+ optimizer steps \(the first at line "
                                                      r"{line:keep the ranks in step}.*drop this one")}),
    Faulty("destroy_twice", why="it leaves the process group twice: the second call finds no group and raises",
           edits=[("    dist.destroy_process_group()\n",
                   "    dist.destroy_process_group()\n    dist.destroy_process_group()\n")],
           expect={"Step 5": PASS,
                   "Step 6": ("fail", r"did not run to the end under srun: rank \d crashed: "
                                      r"AssertionError: Process group cannot be None at line \d+ of .*: "
                                      r"dist.destroy_process_group\(\)")}),
    Faulty("no_destroy", why="it never leaves the process group",
           edits=[("    del model, step_model\n    gc.collect()\n    dist.destroy_process_group()\n", "")],
           expect={"Step 6": ("fail", r"never called dist.destroy_process_group")}),
    Faulty("second_name_kept", why="`del model` before leaving, but the serial script's `step_model` still holds "
                                   "the DDP model",
           edits=[("    del model, step_model\n", "    del model\n")],
           expect={**{f"Step {n}": PASS for n in range(1, 6)},
                   "Step 6": ("pass", r"still alive at destroy_process_group\(\), held by `step_model` \(a local of "
                                      r"main\(\)\).*`del step_model`")}),
    # a script for one launcher passes Step 6 under the launcher it reads; strict_launchers requires both
    Faulty("srun_only", file="srun_only.py", options={**BOTH, **GPUS},
           why="a functional script with other names that reads only srun's SLURM_* variables (the ENCCS slides' "
               "srun script): it passes, and the verdict says how to support torchrun",
           expect={**{f"Step {n}": PASS for n in range(1, 6)},
                   "Step 6": ("pass", r"works under srun only \(the launcher the script reads\).*"
                                      r"Under torchrun: .*SLURM_PROCID.*To run under torchrun too")}),
    Faulty("srun_only_strict", file="srun_only.py", options={**BOTH, "strict_launchers": True},
           why="the same srun script, where the instructor requires both launchers",
           expect={"Step 1": PASS, "Step 6": ("fail", r"works under srun only.*under torchrun.*SLURM_PROCID.*"
                                                      r"--strict-launchers")}),
    Faulty("trainer_torchrun_only", file="trainer_torchrun_only.py", options=SRUN_TORCHRUN,
           why="a Trainer class that reads only torchrun's variables (init from env://): under srun init fails, "
               "but it is a torchrun script, so it passes",
           expect={**{f"Step {n}": PASS for n in range(1, 6)},
                   "Step 6": ("pass", r"works under torchrun only \(the launcher the script reads\), and under "
                                      r"`srun torchrun`.*Under srun: .*To run under srun too")}),
    Faulty("trainer_torchrun_only_strict", file="trainer_torchrun_only.py",
           options={**BOTH, "strict_launchers": True},
           why="the same torchrun script, where the instructor requires both launchers",
           expect={"Step 1": PASS, "Step 5": PASS, "Step 6": ("fail", r"works under torchrun only.*under srun")}),
    Faulty("torchrun_branch_broken", options=BOTH,
           why="the script reads both launchers' variables, but its torchrun branch has a typo: it means to "
               "support torchrun and fails there, even when one launcher is enough",
           edits=[('int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])',
                   'int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SZIE"])')],
           expect={"Step 1": PASS, "Step 6": ("fail", r"works under srun only; under torchrun: .*KeyError.*"
                                                      r"reads LOCAL_RANK, (LOCAL_WORLD_SIZE, )?RANK, so it means to run under torchrun")}),
    Faulty("trainer_class_correct", file="trainer_class_correct.py", options={**SRUN_TORCHRUN, **NODES},
           why="correct, in another style: a Trainer class, other names, the same six steps",
           expect={f"Step {n}": PASS for n in range(1, 7)}),
    Faulty("trainer_class_correct_strict", file="trainer_class_correct.py",
           options={**BOTH, "strict_launchers": True},
           why="the same correct script for both launchers, where the instructor requires both",
           expect={f"Step {n}": PASS for n in range(1, 7)}),
]
