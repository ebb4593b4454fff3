"""Where the data sets are, and an opt-in download: ``course show data``, ``course download DATASET``."""
import sys


def add_arguments(p):
    p.add_argument("action", choices=["info", "download"], nargs="?", default="info",
                   help="info: where the data sets are (course show data); download: fetch DATASET")
    p.add_argument("name", nargs="?", choices=["mnist", "fashion-mnist"], default="mnist", metavar="DATASET",
                   help="mnist or fashion-mnist (default: mnist)")
    p.add_argument("--data-dir", default=None, help="default: $COURSE_DATA_DIR or ~/.cache/multigpu-course/data")


def run(args) -> int:
    from course_lib import data  # torch is imported only when the command runs, not for `course --help`

    data_dir = args.data_dir or data.default_data_dir()
    if args.action == "download":
        try:
            folder = data.download_idx(args.name, data_dir)
        except (data.DataError, OSError) as e:   # no network, a corrupt download, a folder it cannot write
            print(f"course data: {e}", file=sys.stderr)
            return 2
        print(f"{args.name}: four files checked and in {folder}")
        return 0
    print(f"data dir: {data_dir}")
    for name in ("mnist", "fashion-mnist"):
        folder = data.idx_folder(name, data_dir)
        print(f"  {name:<14} {folder if folder else 'not found (course download ' + name + ')'}")
    print("  digits         bundled with scikit-learn (always there)")
    print(f"  --dataset auto uses: {data.resolve('auto', data_dir, quiet=True)[0]}")
    return 0
