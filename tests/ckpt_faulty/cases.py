"""Faulty snapshot code that `course check ckpt` must catch, at the right piece and with the right reason
(tests/faulty.py says how a case is declared; tests/test_ckpt_checker.py runs them).

Each is the solution with a mistake learners make typed in. The torchrun experiment ("resume") is slow, so most
cases leave it out; the cases that keep it show what the loss curve does and does not reveal.
"""
from faulty import Faulty

QUICK = {"resume": False}
PASS = ("pass", "")
GATHER = "    dist.all_gather_object(states, rng_states())"          # the rest of its line is a comment
RANK0_ONLY = "    if dist.get_rank() != 0:\n        return"
ATOMIC = ('    tmp = f"{path}.tmp"\n'
          '    with open(tmp, "wb") as f:\n'
          '        torch.save(snapshot, f)\n'
          '        f.flush()\n'
          '        os.fsync(f.fileno())')
REPLACE = "    os.replace(tmp, path)"
RETURN = '    return snapshot["epoch"], snapshot["step"]'
RESTORE_RNG = '    set_rng_states(states[dist.get_rank()])'

CASES = [
    Faulty("forgets_optimizer", why="the optimizer's state is neither saved nor loaded",
           edits=[('                "optimizer": optimizer.state_dict(), "scheduler"', '                "scheduler"'),
                  ('    optimizer.load_state_dict(snapshot["optimizer"])\n', "")],
           options=QUICK,
           expect={"optimizer": ("fail", "state is empty after load_snapshot"), "model": PASS, "scheduler": PASS,
                   "position": PASS, "RNG states": PASS, "rank 0 writes": PASS, "atomic write": PASS}),
    Faulty("forgets_scheduler", why="the scheduler's state is not restored; with StepLR the curve does not show it",
           edits=[('    scheduler.load_state_dict(snapshot["scheduler"])\n', "")],
           options=QUICK,      # with "resume": it passes (all 24 steps equal), as notebook 08 shows
           expect={"scheduler": ("fail", "last_epoch is 0 after load_snapshot, 1 when saved"), "optimizer": PASS}),
    Faulty("forgets_position_in_epoch", why="resumes at the start of the saved epoch (the sampler position is lost)",
           edits=[(RETURN, '    return snapshot["epoch"], 0')],
           options=QUICK,
           expect={"position": ("fail", "position within the epoch is lost"), "model": PASS}),
    Faulty("resumes_at_the_wrong_epoch", why="returns the next epoch, as if the saved one were complete",
           edits=[(RETURN, '    return snapshot["epoch"] + 1, snapshot["step"]')],
           options=QUICK,
           expect={"position": ("fail", r"returned \(epoch=3, step=5\): the wrong epoch")}),
    Faulty("every_rank_writes", why="no rank check: every rank writes the snapshot",
           edits=[(RANK0_ONLY, "    if False:\n        return"),
                  ('    tmp = f"{path}.tmp"', '    tmp = f"{path}.{dist.get_rank()}.tmp"')],
           options=QUICK,
           expect={"rank 0 writes": ("fail", "rank 1 wrote too")}),
    Faulty("non_atomic_write", why="torch.save straight onto the snapshot",
           edits=[(ATOMIC, "    torch.save(snapshot, path)"), (REPLACE, "    pass")],
           options=QUICK,
           expect={"atomic write": ("fail", "now half a file"), "rank 0 writes": PASS, "model": PASS}),
    Faulty("no_rng_state", why="no random generator states in the snapshot; the dropout masks change on resume",
           edits=[(GATHER, "    pass"),
                  ('"epoch": epoch, "step": step, "rng": states}', '"epoch": epoch, "step": step}'),
                  ('    states = snapshot["rng"]\n', '    states = [None] * dist.get_world_size()\n'),
                  (RESTORE_RNG, "    pass")],
           expect={"RNG states": ("fail", "not restored: torch's"), "model": PASS, "optimizer": PASS,
                   "resume": ("fail", "from step 12 on the loss differs")}),
    Faulty("rank0_rng_for_all", why="rank 0 saves its own generators only, and every rank restores them",
           edits=[(GATHER, "    states = rng_states()"),
                  ('    states = snapshot["rng"]\n', '    states = [snapshot["rng"]] * dist.get_world_size()\n')],
           options=QUICK,
           expect={"RNG states": ("fail", "rank 1's generators got rank 0's state"), "model": PASS}),
    Faulty("only_rank0_loads", why="rank 0 reads the snapshot, the other ranks keep their fresh state",
           edits=[('    snapshot = torch.load(path, map_location="cpu", weights_only=True)\n',
                   '    if dist.get_rank() != 0:\n        return 1, 0\n'
                   '    snapshot = torch.load(path, map_location="cpu", weights_only=True)\n')],
           options=QUICK,
           expect={"model": ("fail", "^rank 1: .*tensors differ"), "position": ("fail", "^rank 1: ")}),
    Faulty("gather_on_rank0_only", why="only rank 0 takes part in the collective: a hang",
           edits=[(GATHER, "    if dist.get_rank() == 0:\n        dist.all_gather_object(states, rng_states())")],
           options={"resume": False},    # the default deadline: "a deadlock" comes from the ranks, long before it
           expect={"model": ("fail", r"save_snapshot did not return on rank 0 at snapshot.py:{line:"
                                     r"dist.all_gather_object(states, rng_states())}.*: a deadlock, seen after \d+ s "
                                     r"\(rank 1 had returned from save_snapshot and waited for rank 0; no rank could "
                                     r"go on\)"),
                   "atomic write": ("fail", "not tested")}),
    Faulty("syntax_error", why="a missing colon",
           edits=[("def load_snapshot(path, model, optimizer, scheduler):",
                   "def load_snapshot(path, model, optimizer, scheduler)")],
           options=QUICK,
           expect={"snapshot.py": ("fail", r"does not load at snapshot.py:\d+")}),
]

