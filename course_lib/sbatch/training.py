"""The command line the probe replaces: which training script the ranks would run, with what arguments (the probe
"runs" whatever it is given, so it is judged here: the file exists in the job's working directory, is the
exercise's, and takes every --option, read from its argparse calls), and torchrun's own options for the other rules.
"""
import ast
import re
from pathlib import Path

from course_lib.sbatch.script import Script, Simple, simple_commands
from course_lib.sbatch.site_lines import written_for

TRAINING = "02_ddp/mnist_classify_ddp.py"      # what exercise 03 starts (notebook 02's DDP program)
ITEM = "training script"
PYTHONS = {"python", "python3"}
# torchrun's options that take no value (torch.distributed.run's parser); every other --option takes one
TORCHRUN_FLAGS = {"--standalone", "--no-python", "--no_python", "--run-path", "--run_path", "-m", "--module",
                  "--virtual-local-rank", "--virtual_local_rank"}
DEFAULT = re.compile(r"^\$\{(\w+):?-([^}]*)\}$")     # ${SCRIPT:-exercises/...}
PLAIN = re.compile(r"^\$\{?(\w+)\}?$")              # $SCRIPT, ${SCRIPT}
NUMBER = re.compile(r"-?\d+(\.\d+)?")
NOTHING = ("$@", "$*")      # the job's own arguments: none when submitted as the course does (sbatch FILE)
# argparse actions that take no value (an option with nargs "?" or "*" may have none either)
NO_VALUE = {"store_true", "store_false", "store_const", "append_const", "count", "help", "version"}


def words_run(c: Simple) -> list[str]:
    """The words of ``c`` with a ``bash -c 'CMD'`` (``sh -c``) opened up: srun bash -c 'python x.py' runs python."""
    words = c.words
    for i, w in enumerate(words[:-1]):
        if w.rsplit("/", 1)[-1] in ("bash", "sh") and words[i + 1] == "-c" and i + 2 < len(words):
            inner = [x for s in simple_commands(c.line, words[i + 2]) for x in s.words]
            return words[:i] + inner
    return words


def launches(s: Script):
    """(line, "python", "python3" or "torchrun", the words after it) for the first python or torchrun (``python -m
    torch.distributed.run`` is torchrun) that each command starts, in the script's order."""
    for c in s.simple:
        words = words_run(c)
        i = next((i for i, w in enumerate(words) if w.rsplit("/", 1)[-1] in PYTHONS | {"torchrun"}), None)
        if i is None:
            continue
        rest = words[i + 1:]
        if rest[:2] in (["-m", "torch.distributed.run"], ["-m", "torch.distributed.launch"]):
            yield c.line, "torchrun", rest[2:]
        else:
            yield c.line, words[i].rsplit("/", 1)[-1], rest


def torchrun_args(words: list[str]) -> tuple[dict, list[str]]:
    """torchrun's options as written (``--opt=value`` or ``--opt value``; a flag: ""), keyed with ``_`` for ``-``
    (``nnodes``, ``rdzv_endpoint``, ``nproc_per_node``), and the words from its training script on."""
    options, i = {}, 0
    while i < len(words) and words[i].startswith("-"):
        key, eq, value = words[i].partition("=")
        if not eq and key not in TORCHRUN_FLAGS:               # --opt value
            value = words[i + 1] if i + 1 < len(words) else ""
            i += 1
        options[key.lstrip("-").replace("-", "_")] = value
        i += 1
    return options, words[i:]


def torchrun_options(s: Script) -> dict:
    """The options of the script's first torchrun ({} where none runs)."""
    return next((torchrun_args(rest)[0] for _, name, rest in launches(s) if name == "torchrun"), {})


def command_line(s: Script) -> tuple[int, str, list[str]] | None:
    """(line, the script as written, the words after it) of the first launch that runs python or torchrun."""
    for line, name, rest in launches(s):
        if name == "torchrun":
            script = torchrun_args(rest)[1]
            return (line, script[0], script[1:]) if script else None
        j = next((k for k, w in enumerate(rest) if (not w.startswith("-") or w == "-")
                  and (k == 0 or rest[k - 1] not in ("-W", "-X"))), None)   # -W ignore: a value
        if j is None or "-c" in rest[:j] or "-m" in rest[:j]:
            return None if j is None else (line, "-m " + rest[j] if "-m" in rest[:j] else "-c", [])
        return line, rest[j], rest[j + 1:]
    return None


def resolve(s: Script, written: str, seen: frozenset = frozenset()) -> tuple[str | None, str]:
    """(the path the job would run, how the script gives it); None where it comes from outside the script.
    ``seen``: the names being resolved, which their own value refers to as set before the script
    (``SCRIPT=${SCRIPT:-snapshot.py}``: the default, unless the job's environment sets it)."""
    m = DEFAULT.match(written) or PLAIN.match(written)
    name = m.group(1) if m else None
    if name in s.values and name not in seen:
        return resolve(s, s.values[name][1].strip("\"'"), seen | {name})[0], f"${name}, set in the script"
    if m and m.re is DEFAULT:
        return m.group(2), f"{written}: ${name} unset, so {m.group(2)}"
    if m:
        return None, f"${name} is not set in the script"
    return (None, written) if "$" in written or "`" in written else (written, written)


def job_folder(s: Script, workdir: Path) -> Path:
    """The job's working directory: an absolute ``--chdir``, else ``workdir`` (the folder it is submitted from)."""
    chdir = s.get("chdir")
    return Path(chdir) if chdir and Path(chdir).is_absolute() else workdir


