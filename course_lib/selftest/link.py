"""The physical limit a bus bandwidth is compared with: GPU 0's NVLink, else its PCIe link, per direction.

nccl-tests defines busbw so that it can be held against the hardware's peak: for all-reduce, busbw = algbw x
2(W-1)/W, the bytes each GPU sends over its links per second. The limit here is what GPU 0 can send in one
direction: the sum of its active NVLink links (``nvidia-smi nvlink -s``: 18 x 26.562 GB/s on an H100 SXM), else
its PCIe link at the generation and width the system allows (``pcie.link.gen.max``, ``pcie.link.width.max``;
per lane after encoding: gen3 0.985, gen4 1.969, gen5 3.938 GB/s). Reaching 70-85 % of it with large messages is
usual; far below says the GPUs talk over a slower path (through the CPU, or the network).
"""
from __future__ import annotations

import re
import shutil
import subprocess

PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
LINK = re.compile(r"^\s*Link \d+: ([\d.]+) GB/s", re.M)


def nvlink_gbps(text: str) -> float:
    """GPU 0's active NVLink bandwidth per direction from ``nvidia-smi nvlink -s`` (0 without active links)."""
    gpu0 = re.split(r"^GPU 1:", text, flags=re.M)[0]
    return round(sum(float(x) for x in LINK.findall(gpu0)), 1)


def pcie_gbps(csv_line: str) -> float:
    """The PCIe limit per direction from ``GEN, WIDTH`` (``--query-gpu=pcie.link.gen.max,pcie.link.width.max``)."""
    try:
        gen, width = (int(x) for x in csv_line.strip().splitlines()[0].split(","))
    except (ValueError, IndexError):
        return 0.0
    return round(PCIE_LANE_GBPS.get(gen, 0.0) * width, 1)


def _smi(*args: str, timeout: float = 20) -> str:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return ""
    try:
        return subprocess.run([smi, *args], capture_output=True, text=True, timeout=timeout).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def limit() -> tuple[float, str]:
    """(GB/s per direction, what it is) for GPU 0; (0, why) when nvidia-smi cannot tell."""
    nv = nvlink_gbps(_smi("nvlink", "-s", "-i", "0"))
    if nv:
        return nv, f"NVLink, {nv:.0f} GB/s per direction (GPU 0's active links)"
    line = _smi("--query-gpu=pcie.link.gen.max,pcie.link.width.max", "--format=csv,noheader", "-i", "0")
    pcie = pcie_gbps(line)
    if pcie:
        gen, width = line.strip().split(",")
        return pcie, f"PCIe gen{gen.strip()} x{width.strip()}, {pcie:.0f} GB/s per direction"
    return 0.0, "the link's limit is unknown (nvidia-smi told neither NVLink nor PCIe)"