# What the curve and the restored values cannot show: the file as another run reads it, and the write judged for a
# cluster's file system (a shared one for the snapshot, the node's own disk for /tmp).
SYNC = "        f.flush()\n        os.fsync(f.fileno())"
CASES += [
    Faulty("ddp_keys", why="the DDP-wrapped model's state_dict (module.conv1.weight, ...), loaded back into DDP",
           edits=[('{"model": model.module.state_dict(),', '{"model": model.state_dict(),'),
                  ('model.module.load_state_dict(snapshot["model"])', 'model.load_state_dict(snapshot["model"])')],
           options=QUICK,
           expect={"model": ("fail", r"^rank 0: the snapshot's model has DDP's names \(module\.conv1\.weight.*"
                                     r"model\.module\.state_dict\(\)"),
                   "optimizer": PASS, "atomic write": PASS}),
    Faulty("weights_only_false", why="load_snapshot reads the file with weights_only=False",
           edits=[('    snapshot = torch.load(path, map_location="cpu", weights_only=True)',
                   '    snapshot = torch.load(path, map_location="cpu", weights_only=False)')],
           options=QUICK,
           expect={"model": ("fail", r"torch\.load\(\.\.\., weights_only=False\): unpickling runs any code"),
                   "optimizer": PASS}),
    Faulty("numpy_array_in_snapshot", why="NumPy's key array saved as an array: weights_only=True refuses it",
           edits=[('torch.from_numpy(keys.astype(np.int64))', 'keys'),
                  ('keys.numpy().astype(np.uint32)', 'keys')],
           options=QUICK,
           expect={"model": ("fail", r"load_snapshot raised on rank \d at snapshot\.py:\d+[^\x1b]*UnpicklingError: "
                                     r"[^\x1b]*Unsupported global: GLOBAL numpy[^\x1b]*as an int64 tensor"),
                   "optimizer": ("fail", r"^not tested: the error above \(under model\)"),
                   "atomic write": ("fail", "^not tested")}),
    Faulty("tmp_in_tmp_then_move", why="the temporary file in /tmp, moved over the snapshot with shutil.move",
           edits=[('    tmp = f"{path}.tmp"', '    tmp = f"/tmp/snapshot-{os.getpid()}.tmp"'),
                  (REPLACE, "    import shutil\n    shutil.move(tmp, path)")],
           options=QUICK,
           expect={"atomic write": ("fail", r"survived on this disk, but not on a cluster's: the temporary file was "
                                            r"/tmp/snapshot-\d+\.tmp, in another folder than snapshot\.pt.*EXDEV"),
                   "rank 0 writes": PASS, "model": PASS}),
    Faulty("no_fsync", why="the temporary file is renamed without fsync",
           edits=[(SYNC, "        pass")],
           options=QUICK,
           expect={"atomic write": ("fail", r"renamed without os\.fsync\(\) first"), "model": PASS}),
    Faulty("copied_into_place", why="a temporary file next to the snapshot, then copied over it",
           edits=[(REPLACE, "    import shutil\n    shutil.copyfile(tmp, path)")],
           options=QUICK,
           expect={"atomic write": ("fail", r"snapshot\.pt was written in place, not renamed into place"),
                   "rank 0 writes": PASS}),
]

