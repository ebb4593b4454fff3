"""MNIST training with DistributedDataParallel: the serial script plus the six steps of notebook 02.

### BEGIN SOLUTION
# STUB: Your exercise: turn this serial script into DistributedDataParallel in six steps.
# STUB:
# STUB: As it is, this is the serial script (solutions/01_serial/mnist_classify.py) with a TODO where each
# STUB: step goes. It runs; under srun or torchrun every rank trains its own model on all the data, alone.
# STUB: From Step 1 on it needs a launcher: a rank learns who it is from the variables torchrun or srun set,
# STUB: so plain `python mnist_classify_ddp.py` stops there (KeyError: 'RANK'). Run it with torchrun (see below)
# STUB: or let the check start it.
# STUB: Notebook 02 explains each step; after each one, check your work:
# STUB:
# STUB:     course check ddp exercises/02_ddp/mnist_classify_ddp.py
# STUB:
# STUB: The steps: 1 join the process group, 2 wrap the model, 3 shard the data, 4 use this rank's device,
# STUB: 5 save once, 6 launch it (srun or torchrun), time it and shut down cleanly.
Every change from the serial script (solutions/01_serial/mnist_classify.py) is marked ``# Step N``:
  1. join the process group: rank, local rank and world size from srun or torchrun; nccl on GPUs, else gloo
  2. wrap the model in DistributedDataParallel: backward averages the gradients over all ranks
  3. a DistributedSampler gives each rank its own shard of the data, reshuffled each epoch (set_epoch)
  4. the model and the inputs go to this rank's own device, cuda:LOCAL_RANK
  5. rank 0 alone saves the checkpoint, without DDP's ``module.`` prefix
  6. launch it with srun or torchrun, time it across ranks, leave the process group cleanly
### END SOLUTION

Adapted from pytorch/examples (mnist/main.py). Same command line, plus --dataset, --data-dir,
--num-workers, --amp and --compile. After each epoch each rank prints one line a program can parse
(images_per_s: the whole training set per second; images_per_s_rank: this rank's share per second):

  epoch=1 train_loss=0.2981 test_loss=0.0712 test_acc=0.9781 images_per_s=4214.3 images_per_s_rank=2107.1 epoch_s=13.95

Run it:  torchrun --standalone --nproc_per_node 2 mnist_classify_ddp.py --dataset digits --epochs 1
or, in a Slurm job that exports MASTER_ADDR and MASTER_PORT:  srun python mnist_classify_ddp.py ...
Copied to a machine without the course (no course_lib), it trains on torchvision's MNIST.
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
### BEGIN SOLUTION
# STUB: # TODO: import what the six steps need
import gc  # Step 6: to drop the DDP model before leaving the process group
import torch.distributed as dist  # Step 1: the process group and its collectives
from torch.nn.parallel import DistributedDataParallel as DDP  # Step 2: the wrapper that averages gradients
from torch.utils.data.distributed import DistributedSampler  # Step 3: one shard of the data per rank
### END SOLUTION

try:  # the course's data sets, model and epoch lines
    from course_lib.data import DATASETS, DataError, load_dataset
    from course_lib.metrics import format_epoch_line
    from course_lib.model import Net
except ModuleNotFoundError as missing:  # copied somewhere without the course: torchvision's MNIST, the same
    if missing.name != "course_lib":  # model and epoch lines (an error inside course_lib is not hidden)
        raise
    try:
        from torchvision import datasets, transforms
    except ModuleNotFoundError:
        sys.exit("no course_lib and no torchvision here: install the course (pip install -e COURSE_FOLDER) "
                 "or torchvision (pip install torchvision) to load MNIST")
    DATASETS, DataError = ("auto", "mnist"), RuntimeError

    def load_dataset(name, data_dir):  # torchvision downloads MNIST once (run it on one rank first)
        root = data_dir or os.environ.get("COURSE_DATA_DIR") or os.path.expanduser("~/.cache/multigpu-course/data")
        tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
        sets = [datasets.MNIST(root, train=train, download=True, transform=tf) for train in (True, False)]
        for s in sets:
            s.name = "mnist"
        return sets

    def format_epoch_line(**values):  # course_lib.metrics: `epoch=1 train_loss=0.2981 ...`
        return " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())

    class Net(torch.nn.Module):  # course_lib.model: the classic MNIST CNN, the same parameter names
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = torch.nn.Conv2d(1, 32, 3, 1), torch.nn.Conv2d(32, 64, 3, 1)
            self.dropout1, self.dropout2 = torch.nn.Dropout(0.25), torch.nn.Dropout(0.5)
            self.fc1, self.fc2 = torch.nn.Linear(9216, 128), torch.nn.Linear(128, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
            x = self.dropout2(F.relu(self.fc1(torch.flatten(self.dropout1(x), 1))))
            return F.log_softmax(self.fc2(x), dim=1)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="PyTorch MNIST example (serial)")
    p.add_argument("--batch-size", type=int, default=64, help="input batch size for training (default: 64)")
    p.add_argument("--test-batch-size", type=int, default=1000, help="input batch size for testing (default: 1000)")
    p.add_argument("--epochs", type=int, default=14, help="number of epochs to train (default: 14)")
    p.add_argument("--lr", type=float, default=1.0, help="learning rate (default: 1.0)")
    p.add_argument("--gamma", type=float, default=0.7, help="learning rate step gamma (default: 0.7)")
    p.add_argument("--seed", type=int, default=1, help="random seed (default: 1)")
    p.add_argument("--log-interval", type=int, default=10, help="batches between training log lines")
    p.add_argument("--save-model", action="store_true", help="write mnist_cnn.pt in the working directory")
    p.add_argument("--dry-run", action="store_true", help="one batch per epoch, to check that it runs")
    p.add_argument("--data-dir", default=None, help="where MNIST/raw/ lives (default: $COURSE_DATA_DIR)")
    p.add_argument("--dataset", choices=DATASETS, default="auto", help="auto: MNIST if present, else digits")
    ### BEGIN SOLUTION
    # STUB: # TODO Step 6: under torchrun one Slurm task holds every rank of the node: are these workers per rank?
    # STUB: p.add_argument("--num-workers", type=int, default=int(os.environ.get("SLURM_CPUS_PER_TASK", 0)),
    # STUB:                help="data-loader worker processes (default: $SLURM_CPUS_PER_TASK, else 0)")
    # Step 6: the CPUs of this rank. srun makes each rank a task with $SLURM_CPUS_PER_TASK of its own; torchrun's
    # ranks share the one task that runs torchrun on their node (LOCAL_WORLD_SIZE ranks): divide them up
    cpus = int(os.environ.get("SLURM_CPUS_PER_TASK", 0)) // int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    p.add_argument("--num-workers", type=int, default=cpus,  # Step 6: data-loader workers per rank
                   help="data-loader workers per rank (default: the CPUs Slurm gave this rank, else 0)")
    ### END SOLUTION
    p.add_argument("--amp", choices=["off", "bf16", "fp16"], default="off", help="mixed precision autocast")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    return p.parse_args(argv)


def sync(device):
    # CUDA runs asynchronously: wait for the GPU before reading the clock, or the time is a lie.
    if device.type == "cuda":
        torch.cuda.synchronize(device)


### BEGIN SOLUTION
# STUB: # TODO Step 1: find out who this process is: its rank, its local rank (on this node) and the world size.
# STUB: # srun and torchrun each tell a process in their own environment variables; support both, torchrun's
# STUB: # first: under `srun torchrun` (a Slurm task that runs torchrun) a rank sees both kinds.
# STUB:
# STUB:
def distributed_env():  # Step 1: who am I? torchrun sets RANK, LOCAL_RANK, WORLD_SIZE; srun sets SLURM_*
    """(rank, local_rank, world_size) of this process, from torchrun's variables, else from srun's."""
    # torchrun's first: under `srun torchrun` a rank also inherits Slurm's, which describe the one task that
    # runs torchrun (SLURM_PROCID=0, SLURM_NTASKS=1 on one node), not this rank
    if "RANK" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    if "SLURM_PROCID" in os.environ:  # srun: one task per rank
        return int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_LOCALID"]), int(os.environ["SLURM_NTASKS"])
    sys.exit("no launcher: start this script with torchrun or srun (RANK or SLURM_PROCID is not set)")


### END SOLUTION
def train(args, model, device, train_loader, optimizer, epoch, autocast, scaler):
    model.train()
    total_loss, seen = 0.0, 0
    for batch_idx, (data, target) in enumerate(train_loader):
        # pinned batches (pin_memory=True on CUDA) copy while the GPU computes; on a CPU this is a plain .to()
        data, target = data.to(device, non_blocking=True), target.to(device, non_blocking=True)
        optimizer.zero_grad()
        with autocast():
            output = model(data)
            loss = F.nll_loss(output.float(), target)
        scaler.scale(loss).backward()   # fp16: a scaled loss keeps small gradients from underflowing
        scaler.step(optimizer)          # unscales first; skips the step when a gradient overflowed
        scaler.update()
        total_loss += loss.item() * len(data)
        seen += len(data)
        if batch_idx % args.log_interval == 0:
            print(f"Train Epoch: {epoch} [{seen}/{len(train_loader.sampler)}]\tLoss: {loss.item():.6f}", flush=True)
        if args.dry_run:
            break
    return total_loss / max(seen, 1), seen


def test(model, device, test_loader, autocast):
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device, non_blocking=True), target.to(device, non_blocking=True)
            with autocast():
                output = model(data).float()
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += (output.argmax(dim=1) == target).sum().item()
    n = len(test_loader.dataset)
    return test_loss / n, correct / n


def main(argv=None):
    args = parse_args(argv)
    use_cuda = torch.cuda.is_available()
    torch.manual_seed(args.seed)
    ### BEGIN SOLUTION
    # STUB: # TODO Step 1: join the process group of all ranks (NCCL between GPUs, Gloo between CPUs).
    # STUB: # With GPUs, tell CUDA which GPU is this rank's before you join.
    rank, local_rank, world_size = distributed_env()  # Step 1
    if use_cuda:  # Step 1: set this rank's GPU before init, so that NCCL uses it and no other
        torch.cuda.set_device(local_rank)
    # Step 1: rank 0 waits for the others at MASTER_ADDR:MASTER_PORT, from the launch: torchrun sets both, a Slurm
    # job script exports them (the first node of the job). No default here: 127.0.0.1 is right on one node only.
    dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world_size,  # Step 1
                            device_id=torch.device("cuda", local_rank) if use_cuda else None)  # Step 1: NCCL's GPU
    ### END SOLUTION

    ### BEGIN SOLUTION
    # STUB: # TODO Step 4: with several GPUs on a node, each rank uses its own one
    # STUB: device = torch.device("cuda" if use_cuda else "cpu")
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")  # Step 4: this rank's own GPU
    ### END SOLUTION

    try:
        train_set, test_set = load_dataset(args.dataset, args.data_dir)
    except DataError as e:
        sys.exit(f"data error: {e}")
    print(f"device={device} dataset={train_set.name} train={len(train_set)} test={len(test_set)}", flush=True)

    ### BEGIN SOLUTION
    # STUB: # TODO Step 3: each rank trains on its own share of the training set, in a new order every epoch
    # STUB: train_kwargs = {"batch_size": args.batch_size, "shuffle": True}
    train_sampler = DistributedSampler(train_set, seed=args.seed)  # Step 3: rank r gets every world_size-th image
    train_kwargs = {"batch_size": args.batch_size, "sampler": train_sampler}  # Step 3: the sampler shuffles
    ### END SOLUTION
    test_kwargs = {"batch_size": args.test_batch_size}
    loader_kwargs = {"num_workers": args.num_workers, "pin_memory": use_cuda,
                     "persistent_workers": args.num_workers > 0}
    train_loader = torch.utils.data.DataLoader(train_set, **train_kwargs, **loader_kwargs)
    test_loader = torch.utils.data.DataLoader(test_set, **test_kwargs, **loader_kwargs)

    model = Net().to(device)
    ### BEGIN SOLUTION
    # STUB: # TODO Step 2: make backward average the gradients over all ranks, so every copy stays the same
    model = DDP(model, device_ids=[local_rank] if use_cuda else None)  # Step 2: same start, averaged gradients
    ### END SOLUTION
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    step_model = torch.compile(model) if args.compile else model
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)

    def autocast():  # mixed precision only when asked for; a no-op context otherwise
        return torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None)

    # fp16 has 5 exponent bits and needs loss scaling; bf16 keeps float32's range and needs none (a no-op then)
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")

    for epoch in range(1, args.epochs + 1):
        ### BEGIN SOLUTION
        # STUB: # TODO Step 3: a new order each epoch (the same on every rank, so the shards stay disjoint)
        train_sampler.set_epoch(epoch)  # Step 3: reshuffle; without it every epoch repeats the same order
        ### END SOLUTION
        sync(device)
        ### BEGIN SOLUTION
        # STUB: # TODO Step 6: time the epoch across ranks: start the clock when every rank is here ...
        # Step 6: the barriers make epoch_s the time of the slowest rank, the same on every rank, as the
        # slides measure it. Production code leaves them out: a barrier makes the fast ranks wait for nothing,
        # and DDP's all-reduce in every backward already keeps the ranks in step.
        dist.barrier()
        ### END SOLUTION
        start = time.perf_counter()
        train_loss, seen = train(args, step_model, device, train_loader, optimizer, epoch, autocast, scaler)
        sync(device)
        ### BEGIN SOLUTION
        # STUB: # TODO Step 6: ... and stop it when the slowest rank is done
        dist.barrier()  # Step 6: stop the clock when the slowest rank is done
        ### END SOLUTION
        epoch_s = time.perf_counter() - start
        test_loss, test_acc = test(step_model, device, test_loader, autocast)
        scheduler.step()
        # Per rank: what this process trained on. Total: the whole training set went through in epoch_s.
        total = seen if args.dry_run else len(train_loader.dataset)
        print(format_epoch_line(epoch=epoch, train_loss=train_loss, test_loss=test_loss, test_acc=test_acc,
                                images_per_s=total / epoch_s, images_per_s_rank=seen / epoch_s,
                                epoch_s=epoch_s), flush=True)

    ### BEGIN SOLUTION
    # STUB: # TODO Step 5: one checkpoint, written once, that loads into a plain Net()
    # STUB: if args.save_model:
    # STUB:     torch.save(model.state_dict(), "mnist_cnn.pt")
    if args.save_model and rank == 0:  # Step 5: one writer; every rank holds the same weights
        torch.save(model.module.state_dict(), "mnist_cnn.pt")  # Step 5: the Net inside, no "module." prefix
    ### END SOLUTION
    ### BEGIN SOLUTION
    # STUB: # TODO Step 6: leave the process group cleanly
    # Step 6: leave cleanly. Drop the DDP model first: with Gloo, a DDP model still alive at exit after
    # destroy_process_group() makes the interpreter abort now and then ("terminate called without an
    # active exception").
    del model, step_model
    gc.collect()
    dist.destroy_process_group()
    ### END SOLUTION


if __name__ == "__main__":
    main()
