"""A launch waits for the warm fork server no longer than its own deadline (a GPU machine's driver, or a loaded
node, can make the server's start take minutes): past it the launch starts its ranks cold."""
import time

from course_lib.runtime import warm
from course_lib.runtime.launch import launch


def test_a_launch_waits_for_a_slow_server_no_longer_than_its_deadline(tmp_path):
    (tmp_path / "slowpre.py").write_text("import time\ntime.sleep(90)\n")    # a preload that takes 90 s
    script = tmp_path / "hi.py"
    script.write_text("print('hi', flush=True)\n")
    env = {"PYTHONPATH": str(tmp_path)}
    try:
        with warm.session(env, preload=("slowpre",)) as server:
            assert server is not None
            start = time.monotonic()
            res = launch([str(script)], 2, timeout=5, env=env, cwd=tmp_path, on_line=None)
            took = time.monotonic() - start
    finally:
        warm.close_idle()
    assert res.ok and [res.output(r).strip() for r in range(2)] == ["hi", "hi"], res.summary()
    assert took < 45, f"the launch waited {took:.0f} s for a server still importing (its deadline: 5 s)"