# What a single good save cannot show: a writer chosen per node, a moment of the save without a whole snapshot, and a
# save that changes the state it has just taken (the loop draws nothing from Python's random: the curve cannot show it).
CASES += [
    Faulty("local_rank_writes", why="the writer is chosen by its local rank: one writer per node, on a shared disk",
           edits=[(RANK0_ONLY, '    if int(os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0"))) != 0:'
                               '\n        return')],
           options=QUICK,     # the two writers race for snapshot.pt.tmp: model may fail too, or not
           expect={"rank 0 writes": ("fail", r"^rank 1 wrote too .*as 2 nodes of one rank each.*dist\.get_rank\(\)")}),
    Faulty("remove_then_rename", why="the old snapshot deleted before the new one is renamed into place",
           edits=[(REPLACE, "    if os.path.exists(path):\n        os.remove(path)\n    os.rename(tmp, path)")],
           options=QUICK,
           expect={"atomic write": ("fail", r"after os\.remove\(snapshot\.pt\) there was no snapshot\.pt until "
                                            r"os\.rename\(snapshot\.pt\.tmp, snapshot\.pt\); a crash or a kill"),
                   "rank 0 writes": PASS, "model": PASS}),
    Faulty("draws_after_taking_rng", why="a random name for the temporary file, drawn after the generators were taken",
           edits=[('    tmp = f"{path}.tmp"', '    tmp = f"{path}.{random.randrange(10**9)}.tmp"')],
           options=QUICK,
           expect={"RNG states": ("fail", r"^rank 0: save_snapshot drew from Python's random on rank 0 after taking"),
                   "model": PASS, "atomic write": PASS}),
]

