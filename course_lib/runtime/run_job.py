"""In a run's Slurm job (course_lib.runs): ``python -m course_lib.runtime.run_job REQUEST`` runs the ranks with the
local launch on this node, writes each line to the job folder's rank lines file as it comes (the submitter reads
it as it grows) and the LaunchResult as JSON at the end. SIGTERM (scancel, the time limit) unwinds through the
launch, which stops every rank it started."""
import json
import signal
import sys

from course_lib.core.atomic import write_text
from course_lib.core.result import LINES_NAME, RESULT_NAME, line_record
from course_lib.runtime import runner
from course_lib.runtime.launch import default_printer, launch


def main(argv: list[str]) -> int:
    request, folder = runner.become_the_job(argv)
    signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))   # unwinds through launch()
    with open(folder / LINES_NAME, "a", encoding="utf-8", errors="replace", buffering=1) as lines:
        def on_line(rank: int, text: str) -> None:
            lines.write(line_record(rank, text))
            default_printer(rank, text)   # the job's own log reads as a local run's output
        result = launch(request["script_args"], request["nprocs"], request["style"], request["timeout"],
                        request["env"], None, on_line, request["grace"],
                        torchrun_args=request["torchrun_args"], warm=request["warm"])
    write_text(folder / RESULT_NAME, json.dumps(result.to_dict()))
    print(result.summary(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
