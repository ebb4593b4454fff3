"""Notebook 06 says what the course's code does (issue 53, item 14): every order its text recommends can be chosen
in its grid widget, the recommended one first and the default; the course's attention, with q, k and v each
behind its own f, all-reduces three times in backward, as 06 now says, measured on 2 real gloo ranks."""
import json
import re

import pytest
from conftest import ROOT

from course_lib.runtime.launch import launch

NOTEBOOK = ROOT / "notebooks" / "06_tensor_parallelism.ipynb"
COUNT = '''
import sys
import torch
import torch.distributed as dist
from course_lib.core.loader import import_path
from course_lib.core.rankkit import rank_env
env = rank_env()
dist.init_process_group("gloo", rank=env.rank, world_size=env.world_size)
torch.manual_seed(0)
tp = import_path(sys.argv[1], "tp_counted")
attn = tp.ParallelSelfAttention(8, 4).double()
x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
y = attn(x)
calls = []
real = dist.all_reduce
dist.all_reduce = lambda t, *a, **k: (calls.append(1), real(t, *a, **k))[1]
y.sum().backward()
print(f"backward_all_reduces={len(calls)}", flush=True)
dist.destroy_process_group()
'''


def cells(kind):
    return ["".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == kind]


def test_every_recommended_order_is_in_the_grid_widget_and_the_first_is_the_default():
    text = "\n".join(cells("markdown"))
    recommended = set(re.findall(r'follow Megatron: `order="([a-z-]+)"`', text))
    assert recommended == {"tp-cp-dp-pp"}, recommended
    widget = next(c for c in cells("code") if "figure_widget(grid" in c)
    orders = json.loads(re.search(r"orders = (\[.*?\])", widget).group(1))
    assert recommended <= set(orders), f"the widget cannot select {recommended - set(orders)}"
    assert orders[0] == "tp-cp-dp-pp" and "order=(orders, orders[0])" in widget
    assert 'def grid(tp=4, dp=2, cp=1, pp=1, order="tp-cp-dp-pp"' in widget


@pytest.mark.slow
def test_the_course_attention_all_reduces_three_times_in_backward(tmp_path):
    script = tmp_path / "count.py"
    script.write_text(COUNT)
    run = launch([str(script), str(ROOT / "solutions" / "06_tensor_parallel" / "tp.py")], nprocs=2, timeout=120,
                 on_line=None, warm=True)
    assert run.ok, run.summary()
    assert "backward_all_reduces=3" in run.output(0), run.output(0)
    assert "its backward all-reduces\n**three** times" in "\n".join(cells("markdown"))
