"""What the order of backward's gradients shows (course check ownddp): a model whose parameters forward uses in
another order than they were registered, and the rule that no all-reduce started during backward holds a gradient
backward has not produced yet, measured from the Recorder's log (course_lib.owndp.record)."""
FINISH = ("finish",)     # logged before finish_gradient_synchronization: what comes after is not during backward


def reordered_model(seed):
    """5 -> 8 -> 3, like the plain model, with the head registered first and used last: backward produces its
    gradients first, so the bucket that ends with the last registered parameter fills up last."""
    import torch

    class HeadFirst(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(8, 3)     # registered first, used last
            self.body = torch.nn.Linear(5, 8)

        def forward(self, x):
            return self.head(torch.tanh(self.body(x)))

    torch.manual_seed(seed)
    return HeadFirst().double()


def early_launch_problem(log, label, unused=0):
    """None when every all-reduce launched during backward held only gradients backward had produced: the elements
    sent so far never exceed those of gradient produced so far (each gradient is in one bucket), plus ``unused``:
    the elements of parameters that get no gradient (a bucket may go out with those as zeros, as torch's DDP does
    with find_unused_parameters). Else why."""
    produced, sent = unused, 0
    for event in log:
        if event == FINISH:
            return None
        if event[0] == "grad":
            produced += event[1]
        elif event[0] == "all_reduce":
            sent += event[1]
            if sent > produced:
                return (f"{label}: an all-reduce of {event[1]} elements started during backward when backward had "
                        f"produced {produced - unused} elements of gradient and all-reduces had been given {sent}: a "
                        "bucket went out before all its gradients were ready (its values are not the ones backward "
                        "computes). The parameter a bucket ends with is not always the last to get its gradient: the "
                        "reordered model registers its head first and uses it last. Count the gradients that "
                        "arrived in each bucket and launch it when the count reaches the bucket's length")
    return None
