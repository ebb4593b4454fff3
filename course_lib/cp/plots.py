"""Pictures for notebook 11: which tokens each rank holds (plain and balanced) under the causal mask, activation
memory per rank against sequence length, and the causal work per rank."""
from course_lib.cp import reference
from course_lib.cp.lab import causal_pairs

COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759")


def draw_split(seq_len: int = 16, cp: int = 4):
    """The causal score matrix (queries down, keys across), each query's row coloured by the rank that owns it:
    with the plain split the last rank's rows are the long ones; the balanced split evens them out."""
    import matplotlib.pyplot as plt
    import numpy as np
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2))
    for ax, balanced in zip(axes, (False, True)):
        img = np.ones((seq_len, seq_len, 3))
        for r in range(cp):
            rgb = [int(COLOURS[r][i:i + 2], 16) / 255 for i in (1, 3, 5)]
            for p in reference.positions(seq_len, cp, r, balanced).tolist():
                img[p, :p + 1] = rgb
        ax.imshow(img, interpolation="nearest")
        work = causal_pairs(seq_len, cp, balanced)
        ax.set_title(f"{'balanced' if balanced else 'plain'} split, cp={cp}\n(query, key) pairs per rank: {work}",
                     fontsize=10)
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[r]) for r in range(cp)]
    fig.legend(handles, [f"rank {r}" for r in range(cp)], loc="lower center", ncol=cp, fontsize=9)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def draw_memory(rows):
    """Saved bytes of rank 0 against sequence length, one line per cp, the formula dashed."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for i, cp in enumerate(sorted({r["cp"] for r in rows})):
        mine = sorted((r for r in rows if r["cp"] == cp and r["rank"] == 0), key=lambda r: r["seq_len"])
        s = [r["seq_len"] for r in mine]
        ax.plot(s, [r["saved"] / 1024 for r in mine], "o", color=COLOURS[i], label=f"cp={cp} measured")
        ax.plot(s, [sum(r["formula_memory"].values()) / 1024 for r in mine], "--", color=COLOURS[i],
                label=f"cp={cp} formula")
    ax.set_xlabel("sequence length S")
    ax.set_ylabel("KiB saved for backward, per rank")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def draw_work(seq_len: int, cp: int):
    """Causal (query, key) pairs per rank, plain and balanced."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3))
    width = 0.4
    for k, balanced in enumerate((False, True)):
        work = causal_pairs(seq_len, cp, balanced)
        ax.bar([r + (k - 0.5) * width for r in range(cp)], work, width,
               label="balanced" if balanced else "plain", color=COLOURS[k])
    ax.set_xticks(range(cp), [f"rank {r}" for r in range(cp)])
    ax.set_ylabel("(query, key) pairs")
    ax.set_title(f"causal work per rank, S={seq_len}, cp={cp}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