def argparse_options(path: Path) -> list[tuple[str, bool]] | None:
    """(option, whether it must be given a value) for each --option of ``path``'s argparse calls, in order (None: it
    cannot be read). A value is owed under argparse's default action, store; not with a flag action or nargs ?/*."""
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return None
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"):
            continue
        kw = {k.arg: k.value for k in node.keywords}
        action, nargs = kw.get("action"), kw.get("nargs")
        flag = (isinstance(action, ast.Constant) and action.value in NO_VALUE) or (action is not None and not
                isinstance(action, ast.Constant)) or (isinstance(nargs, ast.Constant) and nargs.value in ("?", "*", 0))
        out += [(a.value, not flag) for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")]
    return out


def missing_values(line: int, path, args: list[str], valued: set[str], known: list[str]) -> list[str]:
    """The options in ``args`` that take a value (``valued``) but are followed by nothing, the job's own arguments
    (none as the course submits it) or another option: argparse stops every rank."""
    msgs = []
    for i, word in enumerate(args):
        prefixes = [k for k in known if k.startswith(word)]
        key = word if word in known else prefixes[0] if len(prefixes) == 1 else None
        if not word.startswith("--") or key not in valued:
            continue
        after = args[i + 1] if i + 1 < len(args) else None
        if after is None or after in NOTHING or (after.startswith("-") and not NUMBER.fullmatch(after)):
            what = ("nothing" if after is None else f'"{after}", the job\'s own arguments (none when it is submitted '
                    "as sbatch FILE)" if after in NOTHING else f"the option {after}")
            msgs.append(f"line {line}: {path}'s option {word} takes a value, and the word after it is {what}: "
                        f"argparse stops every rank with '{key}: expected one argument'; give it one")
    return msgs


def unknown_options(args: list[str], known: list[str]) -> list[str]:
    """The --options in ``args`` that the parser does not define (argparse accepts an unambiguous prefix)."""
    keys = [a.split("=", 1)[0] for a in args if a.startswith("--") and "$" not in a]
    return [k for k in keys if k not in known and len([x for x in known if x.startswith(k)]) != 1]


def judge(s: Script, workdir: Path) -> tuple[str, bool | None, str]:
    """(ITEM, ok or None where the check cannot see it, message). The exercise's training file is asked for
    where the script is exercise 03's (it has the exercise's site block); any other job script (the course's
    jobs/*.sbatch) only has to run a file that exists, with options it takes."""
    found = command_line(s)
    if found is None:
        return ITEM, None, "no python or torchrun line with a script: nothing to look at (see launch)"
    line, written, args = found
    if written.startswith("-"):
        return ITEM, None, f"line {line}: python {written} runs code the check does not read (not looked at)"
    path, how = resolve(s, written)
    if path is None:
        return ITEM, None, (f"line {line}: the script is {how}, so the check cannot know which file the job runs "
                            "(not looked at)")
    where = job_folder(s, workdir)
    full = where / path
    if not full.is_file():
        return ITEM, False, (f"line {line}: {how}: no such file in the job's working directory {where} (the folder "
                             "you submit from, unless --chdir says otherwise): every rank would stop with python's "
                             f"\"can't open file\". The exercise's training file is exercises/{TRAINING}")
    if written_for(s.text) is not None and not full.as_posix().endswith(TRAINING):
        return ITEM, False, (f"line {line}: {how}: the job would run {path}, not the exercise's training file "
                             f"(exercises/{TRAINING}, notebook 02's DDP program)")
    options = argparse_options(full)
    known = None if options is None else [o for o, _ in options]
    bad = unknown_options(args, known or [])
    if known is not None and bad:
        return ITEM, False, (f"line {line}: {path} has no option {', '.join(bad)}: argparse stops every rank with "
                             f"'unrecognized arguments'. Its options: {' '.join(sorted(known))}")
    empty = missing_values(line, path, args, {o for o, valued in options or [] if valued}, known or [])
    if empty:
        return ITEM, False, "\n".join(empty)
    told = " ".join(args) or "no arguments"
    return ITEM, True, f"line {line}: {path} exists in {where}; arguments: {told}"


LOCAL_GPU = re.compile(r"cuda:\{\s*local\w*|[\"']cuda[\"'],\s*local\w*|set_device\(\s*local\w*", re.I)


def local_rank_gpu(s: Script, workdir: Path) -> list[str] | None:
    """The lines of the training script that pick the GPU by the local rank (``cuda:{local_rank}``,
    ``set_device(local_rank)``); None where the file cannot be read."""
    found = command_line(s)
    path = resolve(s, found[1])[0] if found and not found[1].startswith("-") else None
    if not path:
        return None
    try:
        lines = (job_folder(s, workdir) / path).read_text(errors="replace").splitlines()
    except OSError:
        return None
    return [f"{path}:{n}: {text.strip()}" for n, text in enumerate(lines, 1)
            if LOCAL_GPU.search(text.split("#", 1)[0])]


def gpu_bind_none(s: Script) -> bool:
    """``--gpu-bind=none`` (sbatch(1): turns off the per-task binding that --gpus-per-task implies), as a
    directive or on the srun line."""
    bind = [s.get("gpu-bind") or ""] + [w.partition("=")[2] for c in s.simple if c.name == "srun"
                                         for w in c.words if w.startswith("--gpu-bind=")]
    return any("none" in b.split(",") for b in bind)


def seen(ranks) -> tuple:
    """The training script as the ranks were given it: there in their working directory, and which file."""
    for r in ranks:
        if not r.get("found", True):
            return False, (f"rank {r['rank']} was given {r['script']}, which is not a file in its working directory "
                           f"{r['cwd']}: python would stop with \"can't open file\" on every rank")
    r = ranks[0]
    if "found" not in r:
        return None, "the ranks did not say which script they were given"
    return True, f"the ranks were given {r['script']} (in {r['cwd']}) with: {' '.join(r['args']) or 'no arguments'}"
