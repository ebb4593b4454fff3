"""Pictures for notebook 06: Megatron's f and g, and the dp x tp (x cp x pp) rank grid on nodes."""
KINDS = ("tp", "cp", "pp", "dp")


def draw_f_g(ax=None):
    """Column then row with f and g: where the one all-reduce forward and the one backward happen."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 3.2))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 3.4)
    ax.axis("off")

    def box(x, y, text, colour):
        ax.add_patch(FancyBboxPatch((x - 0.55, y - 0.3), 1.1, 0.6, boxstyle="round,pad=0.05", fc=colour, ec="k"))
        ax.text(x, y, text, ha="center", va="center", fontsize=10)

    def arrow(x0, y0, x1, y1):
        ax.annotate("", (x1, y1), (x0, y0), arrowprops=dict(arrowstyle="->", lw=1.2))

    for y, r in ((2.4, 0), (0.9, 1)):
        box(3.3, y, f"X A$_{r}$", "#cfe2ff")
        box(4.9, y, "GELU", "#e2e3e5")
        box(6.5, y, f"Y$_{r}$ B$_{r}$", "#ffe5d0")
        arrow(2.2, 1.65, 2.75, y)
        arrow(3.85, y, 4.35, y)
        arrow(5.45, y, 5.95, y)
        arrow(7.05, y, 7.6, 1.65)
        ax.text(9.7, y, f"rank {r}", ha="right", va="center", fontsize=9, color="gray")
    box(0.6, 1.65, "X", "white")
    arrow(1.15, 1.65, 1.6, 1.65)
    box(1.9, 1.65, "f", "#d1e7dd")
    box(7.9, 1.65, "g", "#f8d7da")
    arrow(8.45, 1.65, 8.9, 1.65)
    ax.text(9.2, 1.65, "Z", ha="center", va="center", fontsize=11)
    ax.text(1.9, 0.15, "f: forward identity\nbackward all-reduce", ha="center", fontsize=9)
    ax.text(7.9, 0.15, "g: forward all-reduce\nbackward identity", ha="center", fontsize=9)
    ax.text(4.9, 3.25, "column-parallel A (split by output)   ->   row-parallel B (split by input)",
            ha="center", fontsize=10)
    return ax


def draw_rank_grid(groups: dict, gpus_per_node: int = 4, kinds=None, title: str = ""):
    """One row per kind of group: ranks as squares inside node boxes, coloured by the group they belong to."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    world = sum(len(g) for g in groups["tp"])
    kinds = [k for k in (kinds or KINDS) if k in groups]
    nodes = -(-world // gpus_per_node)
    fig, axes = plt.subplots(len(kinds), 1, figsize=(max(6.0, 1.5 + 0.75 * world + 0.4 * nodes), 1.3 * len(kinds)),
                             squeeze=False)
    for ax, kind in zip(axes[:, 0], kinds):
        n_groups = len(groups[kind])
        cmap = plt.get_cmap("tab10" if n_groups <= 10 else "tab20")
        colour = {r: cmap(i % cmap.N) for i, g in enumerate(groups[kind]) for r in g}
        for n in range(nodes):   # a node: a box around its GPUs
            x0 = n * (gpus_per_node + 0.6)
            ax.add_patch(Rectangle((x0 - 0.15, -0.2), gpus_per_node, 1.2, fill=False, ec="k", lw=1.2))
            ax.text(x0 + (gpus_per_node - 1) / 2 - 0.05, 1.12, f"node {n}", ha="center", fontsize=8)
        for r in range(world):
            n, slot = divmod(r, gpus_per_node)
            x = n * (gpus_per_node + 0.6) + slot
            ax.add_patch(Rectangle((x, 0), 0.7, 0.8, fc=colour[r], ec="k"))
            ax.text(x + 0.35, 0.4, str(r), ha="center", va="center", fontsize=9)
        sizes = len(groups[kind][0])
        ax.set_title(f"{kind} groups (size {sizes}): {len(groups[kind])} of them", fontsize=9, loc="left")
        ax.set_xlim(-0.4, nodes * (gpus_per_node + 0.6))
        ax.set_ylim(-0.35, 1.4)
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def crossings(groups: dict, gpus_per_node: int) -> dict:
    """For each kind: how many of its groups span more than one node (their collectives cross the network)."""
    return {k: sum(len({r // gpus_per_node for r in g}) > 1 for g in gs) for k, gs in groups.items()}


def block_params(width: int, tp: int = 1) -> int:
    """Parameters of one transformer block per rank: attention (q, k, v, proj) and the MLP (fc1, fc2: 4 x width)
    split, except proj's and fc2's biases and the two LayerNorms."""
    attn = (3 * (width * width + width) + width * width) // tp + width
    ffn = 4 * width
    return attn + (width * ffn + ffn + ffn * width) // tp + width + 4 * width
