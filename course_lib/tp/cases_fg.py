"""Cases for Megatron's two operators: f (copy_to_parallel_region) and g (reduce_from_parallel_region).

Each case gets a ``Setting`` (cases.py): the learner's module, the group, tp, this rank's index, a seed.
"""
from __future__ import annotations

from course_lib.checking.case import Fail
from course_lib.tp.numerics import as_tensor, close, diff, rand


def case_f(c):
    fn = c.need("copy_to_parallel_region")
    x0 = rand(c.seed + 1, 4, 6)
    x = x0.clone().requires_grad_()
    y = as_tensor(fn(x, **c.kw), "copy_to_parallel_region")
    if not close(y.detach(), x0):
        if close(y.detach(), c.tp * x0):
            raise Fail("forward of copy_to_parallel_region must be the identity: it returned tp times the input "
                       "(it all-reduces in forward, which is g's job, not f's)")
        raise Fail(f"forward of copy_to_parallel_region must return its input unchanged; {diff(y.detach(), x0)}")
    if not y.requires_grad:
        raise Fail("the output of copy_to_parallel_region does not require grad: make it a torch.autograd.Function "
                   "(call it with .apply) and return the result of forward")
    grads = [rand(c.seed + 100 + i, 4, 6) for i in range(c.tp)]   # rank i's upstream gradient
    (y * grads[c.r]).sum().backward()
    want = sum(grads)
    got = x.grad
    if close(got, want):
        return
    if got is None:
        raise Fail("backward of copy_to_parallel_region: no gradient reached the input")
    if close(got, grads[c.r]):
        raise Fail("backward of copy_to_parallel_region must all-reduce: input grads are this rank's own part only "
                   "(in a column-parallel layer, 1/tp of serial on average); sum them over the group")
    if close(got, want / c.tp):
        raise Fail("backward of copy_to_parallel_region averages the gradients over the group; it must sum them "
                   "(all-reduce with ReduceOp.SUM, no division by tp)")
    raise Fail(f"backward of copy_to_parallel_region must return the sum of the ranks' gradients; {diff(got, want)}")


def case_g(c):
    fn = c.need("reduce_from_parallel_region")
    parts = [rand(c.seed + 10 + i, 4, 6) for i in range(c.tp)]   # rank i's partial result
    x = parts[c.r].clone().requires_grad_()
    y = as_tensor(fn(x.clone(), **c.kw), "reduce_from_parallel_region")
    want = sum(parts)
    if not close(y.detach(), want):
        if close(y.detach(), parts[c.r]):
            raise Fail("forward of reduce_from_parallel_region must all-reduce (sum over the group): it returned its "
                       "input unchanged (the identity is f's forward, not g's)")
        if close(y.detach(), want / c.tp):
            raise Fail("forward of reduce_from_parallel_region averages over the group; it must sum "
                       "(ReduceOp.SUM, no division by tp)")
        raise Fail("forward of reduce_from_parallel_region must return the sum over the group; "
                   f"{diff(y.detach(), want)}")
    if not y.requires_grad:
        raise Fail("the output of reduce_from_parallel_region does not require grad: make it a "
                   "torch.autograd.Function (call it with .apply)")
    grads = [rand(c.seed + 200 + i, 4, 6) for i in range(c.tp)]
    (y * grads[c.r]).sum().backward()
    got = x.grad
    if close(got, grads[c.r]):
        return
    if got is None:
        raise Fail("backward of reduce_from_parallel_region: no gradient reached the input")
    if close(got, sum(grads)):
        raise Fail("backward of reduce_from_parallel_region must be the identity: it all-reduces the gradient "
                   "(in a row-parallel layer that makes input and weight grads tp times serial)")
    if close(got, sum(grads) / c.tp):
        raise Fail("backward of reduce_from_parallel_region must be the identity: it averages the gradient over "
                   "the group, a communication the backward of a sum does not need")
    raise Fail("backward of reduce_from_parallel_region must pass the gradient through unchanged; "
               f"{diff(got, grads[c.r])}")
