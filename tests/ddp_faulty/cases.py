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

DEFAULT = {"styles": ("srun",), "more_ranks": None, "timeout": 120.0}   # one srun-style launch of 2 ranks
BOTH = {"styles": ("srun", "torchrun")}
PASS = ("pass", "")
CPU_ONLY = {"cpu_only": True}

SET_DEVICE = ("    if use_cuda:  # Step 1: set this rank's GPU before init, so that NCCL uses it and no other\n"
              "        torch.cuda.set_device(local_rank)\n")
DDP_WRAP = "    model = DDP(model, device_ids=[local_rank] if use_cuda else None)"
SAVE = '        torch.save(model.module.state_dict(), "mnist_cnn.pt")'
SAMPLER = "    train_sampler = DistributedSampler(train_set, seed=args.seed)"
TRAIN_KWARGS = '    train_kwargs = {"batch_size": args.batch_size, "sampler": train_sampler}'
SET_EPOCH = ("        train_sampler.set_epoch(epoch)  # Step 3: reshuffle; without it every epoch repeats "
             "the same order\n")
START = "        start = time.perf_counter()\n"
STOP = "        epoch_s = time.perf_counter() - start\n"

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
    # ---- Step 2: the gradients
    Faulty("no_ddp", why="the data is sharded but the model is never wrapped in DDP: nothing averages gradients",
           edits=[(DDP_WRAP + "  # Step 2: same start, averaged gradients\n", ""),
                  (SAVE, SAVE.replace("model.module.", "model."))],
           expect={"Step 2": ("fail", r"parameters differ between ranks.*DistributedDataParallel"), "Step 3": PASS}),
    Faulty("ddp_bypassed", why="the model is wrapped, but training calls the module inside the wrapper",
           edits=[("step_model = torch.compile(model) if args.compile else model",
                   "step_model = torch.compile(model.module) if args.compile else model.module")],
           expect={"Step 2": ("fail", r"training calls the model inside it")}),
    Faulty("crash_rank1", why="rank 1 crashes in the second epoch",
           edits=[(START, START + "        if rank == 1 and epoch == 2:\n"
                                  '            raise RuntimeError("simulated failure on rank 1")\n')],
           expect={"Step 2": ("fail", r"rank 1 crashed: RuntimeError: simulated failure")}),
    Faulty("hang_allreduce_rank0", options={"stall": 10.0},
           why="rank 0 alone averages the epoch's loss for its log line: a collective on one rank",
           edits=[(STOP, STOP + "        if rank == 0:  # the mean loss over all ranks, for the log\n"
                                "            loss_sum = torch.tensor([train_loss])\n"
                                "            dist.all_reduce(loss_sum)\n"
                                "            train_loss = loss_sum.item() / world_size\n")],
           expect={"Step 2": ("fail", r"(deadlock|every rank).*line {line:dist.all_reduce(loss_sum)}: "
                                      r"dist.all_reduce\(loss_sum\)")}),
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
    Faulty("shuffle_and_sampler", why="shuffle=True and a DistributedSampler: the sampler shuffles already",
           edits=[(TRAIN_KWARGS, TRAIN_KWARGS[:-1] + ', "shuffle": True}')],
           expect={"Step 3": ("fail", r"shuffle=True together with sampler")}),
    # ---- Step 4: the device
    Faulty("cuda_unguarded", options=CPU_ONLY, why="torch.cuda.set_device without asking whether there is a GPU",
           edits=[(SET_DEVICE, "    torch.cuda.set_device(local_rank)  # Step 1: set this rank's GPU before init\n")],
           expect={"Step 4": ("fail", r"rank \d crashed")}),
    Faulty("device_ids_on_cpu", options=CPU_ONLY, why="device_ids given to DDP even without GPUs",
           edits=[(DDP_WRAP, "    model = DDP(model, device_ids=[local_rank])")],
           expect={"Step 4": ("fail", r"rank \d crashed: ValueError: DistributedDataParallel device_ids")}),
    Faulty("no_local_rank", options=CPU_ONLY,
           why="the device comes from the global rank, the local rank is never read: on one node that works; "
               "on two nodes rank 4 asks for cuda:4 on a 4-GPU node",
           edits=[('int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]),', 'int(os.environ["RANK"]),'),
                  ('int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_LOCALID"]),',
                   'int(os.environ["SLURM_PROCID"]),'),
                  ("    return 0, 0, 1\n", "    return 0, 1\n"),
                  ("    rank, local_rank, world_size = distributed_env()  # Step 1\n",
                   "    rank, world_size = distributed_env()  # Step 1\n    local_rank = rank\n")],
           expect={"Step 4": ("fail", r"never reads the local rank")}),
    # ---- Step 5: the checkpoint
    Faulty("save_every_rank", why="every rank writes the checkpoint",
           edits=[("    if args.save_model and rank == 0:", "    if args.save_model:")],
           expect={"Step 5": ("fail", r"ranks \[0, 1\] all wrote mnist_cnn.pt")}),
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
    # ---- Step 6: launchers and shutdown
    Faulty("no_destroy", why="it never leaves the process group",
           edits=[("    del model, step_model\n    gc.collect()\n    dist.destroy_process_group()\n", "")],
           expect={"Step 6": ("fail", r"never called dist.destroy_process_group")}),
    # a script for one launcher passes Step 6 under the launcher it reads; strict_launchers requires both
    Faulty("srun_only", file="srun_only.py", options=BOTH,
           why="a functional script with other names that reads only srun's SLURM_* variables (the ENCCS slides' "
               "srun script): it passes, and the verdict says how to support torchrun",
           expect={**{f"Step {n}": PASS for n in range(1, 6)}, "Step 6": ("pass", r"works under srun only \(the launcher the script reads\).*"
                                                      r"Under torchrun: .*SLURM_PROCID.*To run under torchrun too")}),
    Faulty("srun_only_strict", file="srun_only.py", options={**BOTH, "strict_launchers": True},
           why="the same srun script, where the instructor requires both launchers",
           expect={"Step 1": PASS, "Step 6": ("fail", r"works under srun only.*under torchrun.*SLURM_PROCID.*"
                                                      r"--strict-launchers")}),
    Faulty("trainer_torchrun_only", file="trainer_torchrun_only.py", options=BOTH,
           why="a Trainer class that reads only torchrun's variables (init from env://): under srun init fails, "
               "but it is a torchrun script, so it passes",
           expect={**{f"Step {n}": PASS for n in range(1, 6)},
                   "Step 6": ("pass", r"works under torchrun only.*Under srun: .*To run under srun too")}),
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
                                                      r"reads LOCAL_RANK, RANK, so it means to run under torchrun")}),
    Faulty("trainer_class_correct", file="trainer_class_correct.py", options={**BOTH, "more_ranks": 3},
           why="correct, in another style: a Trainer class, other names, the same six steps",
           expect={f"Step {n}": PASS for n in range(1, 7)}),
    Faulty("trainer_class_correct_strict", file="trainer_class_correct.py",
           options={**BOTH, "strict_launchers": True},
           why="the same correct script for both launchers, where the instructor requires both",
           expect={f"Step {n}": PASS for n in range(1, 7)}),
]
