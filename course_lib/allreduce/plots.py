"""Pictures of the all-reduce algorithms for notebook 05: who sends which chunk to whom, step by step, simulated on
sets of contributions with the reference solutions' index arithmetic (tests/test_allreduce_model.py checks them).
"""


def ring_states(world: int):
    """[(state, transfers, phase)] for steps 0 .. 2(W-1).

    state[r][c] is the frozenset of ranks whose input chunk c on rank r contains; transfers are the
    (src, dst, chunk) messages of the step that led to this state (none for step 0).
    """
    state = [[frozenset([r]) for _ in range(world)] for r in range(world)]
    out = [([row[:] for row in state], [], "start: every rank holds its own input, cut into W chunks")]
    for phase, shift in (("reduce-scatter", 0), ("all-gather", 1)):
        for step in range(world - 1):
            sends = [(r, (r + 1) % world, (r + shift - step) % world) for r in range(world)]
            new = [row[:] for row in state]
            for src, dst, c in sends:   # the reduce-scatter adds the chunk it receives, the all-gather copies it
                new[dst][c] = state[src][c] | (state[dst][c] if phase == "reduce-scatter" else frozenset())
            state = new
            out.append(([row[:] for row in state], sends, f"{phase} step {step + 1} of {world - 1}"))
    return out


def tree_rounds(world: int):
    """Rounds of (src, dst) messages of the binomial-tree reduce, then of the broadcast."""
    reduce_rounds, mask = [], 1
    while mask < world:
        reduce_rounds.append([(r, r - mask) for r in range(world) if r & mask and not r & (mask - 1)])
        mask <<= 1
    bcast = [[(dst, src) for src, dst in rnd] for rnd in reversed(reduce_rounds)]
    return reduce_rounds, bcast


def naive_rounds(world: int):
    """Messages of the naive algorithm, one at a time: W-1 into rank 0, then W-1 out of it."""
    return [[(r, 0)] for r in range(1, world)], [[(0, r)] for r in range(1, world)]


def _label(s: frozenset, world: int) -> str:
    return "Σ" if len(s) == world else "+".join(map(str, sorted(s)))


def draw_ring_step(world: int = 4, step: int = 0, ax=None):
    """The W x W grid (rank x chunk) after ``step`` steps; the chunks that just arrived are outlined."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    states = ring_states(world)
    step = max(0, min(step, len(states) - 1))
    state, sends, phase = states[step]
    if ax is None:
        _, ax = plt.subplots(figsize=(1.2 * world + 2, 0.8 * world + 1.2))
    cmap = plt.get_cmap("Blues")
    for r in range(world):
        for c in range(world):
            s = state[r][c]
            ax.add_patch(Rectangle((c, r), 1, 1, facecolor=cmap(0.15 + 0.75 * len(s) / world), edgecolor="white"))
            ax.text(c + 0.5, r + 0.5, _label(s, world), ha="center", va="center", fontsize=9,
                    color="white" if len(s) > world / 2 else "black")
    for _src, dst, c in sends:
        ax.add_patch(Rectangle((c + 0.04, dst + 0.04), 0.92, 0.92, fill=False, edgecolor="#cf222e", linewidth=2.2))
    ax.set(xlim=(0, world), ylim=(world, 0), xticks=[c + 0.5 for c in range(world)],
           yticks=[r + 0.5 for r in range(world)], xticklabels=[f"chunk {c}" for c in range(world)],
           yticklabels=[f"rank {r}" for r in range(world)])
    ax.set_aspect("equal")
    moves = ", ".join(f"{s}→{d}: chunk {c}" for s, d, c in sends)
    ax.set_title(f"ring, W={world}, step {step} of {len(states) - 1}: {phase}" + (f"\n{moves}" if moves else ""),
                 fontsize=9)
    return ax


def ring_widget(world: int = 4):
    """A slider over the ring's steps; the W slider redraws for another world size."""
    from course_lib.nb import figure_widget
    figure_widget(lambda world, step: draw_ring_step(world, step),
                  world=(range(2, 9), world), step=(range(0, 2 * (8 - 1) + 1), 0))


def draw_rounds(world: int, which: str = "tree", ax=None):
    """Messages per round for 'tree' or 'naive': ranks across, rounds down, an arrow per message."""
    import matplotlib.pyplot as plt
    reduce_rounds, bcast = tree_rounds(world) if which == "tree" else naive_rounds(world)
    rounds = [("reduce", r) for r in reduce_rounds] + [("broadcast", r) for r in bcast]
    if ax is None:
        _, ax = plt.subplots(figsize=(max(4, 0.9 * world + 2), 0.55 * len(rounds) + 1.2))
    for i, (phase, rnd) in enumerate(rounds):
        for src, dst in rnd:
            ax.annotate("", xy=(dst, i + 0.8), xytext=(src, i),
                        arrowprops=dict(arrowstyle="->", color="C0" if phase == "reduce" else "C1", lw=1.6))
        ax.text(world - 0.3, i + 0.4, f"{phase} round {i + 1}", fontsize=8, va="center")
    ax.scatter([r for r in range(world) for _ in range(len(rounds) + 1)],
               [i for _ in range(world) for i in range(len(rounds) + 1)], s=12, color="grey")
    ax.set(xlim=(-0.5, world + 1.8), ylim=(len(rounds) + 0.3, -0.3), xticks=range(world),
           xticklabels=[f"rank {r}" for r in range(world)], yticks=[], ylabel="time →")
    ax.set_title(f"{which}, W={world}: {len(rounds)} rounds (blue: reduce to rank 0, orange: send back)", fontsize=9)
    return ax