# What only a restart after the crash, a second environment or the order of the calls shows (course check ckpt measures
# each: what load_snapshot read after the crash, which ranks wrote, when the fsync came, where the temporary file was).
LOAD = '    snapshot = torch.load(path, map_location="cpu", weights_only=True)\n'
CASES += [
    Faulty("loads_the_newest_file", why="load_snapshot loads whichever of path.tmp and path is newer",
           edits=[(LOAD, '    found = [p for p in (f"{path}.tmp", path) if os.path.exists(p)]\n'
                         '    snapshot = torch.load(max(found, key=os.path.getmtime), map_location="cpu", '
                         'weights_only=True)\n')],
           options=QUICK,
           expect={"atomic write": ("fail", r"the restart's load_snapshot read snapshot\.pt\.tmp, which the crash "
                                            r"left half written"), "model": PASS}),
    Faulty("fsync_before_write", why="os.fsync before torch.save writes anything, and not after",
           edits=[(ATOMIC, '    tmp = f"{path}.tmp"\n    with open(tmp, "wb") as f:\n        os.fsync(f.fileno())\n'
                           '        torch.save(snapshot, f)')],
           options=QUICK,
           expect={"atomic write": ("fail", r"fsynced before its last write \(0 bytes when os\.fsync\(\) ran"),
                   "model": PASS}),
    Faulty("tmp_in_current_folder", why="the temporary file made in the current folder, not the snapshot's",
           edits=[('    tmp = f"{path}.tmp"', '    tmp = f"{os.path.basename(path)}.tmp"')],
           options=QUICK,
           expect={"atomic write": ("fail", r"in another folder than snapshot\.pt: the folder the run started in"),
                   "rank 0 writes": PASS}),
    Faulty("slurm_procid_writer", why="the writer picked by SLURM_PROCID, 0 on every rank of torchrun in sbatch",
           edits=[(RANK0_ONLY, '    if int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0"))) != 0:\n'
                               '        return')],
           options=QUICK,
           expect={"rank 0 writes": ("fail", r"^rank 1 wrote too .*torchrun inside an sbatch script.*SLURM_PROCID"),
                   "atomic write": ("fail", "^not tested")}),
    Faulty("local_rank_rng", why="each rank restores states[SLURM_LOCALID], 0 on every node",
           edits=[(RESTORE_RNG, '    set_rng_states(states[int(os.environ.get("SLURM_LOCALID", "0"))])')],
           options=QUICK,
           expect={"RNG states": ("fail", r"^rank 1: .*picked by the local rank.*states\[dist\.get_rank\(\)\]"),
                   "model": PASS}),
    Faulty("rng_in_a_side_pickle", why="the RNG states pickled into path.rng in place, read back with pickle.load",
           edits=[('"epoch": epoch, "step": step, "rng": states}',
                   '"epoch": epoch, "step": step}\n    import pickle\n    with open(f"{path}.rng", "wb") as g:\n'
                   '        pickle.dump(states, g)'),
                  ('    states = snapshot["rng"]\n',
                   '    import pickle\n    with open(f"{path}.rng", "rb") as g:\n        states = pickle.load(g)\n')],
           options=QUICK,
           expect={"model": ("fail", r"reads snapshot\.pt\.rng with pickle\.load"),
                   "atomic write": ("fail", r"also wrote snapshot\.pt\.rng in place")}),
    Faulty("bytes_written_in_place", why="serialised in memory, then the bytes written straight onto the snapshot",
           edits=[(ATOMIC, '    import io\n    buf = io.BytesIO()\n    torch.save(snapshot, buf)\n'
                           '    with open(path, "wb") as f:\n        f.write(buf.getvalue())'), (REPLACE, "    pass")],
           options=QUICK,
           expect={"atomic write": ("fail", r"now half a file.*snapshot\.pt was written in place")}),
    Faulty("first_save_in_place", why="the first snapshot written in place (no old one to protect), later ones atomic",
           edits=[(ATOMIC, '    if not os.path.exists(path):\n        torch.save(snapshot, path)\n        return\n'
                           + ATOMIC)],
           options=QUICK,
           expect={"atomic write": ("fail", r"survived, but the first save_snapshot was not atomic: snapshot\.pt was "
                                            r"written in place")}),
    Faulty("deletes_after_loading", why="rank 0 deletes the snapshot once every rank has read it",
           edits=[(RETURN, '    dist.barrier()\n    if dist.get_rank() == 0:\n        os.remove(path)\n' + RETURN)],
           options=QUICK,
           expect={"model": ("fail", r"no snapshot\.pt: load_snapshot deleted it"), "atomic write": PASS}),
    Faulty("numpy_state_without_gauss", why="np.random.set_state with three fields: the cached normal is lost",
           edits=[("np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))",
                   "np.random.set_state((name, keys.numpy().astype(np.uint32), pos))")],
           options=QUICK,
           expect={"RNG states": ("fail", r"not restored: NumPy's cached normal draw.*set_state needs all five"),
                   "model": PASS}),
]

# Right in another style: a random name drawn before the generators are taken (the state saved is the state the run
# goes on from), tempfile.mkstemp in the snapshot's folder, pathlib's replace, a barrier that ends every rank's save.
RIGHT = [("    states = [None] * dist.get_world_size()\n",
          "    nonce = random.randrange(10**9)\n    states = [None] * dist.get_world_size()\n"),
         (RANK0_ONLY, "    if dist.get_rank() != 0:\n        dist.barrier()\n        return"),
         ('    tmp = f"{path}.tmp"\n    with open(tmp, "wb") as f:',
          '    import pathlib\n    import tempfile\n'
          '    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=f".{nonce}")\n'
          '    with os.fdopen(fd, "wb") as f:'),
         (REPLACE, "    pathlib.Path(tmp).replace(path)\n    dist.barrier()")]

# Right, serialised in memory first: the bytes written to a temporary file in one go, flushed, fsynced and renamed.
RIGHT_BYTES = [(ATOMIC, '    import io\n    buf = io.BytesIO()\n    torch.save(snapshot, buf)\n'
                        '    tmp = f"{path}.tmp"\n    with open(tmp, "wb") as f:\n        f.write(buf.getvalue())\n'
                        '        f.flush()\n        os.fsync(f.fileno())')]
